//! REQ-3: one instance, PostgreSQL as its database.
//!
//! ```sh
//! psql "$URL" -c "CREATE EXTENSION alkblobs"                      # once, as a superuser
//! psql "$URL" -c "SELECT alkblobs_create_pool('app', single_instance => true)"
//! cargo run -p alkblobs --features postgres --example single_postgres -- "$URL" app
//! ```
//!
//! Small blobs are rows, big ones large objects in the same database (the
//! pool's `large_tier`); the store's own arbiter pins in memory and keeps
//! its staged rows and roots in the database, so a restart loses nothing.

use alkblobs::store::postgres::PostgresOptions;
use alkblobs::{Store, SweepOptions};

#[tokio::main]
async fn main() -> alkblobs::Result<()> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "postgresql://postgres@127.0.0.1:54329/alkblobs_test".into());
    let pool = args.next().unwrap_or_else(|| "app".into());
    let store = Store::open_postgres(PostgresOptions::new(url, pool)).await?;

    let small = store.put(b"a small blob, stored as a row".to_vec()).await?;
    let big = store.put(vec![42u8; 1 << 20]).await?; // over the threshold: a large object
    println!("small {} ({:?})", small.key, small.tier);
    println!("big   {} ({:?})", big.key, big.tier);

    // Keep the small one as a root (a persistent liveness source); let the
    // big one go.
    store.add_roots(&[small.key]).await?;
    drop((small.pin, big.pin));
    let report = store.sweep(SweepOptions::new()).await?;
    println!(
        "sweep: examined {}, staged {} (deleted once the pool's window has passed)",
        report.examined, report.staged
    );
    store.close().await
}
