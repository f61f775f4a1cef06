//! REQ-3 with files: one instance, PostgreSQL for small blobs and the GC's
//! state, large blobs as files under a local directory.
//!
//! ```sh
//! psql "$URL" -c "SELECT alkblobs_create_pool('app-files', large_tier => 'local', single_instance => true)"
//! cargo run -p alkblobs --features postgres --example single_postgres_local -- "$URL" app-files /var/lib/app/large
//! ```

use alkblobs::Store;
use alkblobs::store::postgres::{PgLarge, PostgresOptions};

#[tokio::main]
async fn main() -> alkblobs::Result<()> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "postgresql://postgres@127.0.0.1:54329/alkblobs_test".into());
    let pool = args.next().unwrap_or_else(|| "app-files".into());
    let dir = args
        .next()
        .unwrap_or_else(|| "/tmp/alkblobs-example-large".into());
    let store =
        Store::open_postgres(PostgresOptions::new(url, pool).large(PgLarge::Local(dir.into())))
            .await?;
    let big = store.put(vec![7u8; 4 << 20]).await?; // a file under the directory
    println!("{} ({:?}, {} bytes)", big.key, big.tier, big.size);
    store.close().await
}
