//! The pin guard: what every put hands back and every reader holds.

use std::fmt;
use std::sync::Arc;

use crate::Key;

/// Releases pins; implemented by each arbiter's pin holder. `release` is
/// called from `Drop`, so it must not block: an arbiter whose release is a
/// network call queues it for a background task.
pub trait PinRelease: Send + Sync + fmt::Debug {
    /// Releases one pin per key (a key listed twice loses two pins).
    fn release(&self, keys: &[Key]);
}

/// Pins held on one or more keys; dropping it releases them.
///
/// Every put returns one: the key was pinned *before* its content was
/// published, so no sweep can collect it while you record it in your own
/// liveness. Record first, then drop the guard.
#[must_use = "dropping a pin guard releases the pin at once"]
#[derive(Debug)]
pub struct PinGuard {
    /// Every key this guard protects: the first `own` are `holder`'s pins,
    /// the rest belong to `others`.
    keys: Vec<Key>,
    own: usize,
    holder: Option<Arc<dyn PinRelease>>,
    /// Guards of other holders merged into this one; they release their own.
    others: Vec<PinGuard>,
}

impl PinGuard {
    /// A guard over pins `holder` has taken on `keys` (for arbiter
    /// implementations).
    pub fn new(keys: Vec<Key>, holder: Arc<dyn PinRelease>) -> PinGuard {
        PinGuard {
            own: keys.len(),
            keys,
            holder: Some(holder),
            others: Vec::new(),
        }
    }

    /// The pinned keys (one per pin; a key pinned twice appears twice).
    pub fn keys(&self) -> &[Key] {
        &self.keys
    }

    /// Releases the pins now (the same as dropping the guard).
    pub fn release(self) {}

    /// Moves `other`'s pins into this guard.
    pub fn merge(&mut self, mut other: PinGuard) {
        let same = match (&self.holder, &other.holder) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        if same {
            // Adopt other's own pins (kept at the front) and its merged guards.
            let theirs: Vec<Key> = other.keys.drain(..other.own).collect();
            let n = theirs.len();
            self.keys.splice(self.own..self.own, theirs);
            self.own += n;
            other.holder = None;
            other.own = 0;
            self.keys.append(&mut other.keys);
            self.others.append(&mut other.others);
        } else {
            self.keys.extend_from_slice(&other.keys);
            self.others.push(other);
        }
    }
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        if let Some(holder) = self.holder.take() {
            // Merged guards release their own keys when they drop.
            holder.release(&self.keys[..self.own]);
        }
    }
}
