//! Object generations on a fleet's shared large tier: which object holds a
//! key's bytes, as the database handed it out (`alkblobs_pin_new`).
//!
//! A claimer's delete may land after the key was recorded afresh: one
//! that was handed the deletion and then stopped (SIGSTOP, a long pause,
//! a partition) sends it whenever it resumes, and an attempt of a delete
//! its HTTP client retried may still be running somewhere. So on an s3
//! tier the database fences a key when a claim of it finishes, and
//! records the key afresh under a later generation — an object named
//! `<key>.gN` no such delete can name. The fleet arbiter writes here what
//! `alkblobs_pin_new` returned, before the engine publishes; the engine
//! names the object by it; the arbiter forgets it once the put is
//! published. Generation 0 (the key's own name) is never stored.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::Key;

/// The generations this process's puts in flight were handed, by key (0
/// if absent), with how many puts of the key are between `set` and
/// `forget`: a key collected and put again keeps a generation above 0 for
/// good, so entries go when their puts are published (a put that fails
/// in between leaves its count, one entry per such key).
#[derive(Debug, Default)]
pub(crate) struct Generations(Mutex<HashMap<Key, (u64, u32)>>);

impl Generations {
    /// What `alkblobs_pin_new` returned for `key`, for a put about to
    /// publish it. Every put of a shared tier calls it before publishing,
    /// so an entry is never stale when read.
    pub(crate) fn set(&self, key: Key, generation: u64) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if generation == 0 && !m.contains_key(&key) {
            return;
        }
        let e = m.entry(key).or_insert((0, 0));
        e.0 = e.0.max(generation);
        e.1 += 1;
    }

    /// A put of `key` is published: its entry goes with the last of them.
    pub(crate) fn forget(&self, key: &Key) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = m.get_mut(key) {
            e.1 = e.1.saturating_sub(1);
            if e.1 == 0 {
                m.remove(key);
            }
        }
    }

    /// The generation a put of `key` publishes.
    pub(crate) fn get(&self, key: &Key) -> u64 {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.get(key).map_or(0, |e| e.0)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_lives_while_a_put_of_its_key_is_in_flight() {
        let g = Generations::default();
        let k = Key::of(b"k");
        g.set(k, 0);
        assert_eq!((g.get(&k), g.len()), (0, 0), "generation 0 is not stored");
        g.set(k, 2);
        g.set(k, 2);
        assert_eq!(g.get(&k), 2);
        g.forget(&k);
        assert_eq!(g.get(&k), 2, "a second put of the key is in flight");
        g.forget(&k);
        assert_eq!((g.get(&k), g.len()), (0, 0), "gone with the last");
        g.forget(&k);
        assert_eq!(g.len(), 0);
    }
}
