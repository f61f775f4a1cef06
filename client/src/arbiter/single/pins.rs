//! In-process pins and the arbitration lock.
//!
//! One mutex guards three maps, and every decision that can delete a key is
//! taken while holding it (see `docs/design.md`, "Single-node protocol"):
//!
//! - `counts`: reference-counted pins. A pinned key is never deleted.
//! - `touched`: while a sweep runs, every key whose pin was acquired *or
//!   released* since the sweep began. The sweep never deletes a touched key:
//!   whatever a pin holder did with the key during the sweep (published it,
//!   recorded it in its liveness and let go), that sweep must not act on
//!   what it saw before.
//! - `deleting`: keys the executor has claimed and is deleting right now.
//!   A pin of such a key waits until the delete is done, so that a put that
//!   dedups never returns success for an entry that is disappearing under
//!   it; its publish then recreates the entry.
//!
//! The lock is a plain `std::sync::Mutex` held for a few map operations and
//! never across an `.await`, so guards can release in `Drop`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use crate::Key;
use crate::arbiter::{PinGuard, PinRelease};

#[derive(Debug, Default)]
pub(crate) struct PinMap {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    counts: HashMap<Key, u32>,
    touched: Option<HashSet<Key>>,
    deleting: HashMap<Key, watch::Sender<()>>,
}

impl State {
    fn touch(&mut self, key: &Key) {
        if let Some(t) = self.touched.as_mut() {
            t.insert(*key);
        }
    }

    fn protected(&self, key: &Key) -> bool {
        self.counts.contains_key(key) || self.touched.as_ref().is_some_and(|t| t.contains(key))
    }
}

impl PinMap {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the maps consistent before it can
        // panic, so a poisoned lock still guards valid state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pins every key, waiting while any of them is being deleted.
    pub(crate) async fn acquire(self: &Arc<Self>, keys: &[Key]) -> PinGuard {
        loop {
            let waiting = {
                let mut s = self.lock();
                let busy = keys
                    .iter()
                    .find_map(|k| s.deleting.get(k).map(|tx| tx.subscribe()));
                if busy.is_none() {
                    for k in keys {
                        *s.counts.entry(*k).or_insert(0) += 1;
                        s.touch(k);
                    }
                }
                busy
            };
            match waiting {
                None => break,
                // The executor drops the sender when its delete is done;
                // `changed` then returns at once, even if that already
                // happened, so no wake-up can be missed.
                Some(mut rx) => while rx.changed().await.is_ok() {},
            }
        }
        PinGuard::new(keys.to_vec(), self.clone())
    }
}

impl PinRelease for PinMap {
    fn release(&self, keys: &[Key]) {
        let mut s = self.lock();
        for k in keys {
            if let Some(c) = s.counts.get_mut(k) {
                *c -= 1;
                if *c == 0 {
                    s.counts.remove(k);
                }
            }
            s.touch(k);
        }
    }
}

impl PinMap {
    /// How many pins `key` has.
    pub(crate) fn count(&self, key: &Key) -> u32 {
        self.lock().counts.get(key).copied().unwrap_or(0)
    }

    /// Starts recording touched keys; called when a sweep begins.
    pub(crate) fn begin_sweep(&self) {
        self.lock().touched = Some(HashSet::new());
    }

    /// Stops recording; called when the sweep ends (in every outcome).
    pub(crate) fn end_sweep(&self) {
        self.lock().touched = None;
    }

    /// For each key: is it pinned now or touched during this sweep?
    pub(crate) fn protected(&self, keys: &[Key]) -> Vec<bool> {
        let s = self.lock();
        keys.iter().map(|k| s.protected(k)).collect()
    }

    /// Claims the unprotected keys for deletion, atomically with the check:
    /// from here until [`PinMap::finish_delete`], pins of the claimed keys
    /// wait. Returns the claimed keys; the rest were protected.
    pub(crate) fn claim_for_delete(&self, keys: &[Key]) -> Vec<Key> {
        let mut s = self.lock();
        let mut claimed = Vec::with_capacity(keys.len());
        for k in keys {
            if !s.protected(k) && !s.deleting.contains_key(k) {
                let (tx, _) = watch::channel(());
                s.deleting.insert(*k, tx);
                claimed.push(*k);
            }
        }
        claimed
    }

    /// Ends a claim, waking every pin waiting on the keys.
    pub(crate) fn finish_delete(&self, keys: &[Key]) {
        let mut s = self.lock();
        for k in keys {
            s.deleting.remove(k);
        }
    }
}
