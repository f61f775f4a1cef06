//! The single-node arbiter's liveness registry and per-phase snapshots.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;

use super::tables::GcTables;
use crate::arbiter::{GcAbortCause, LiveSnapshot, LivenessSource};
use crate::{BoxError, Key, Result};

pub use crate::arbiter::ROOTS_SOURCE;

/// Named liveness sources; `roots` is always registered.
pub(crate) struct Sources {
    map: RwLock<BTreeMap<String, Arc<dyn LivenessSource>>>,
}

impl Sources {
    pub(crate) fn new(tables: Arc<dyn GcTables>) -> Sources {
        let mut map: BTreeMap<String, Arc<dyn LivenessSource>> = BTreeMap::new();
        map.insert(ROOTS_SOURCE.into(), Arc::new(RootsSource(tables)));
        Sources {
            map: RwLock::new(map),
        }
    }

    pub(crate) fn register(&self, name: &str, source: Arc<dyn LivenessSource>) -> Result<()> {
        if name == ROOTS_SOURCE || name == "protect" {
            return Err(crate::Error::Config(format!(
                "the liveness source name {name:?} is reserved; pick another"
            )));
        }
        self.map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_owned(), source);
        Ok(())
    }

    pub(crate) fn unregister(&self, name: &str) -> bool {
        name != ROOTS_SOURCE
            && self
                .map
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .remove(name)
                .is_some()
    }

    pub(crate) fn source_names(&self) -> Vec<String> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// The sources of one sweep: every registered one, then `protect`.
    pub(crate) fn for_sweep(
        &self,
        protect: Option<&Arc<dyn LivenessSource>>,
    ) -> Vec<(String, Arc<dyn LivenessSource>)> {
        let mut v: Vec<_> = self
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(n, s)| (n.clone(), s.clone()))
            .collect();
        if let Some(p) = protect {
            v.push(("protect".into(), p.clone()));
        }
        v
    }
}

/// The store's persistent roots as a liveness source.
struct RootsSource(Arc<dyn GcTables>);

struct RootsSnapshot(Arc<dyn GcTables>);

#[async_trait]
impl LivenessSource for RootsSource {
    async fn snapshot(&self) -> Result<Box<dyn LiveSnapshot>, BoxError> {
        Ok(Box::new(RootsSnapshot(self.0.clone())))
    }
}

#[async_trait]
impl LiveSnapshot for RootsSnapshot {
    async fn contains(&self, keys: &[Key]) -> Result<Vec<bool>, BoxError> {
        Ok(self.0.roots_contain(keys).await?)
    }
}

/// Liveness snapshots for one phase.
pub(crate) struct Snapshots {
    views: Vec<(String, Box<dyn LiveSnapshot>)>,
    timeout: Option<Duration>,
}

async fn with_timeout<T>(
    timeout: Option<Duration>,
    name: &str,
    fut: impl Future<Output = Result<T, BoxError>>,
) -> Result<T, GcAbortCause> {
    let r = match timeout {
        Some(t) => match tokio::time::timeout(t, fut).await {
            Ok(r) => r,
            Err(_) => Err(format!("did not answer within {t:?}").into()),
        },
        None => fut.await,
    };
    r.map_err(|e| GcAbortCause::ProtectionSource {
        source: name.to_owned(),
        error: e.to_string(),
    })
}

impl Snapshots {
    pub(crate) async fn take(
        sources: &[(String, Arc<dyn LivenessSource>)],
        timeout: Option<Duration>,
    ) -> Result<Snapshots, GcAbortCause> {
        let mut views = Vec::with_capacity(sources.len());
        for (name, src) in sources {
            let view = with_timeout(timeout, name, src.snapshot()).await?;
            views.push((name.clone(), view));
        }
        Ok(Snapshots { views, timeout })
    }

    /// Removes live keys from `keys`; returns how many were live.
    pub(crate) async fn drop_live(&self, keys: &mut Vec<Key>) -> Result<u64, GcAbortCause> {
        let mut live = 0;
        for (name, view) in &self.views {
            if keys.is_empty() {
                break;
            }
            let answer = with_timeout(self.timeout, name, view.contains(keys)).await?;
            if answer.len() != keys.len() {
                return Err(GcAbortCause::ProtectionSource {
                    source: name.clone(),
                    error: format!("answered {} of {} keys", answer.len(), keys.len()),
                });
            }
            let mut it = answer.into_iter();
            let before = keys.len();
            keys.retain(|_| !it.next().unwrap_or(true));
            live += (before - keys.len()) as u64;
        }
        Ok(live)
    }
}
