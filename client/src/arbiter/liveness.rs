//! Liveness sources: the embedder's answer to "which keys are live".
//!
//! Single-node stores take any [`LivenessSource`]: a set ([`LiveSet`]), a
//! per-key check ([`LiveCheck`]) or an embedder's own type. A fleet arbiter
//! takes liveness tables instead (a callback in one process cannot protect
//! keys against another node's sweep) and refuses these sources.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};

use crate::{BoxError, Key, Result};

/// A source of liveness: the embedder's answer to "which keys are live".
///
/// # Contract
/// A snapshot must reflect every liveness record the embedder made before
/// [`LivenessSource::snapshot`] was called. It may be newer. A failure (or a
/// timeout, see [`SweepOptions::source_timeout`](crate::SweepOptions::source_timeout)) aborts the sweep with
/// nothing deleted from that point on, reported as
/// [`GcAbortCause::ProtectionSource`](crate::GcAbortCause::ProtectionSource).
#[async_trait]
pub trait LivenessSource: Send + Sync + 'static {
    /// Opens a view of the live set for one phase of a sweep.
    async fn snapshot(&self) -> Result<Box<dyn LiveSnapshot>, BoxError>;
}

/// One phase's view of a liveness source.
#[async_trait]
pub trait LiveSnapshot: Send + Sync {
    /// For each key, whether it is live.
    async fn contains(&self, keys: &[Key]) -> Result<Vec<bool>, BoxError>;
}

/// A liveness source given as "the set of live keys": the closure is called
/// once per sweep phase.
pub struct LiveSet<F> {
    f: F,
}

impl<F, Fut> LiveSet<F>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<HashSet<Key>, BoxError>> + Send + 'static,
{
    /// Wraps a closure returning the live set.
    pub fn new(f: F) -> LiveSet<F> {
        LiveSet { f }
    }
}

struct SetSnapshot(HashSet<Key>);

#[async_trait]
impl LiveSnapshot for SetSnapshot {
    async fn contains(&self, keys: &[Key]) -> Result<Vec<bool>, BoxError> {
        Ok(keys.iter().map(|k| self.0.contains(k)).collect())
    }
}

#[async_trait]
impl<F, Fut> LivenessSource for LiveSet<F>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<HashSet<Key>, BoxError>> + Send + 'static,
{
    async fn snapshot(&self) -> Result<Box<dyn LiveSnapshot>, BoxError> {
        Ok(Box::new(SetSnapshot((self.f)().await?)))
    }
}

/// A liveness source given as "is this key live?": called per key (up to 16
/// at a time).
pub struct LiveCheck<F> {
    f: Arc<F>,
}

impl<F, Fut> LiveCheck<F>
where
    F: Fn(Key) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<bool, BoxError>> + Send + 'static,
{
    /// Wraps a per-key predicate.
    pub fn new(f: F) -> LiveCheck<F> {
        LiveCheck { f: Arc::new(f) }
    }
}

struct CheckSnapshot<F>(Arc<F>);

#[async_trait]
impl<F, Fut> LiveSnapshot for CheckSnapshot<F>
where
    F: Fn(Key) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<bool, BoxError>> + Send + 'static,
{
    async fn contains(&self, keys: &[Key]) -> Result<Vec<bool>, BoxError> {
        let f = &self.0;
        // Owned keys: a closure over `&Key` would need a higher-ranked
        // lifetime the async-trait future cannot name.
        let owned: Vec<Key> = keys.to_vec();
        futures::stream::iter(owned.into_iter().map(|k| (**f)(k)))
            .buffered(16)
            .try_collect()
            .await
    }
}

#[async_trait]
impl<F, Fut> LivenessSource for LiveCheck<F>
where
    F: Fn(Key) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<bool, BoxError>> + Send + 'static,
{
    async fn snapshot(&self) -> Result<Box<dyn LiveSnapshot>, BoxError> {
        Ok(Box::new(CheckSnapshot(self.f.clone())))
    }
}
