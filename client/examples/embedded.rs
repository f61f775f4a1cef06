//! REQ-1: one process, no server — SQLite for small blobs, files for large
//! ones, in one data directory.
//!
//! ```sh
//! cargo run -p alkblobs --example embedded -- /tmp/alkblobs-example
//! ```

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use alkblobs::{DirOptions, Key, Store, SweepOptions};

#[tokio::main]
async fn main() -> alkblobs::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "/tmp/alkblobs-example".into());
    let store = Store::open_dir_with(&dir, DirOptions::new()).await?;

    // The application's own index of what it references: its liveness.
    let index: Arc<Mutex<HashSet<Key>>> = Arc::default();
    let live = index.clone();
    store.register_live_set("app-index", move || {
        let live = live.clone();
        async move { Ok(live.lock().unwrap().clone()) }
    })?;

    let kept = store.put(b"referenced by the index".to_vec()).await?;
    index.lock().unwrap().insert(kept.key); // record it, then let the pin go
    drop(kept.pin);
    let dropped = store.put(b"nobody references this".to_vec()).await?;
    drop(dropped.pin);

    let report = store
        .sweep(SweepOptions::new().window(std::time::Duration::ZERO))
        .await?;
    println!(
        "examined {}, deleted {}; kept {} ({})",
        report.examined,
        report.deleted,
        kept.key,
        store.has(&kept.key).await?
    );
    store.close().await
}
