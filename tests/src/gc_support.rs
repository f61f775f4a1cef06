//! Shared pieces for the GC tests: store configurations and an embedder's
//! liveness index.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use alkblobs::backend::local::{LocalBackend, LocalOptions};
use alkblobs::backend::mem::MemBackend;
use alkblobs::backend::sqlite::{SqliteBackend, SqliteOptions};
use alkblobs::{BoxError, Durability, Key, Store};
use tokio::sync::Mutex;

/// A store under test with what keeps it alive.
pub struct Case {
    /// Configuration name, for messages.
    pub name: &'static str,
    /// The store.
    pub store: Store,
    /// Its directory, if any.
    pub dir: Option<tempfile::TempDir>,
}

/// Every store configuration GC tests run over: in-process tables
/// (mem + mem, mem + local) and durable sqlite tables (sqlite + local).
/// Windows are zero unless a test says otherwise.
pub async fn cases(window: Duration) -> Vec<Case> {
    let mut v = Vec::new();
    v.push(Case {
        name: "mem+mem",
        store: Store::builder()
            .kv(MemBackend::new())
            .large(MemBackend::new())
            .threshold(4096)
            .delete_window(window)
            .build()
            .unwrap(),
        dir: None,
    });
    let dir = tempfile::tempdir().unwrap();
    let local = LocalBackend::open(
        dir.path().join("large"),
        LocalOptions::default().durability(Durability::Relaxed),
    )
    .await
    .unwrap();
    v.push(Case {
        name: "mem+local",
        store: Store::builder()
            .kv(MemBackend::new())
            .large(local)
            .threshold(4096)
            .delete_window(window)
            .build()
            .unwrap(),
        dir: Some(dir),
    });
    v.push(sqlite_local(window).await);
    v
}

/// sqlite + local (relaxed durability, for speed) in a fresh directory.
pub async fn sqlite_local(window: Duration) -> Case {
    let dir = tempfile::tempdir().unwrap();
    let store = open_sqlite_local(dir.path(), window).await;
    Case {
        name: "sqlite+local",
        store,
        dir: Some(dir),
    }
}

/// sqlite + local with durable commits: sqlite's puts then go through
/// group commit (several concurrent puts share one transaction).
pub async fn sqlite_local_durable(window: Duration) -> Case {
    let dir = tempfile::tempdir().unwrap();
    let kv = SqliteBackend::open(dir.path().join("index.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    let large = LocalBackend::open(dir.path().join("large"), LocalOptions::default())
        .await
        .unwrap();
    let store = Store::builder()
        .sqlite(kv)
        .large(large)
        .threshold(4096)
        .delete_window(window)
        .build()
        .unwrap();
    Case {
        name: "sqlite+local (durable, group commit)",
        store,
        dir: Some(dir),
    }
}

/// Opens sqlite + local under `dir`.
pub async fn open_sqlite_local(dir: &std::path::Path, window: Duration) -> Store {
    let kv = SqliteBackend::open(
        dir.join("index.sqlite"),
        SqliteOptions::default().durability(Durability::Relaxed),
    )
    .await
    .unwrap();
    let large = LocalBackend::open(
        dir.join("large"),
        LocalOptions::default().durability(Durability::Relaxed),
    )
    .await
    .unwrap();
    Store::builder()
        .sqlite(kv)
        .large(large)
        .threshold(4096)
        .delete_window(window)
        .build()
        .unwrap()
}

/// An embedder's own index of live keys, registered as a "live set" source.
#[derive(Clone, Default)]
pub struct Live(pub Arc<Mutex<HashSet<Key>>>);

impl Live {
    /// Registers this index on `store` under `name`.
    pub fn register(&self, store: &Store, name: &str) {
        let set = self.0.clone();
        store
            .register_live_set(name, move || {
                let set = set.clone();
                async move { Ok::<_, BoxError>(set.lock().await.clone()) }
            })
            .unwrap();
    }

    /// Records a key as live.
    pub async fn add(&self, k: Key) {
        self.0.lock().await.insert(k);
    }

    /// Forgets a key.
    pub async fn remove(&self, k: &Key) {
        self.0.lock().await.remove(k);
    }
}

/// sqlite + local behind the (disarmed) fault wrapper, with the sqlite
/// database's durable tables given to the arbiter explicitly (the builder
/// cannot see through the wrapper to pair them itself). The caller adds
/// the threshold and builds.
pub async fn faulty_durable_tables(
    dir: &std::path::Path,
    durability: Durability,
) -> alkblobs::StoreBuilder {
    use alkblobs::arbiter::single::{SingleNodeArbiter, SqliteTables};
    use alkblobs::conformance::fault::FaultBackend;
    let db = SqliteBackend::open(
        dir.join("index.sqlite"),
        SqliteOptions::default().durability(durability),
    )
    .await
    .unwrap();
    let local = LocalBackend::open(
        dir.join("large"),
        LocalOptions::default().durability(durability),
    )
    .await
    .unwrap();
    let tables = Arc::new(SqliteTables::attach(&db).unwrap());
    let arbiter = SingleNodeArbiter::with_tables(tables, alkblobs::arbiter::DEFAULT_WINDOW);
    Store::builder()
        .kv(FaultBackend::new(Arc::new(db)))
        .large(FaultBackend::new(Arc::new(local)))
        .arbiter(Arc::new(arbiter))
}
