//! Pins as rows of this instance: guards counted in process, the release
//! queue and its task's batched deletes, renewal, and confirming pins.

use std::collections::HashSet;
use std::sync::MutexGuard;
use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::types::Type;

use super::PinRelease;
use crate::{Error, Key, Result};

use super::{BATCH, PinState, Shared, key_of};

impl Shared {
    pub(super) fn pins(&self) -> MutexGuard<'_, PinState> {
        // Every critical section leaves the maps consistent.
        self.pins.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn name(&self) -> &str {
        &self.info.name
    }

    /// Counts one pin per key, after any release of their rows in flight.
    pub(super) async fn count(&self, keys: &[Key]) {
        loop {
            let waiting = {
                let mut s = self.pins();
                let busy = keys
                    .iter()
                    .find_map(|k| s.releasing.get(k).map(|tx| tx.subscribe()));
                if busy.is_none() {
                    for k in keys {
                        *s.counts.entry(*k).or_insert(0) += 1;
                        // A queued release is cancelled: the row stays.
                        s.queued.remove(k);
                    }
                }
                busy
            };
            match waiting {
                None => return,
                Some(mut rx) => while rx.changed().await.is_ok() {},
            }
        }
    }

    /// The keys among `keys` whose pin rows of this instance are un-expired.
    pub(super) async fn held(&self, keys: &[Key]) -> Result<HashSet<Key>> {
        let mut out = HashSet::new();
        for chunk in keys.chunks(BATCH) {
            let ks: Vec<Vec<u8>> = chunk.iter().map(|k| k.as_bytes().to_vec()).collect();
            let rows = self
                .control
                .rows(
                    &self.control,
                    chunk.first().copied(),
                    "SELECT k FROM alkblobs_pins_held($1, $2, $3) k",
                    &[
                        (&self.info.name, Type::TEXT),
                        (&self.owner, Type::TEXT),
                        (&ks, Type::BYTEA_ARRAY),
                    ],
                )
                .await?;
            for r in rows {
                out.insert(key_of(&r.get::<_, Vec<u8>>(0))?);
            }
        }
        Ok(out)
    }

    /// Wakes the release task and waits, at most `limit`, until no key is
    /// queued or being released. Changes nothing itself: cancelling the
    /// wait is harmless.
    pub(super) async fn flush_releases(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            {
                let s = self.pins();
                if s.queued.is_empty() && s.releasing.is_empty() {
                    return;
                }
            }
            self.wake_releaser.notify_one();
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// One release round: deletes the rows of every queued key.
    pub(super) async fn release_queued(&self) {
        let (keys, _senders): (Vec<Key>, Vec<watch::Sender<()>>) = {
            let mut s = self.pins();
            let keys: Vec<Key> = s.queued.drain().collect();
            let senders = keys
                .iter()
                .map(|k| {
                    let (tx, _) = watch::channel(());
                    s.releasing.insert(*k, tx.clone());
                    tx
                })
                .collect();
            (keys, senders)
        };
        if keys.is_empty() {
            return;
        }
        let mut failed = Vec::new();
        for chunk in keys.chunks(BATCH) {
            let ks: Vec<Vec<u8>> = chunk.iter().map(|k| k.as_bytes().to_vec()).collect();
            // Bounded: a call stuck on a dead connection must not keep the
            // keys' waiters (pins of these keys) waiting for ever.
            let r = tokio::time::timeout(
                self.call_limit(),
                self.control.rows(
                    &self.control,
                    None,
                    "SELECT alkblobs_unpin_many($1, $2, $3)",
                    &[
                        (&self.info.name, Type::TEXT),
                        (&self.owner, Type::TEXT),
                        (&ks, Type::BYTEA_ARRAY),
                    ],
                ),
            )
            .await
            .unwrap_or_else(|_| Err(Error::engine(&self.control, "releasing pins timed out")));
            if let Err(e) = r {
                tracing::warn!(pool = %self.name(), error = %e, keys = chunk.len(), "releasing pins failed; retrying");
                failed.extend_from_slice(chunk);
            }
        }
        let mut s = self.pins();
        for k in &keys {
            s.releasing.remove(k);
        }
        // A failed release is retried unless the key was pinned again (its
        // row must stay; renewal keeps it).
        let mut requeued = false;
        for k in failed {
            if !s.counts.contains_key(&k) {
                s.queued.insert(k);
                requeued = true;
            }
        }
        drop(s);
        if requeued {
            // (The release task retries what its own round re-queued; a
            // wake makes sure of it whoever ran this round.)
            self.wake_releaser.notify_one();
        }
    }

    /// How long a renewal or release call may take before it is given up
    /// (and retried): a third of the TTL, so a call stuck on a dead
    /// connection leaves time for the next round.
    pub(super) fn call_limit(&self) -> Duration {
        self.info.pin_ttl / 3
    }

    /// One renewal round: every un-expired pin row of this instance, one
    /// statement, bounded by [`Shared::call_limit`].
    pub(super) async fn renew(&self) -> Result<i64> {
        let rows = tokio::time::timeout(
            self.call_limit(),
            self.control.rows(
                &self.control,
                None,
                "SELECT alkblobs_renew($1, $2)",
                &[(&self.info.name, Type::TEXT), (&self.owner, Type::TEXT)],
            ),
        )
        .await
        .unwrap_or_else(|_| Err(Error::engine(&self.control, "renewing pins timed out")))?;
        Ok(rows.first().map(|r| r.get::<_, i64>(0)).unwrap_or(0))
    }

    /// Wakes everything waiting on a release and forgets the queue (the
    /// tasks are stopping: rows left behind expire after the TTL).
    pub(super) fn abandon_releases(&self) {
        let mut s = self.pins();
        s.queued.clear();
        s.releasing.clear();
    }
}

impl PinRelease for Shared {
    fn release(&self, keys: &[Key]) {
        let mut any = false;
        {
            let mut s = self.pins();
            for k in keys {
                if let Some(n) = s.counts.get_mut(k) {
                    *n -= 1;
                    if *n == 0 {
                        s.counts.remove(k);
                        s.queued.insert(*k);
                        any = true;
                    }
                }
            }
        }
        if any {
            self.wake_releaser.notify_one();
        }
    }
}
