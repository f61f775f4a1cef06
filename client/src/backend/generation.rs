//! Object generations on a fleet's shared large tier: which object holds a
//! key's bytes, as the database handed it out (`alkblobs_pin_new`).
//!
//! A claimer that was handed a key's deletion and then stopped (SIGSTOP, a
//! long pause, a partition) may send its delete whenever it resumes. The
//! database fences such a key when it hands its tombstone out again, and
//! records the key afresh under a later generation — on s3, an object
//! named `<key>.gN` that the late delete cannot name. The fleet arbiter
//! writes here what `alkblobs_pin_new` returned, before the engine
//! publishes; the engine names the object by it. Generation 0 (the key's
//! own name) is never stored: almost every key has it.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::Key;

/// The generations this process's pins were handed, by key (0 if absent).
#[derive(Debug, Default)]
pub(crate) struct Generations(Mutex<HashMap<Key, u64>>);

impl Generations {
    /// What `alkblobs_pin_new` returned for `key`. Every put of a shared
    /// tier calls it before publishing, so an entry is never stale when
    /// read; the map holds only fenced keys, a handful.
    pub(crate) fn set(&self, key: Key, generation: u64) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if generation == 0 {
            m.remove(&key);
        } else {
            m.insert(key, generation);
        }
    }

    /// The generation a put of `key` publishes.
    pub(crate) fn get(&self, key: &Key) -> u64 {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.get(key).copied().unwrap_or(0)
    }
}
