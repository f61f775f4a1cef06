//! REQ-2: many instances on many nodes share one pool (fleet mode).
//!
//! ```sh
//! psql "$URL" -c "CREATE EXTENSION alkblobs"                       # once, as a superuser
//! psql "$URL" -c "SELECT alkblobs_create_pool('fleet', large_tier => 'pg-lo')"
//! psql "$URL" -c "CREATE TABLE docs (key bytea PRIMARY KEY, name text)" \
//!             -c "SELECT alkblobs_register_liveness('fleet', 'docs')"
//! cargo run -p alkblobs --features postgres --example fleet -- "$URL" fleet pg-lo
//! # the other large tiers: a pool made with large_tier => 'none' (kv-only,
//! # large content routed to a storage node) or 'local' (shared media):
//! cargo run -p alkblobs --features postgres --example fleet -- "$URL" fleet-none none
//! cargo run -p alkblobs --features postgres --example fleet -- "$URL" fleet-nfs local=/mnt/shared/blobs
//! # large content on S3 (feature `s3`, on by default): a pool made with
//! # large_tier => 's3', large_location => 's3://my-bucket/blobs'; the
//! # endpoint and credentials come from the AWS environment:
//! cargo run -p alkblobs --features postgres --example fleet -- "$URL" fleet-s3 s3://my-bucket/blobs
//! # routed: a pool made with large_tier => 'local' whose only large tier is
//! # one storage node's disk; the other nodes are kv-only and hand large
//! # content to it (here both roles run in this one process):
//! cargo run -p alkblobs --features postgres --example fleet -- "$URL" fleet-routed routed=/srv/blobs
//! ```
//!
//! Run it on several nodes at once: each process is one store instance.
//! Its puts commit a pin row with their entry, renewed while it holds the
//! guard; it records what it keeps in the registered table (the fleet's
//! liveness) before letting the pin go, and any instance's sweep — or
//! `CALL alkblobs_sweep_all('fleet')` in psql — collects the rest.

use alkblobs::store::fleet::{FleetLarge, FleetOptions};
use alkblobs::{Store, SweepOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "postgresql://postgres@127.0.0.1:54329/alkblobs_test".into());
    let pool = args.next().unwrap_or_else(|| "fleet".into());
    // The fleet-validity rule: the large tier is declared, and must be the
    // pool's own.
    let mode = args.next().unwrap_or_else(|| "pg-lo".into());
    if let Some(dir) = mode.strip_prefix("routed=") {
        return routed(&url, &pool, dir).await;
    }
    let large = match mode.as_str() {
        "pg-lo" => FleetLarge::PgLo,
        "none" => FleetLarge::KvOnly,
        // The pool's bucket and prefix, as every node declares it.
        #[cfg(feature = "s3")]
        other if other.starts_with("s3://") => {
            FleetLarge::S3(alkblobs::backend::s3::S3Options::new(other.parse()?))
        }
        other => match other.strip_prefix("local=") {
            // The operator's assertion: this directory is the same shared
            // media on every node.
            Some(dir) => FleetLarge::SharedLocal(dir.into()),
            None => {
                return Err(format!(
                    "{other}: pg-lo, none, local=DIR, s3://BUCKET/PREFIX or routed=DIR"
                )
                .into());
            }
        },
    };
    let store = Store::open_fleet(FleetOptions::new(&url, &pool, large)).await?;
    println!(
        "instance of pool {pool}: window {:?} (the pool's)",
        store.delete_window()
    );

    let doc = store
        .put(b"a document another node may read".to_vec())
        .await?;
    // Reference it in the liveness table while the pin protects it ...
    let (db, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    // (A table this example did not find registered is simply skipped.)
    let recorded = db
        .execute(
            "INSERT INTO docs VALUES ($1, 'example') ON CONFLICT DO NOTHING",
            &[&doc.key.as_bytes().as_slice()],
        )
        .await
        .is_ok();
    // ... then let the pin go: the row keeps it.
    drop(doc.pin);
    let scratch = store
        .put(b"scratch: nobody references this".to_vec())
        .await?;
    drop(scratch.pin);

    let report = store.sweep(SweepOptions::new()).await?;
    println!(
        "sweep: examined {}, staged {}, deleted {}, pins reaped {}, aborted {:?}",
        report.examined, report.staged, report.deleted, report.pins_reaped, report.aborted
    );
    println!(
        "the document is {} (recorded in docs: {recorded})",
        if store.has(&doc.key).await? {
            "kept"
        } else {
            "gone"
        }
    );
    store.close().await?;
    Ok(())
}

/// The routed topology: a kv-only node refuses large content, hands it to
/// the storage node (verified against its key there), and fetches it back
/// verified.
async fn routed(url: &str, pool: &str, dir: &str) -> Result<(), Box<dyn std::error::Error>> {
    let storage = Store::open_fleet(FleetOptions::new(
        url,
        pool,
        FleetLarge::SharedLocal(dir.into()),
    ))
    .await?;
    let client = Store::open_fleet(FleetOptions::new(url, pool, FleetLarge::KvOnly)).await?;
    let video = vec![7u8; 4 << 20];
    let key = alkblobs::Key::of(&video);
    match client.put(video.clone()).await {
        Err(alkblobs::Error::TooLarge { .. }) => {
            // Over the threshold on a kv-only node: route it. (Between
            // nodes this is the request a client node sends; the storage
            // node stores it only if it hashes to the key.)
            let put = storage.put_verified(&key, video).await?;
            println!(
                "routed {} ({} bytes) to the storage node",
                put.key, put.size
            );
            drop(put.pin);
        }
        other => return Err(format!("a kv-only node took a large put: {other:?}").into()),
    }
    let back = storage.get_verified(&key).await?.ok_or("gone")?;
    println!("fetched it back verified: {} bytes", back.len());
    client.close().await?;
    storage.close().await?;
    Ok(())
}
