//! The protection protocol of every put, written once: pin the keys (from
//! then on no sweep may delete them), tell the arbiter a publish is coming
//! (a shared tier records the file before it is renamed into place), let
//! the engine publish, then tell the arbiter the keys are published (a put
//! restarts each key's delete window). Every put path — one value, a batch,
//! a staged large write — goes through a [`Publication`]; none writes the
//! steps out itself.

use super::Store;
use crate::arbiter::PinGuard;
use crate::tier::Tier;
use crate::{Key, Result};

/// Keys of one tier between their pin and their publication. Dropped
/// without [`Publication::published`] (the engine failed), the pin is
/// released with it.
#[must_use = "a publication must be finished with `published` once the engine has published"]
pub(crate) struct Publication<'a> {
    store: &'a Store,
    tier: Tier,
    keys: Vec<Key>,
    pin: PinGuard,
}

impl Store {
    /// Pins `keys` of `tier` and readies their publication: the first two
    /// steps. On an error nothing is pinned.
    pub(crate) async fn begin_publication(
        &self,
        tier: Tier,
        keys: Vec<Key>,
    ) -> Result<Publication<'_>> {
        let arbiter = &self.inner.arbiter;
        let pin = arbiter.pin(tier, &keys).await?;
        if !keys.is_empty() {
            arbiter.before_publish(tier, &keys).await?;
        }
        Ok(Publication {
            store: self,
            tier,
            keys,
            pin,
        })
    }
}

impl Publication<'_> {
    /// The engine has published the keys: the last step. Returns the pin,
    /// which the caller hands to whoever asked for the put.
    pub(crate) async fn published(self) -> Result<PinGuard> {
        if !self.keys.is_empty() {
            self.store
                .inner
                .arbiter
                .published(self.tier, &self.keys)
                .await?;
        }
        Ok(self.pin)
    }
}
