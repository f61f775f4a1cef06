//! The foundation under the engines, the arbiters and the store: the tier
//! an entry lives in (kv at or under the threshold, large above it), the
//! key streams every engine lists, and their sorted union (how a store
//! lists both tiers, and an arbiter marks them). Depends on nothing of the
//! crate but keys and errors. (Reads fall through kv then large, so a blob
//! written under an older threshold is still found: `store/read.rs`.)

use futures::StreamExt;
use futures::stream::BoxStream;

use crate::Key;
use crate::Result;

/// A stream of keys, in ascending byte order, each at most once.
pub type KeyStream<'a> = BoxStream<'a, Result<Key>>;

/// The storage tier of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Small blobs, in the kv engine's table.
    Kv,
    /// Blobs over the threshold, in the large engine.
    Large,
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Tier::Kv => "kv",
            Tier::Large => "large",
        })
    }
}

/// The tier a blob of `size` bytes belongs in.
pub(crate) fn tier_for(size: u64, threshold: u64) -> Tier {
    if size <= threshold {
        Tier::Kv
    } else {
        Tier::Large
    }
}

struct Merge<'a> {
    a: KeyStream<'a>,
    b: KeyStream<'a>,
    head_a: Option<Key>,
    head_b: Option<Key>,
    done_a: bool,
    done_b: bool,
}

/// Merges two ascending key streams into one ascending stream without
/// duplicates. Errors are passed through as they arrive.
pub(crate) fn merge_sorted<'a>(a: KeyStream<'a>, b: KeyStream<'a>) -> KeyStream<'a> {
    let state = Merge {
        a,
        b,
        head_a: None,
        head_b: None,
        done_a: false,
        done_b: false,
    };
    Box::pin(futures::stream::unfold(state, |mut s| async move {
        if s.head_a.is_none() && !s.done_a {
            match s.a.next().await {
                Some(Ok(k)) => s.head_a = Some(k),
                Some(Err(e)) => return Some((Err(e), s)),
                None => s.done_a = true,
            }
        }
        if s.head_b.is_none() && !s.done_b {
            match s.b.next().await {
                Some(Ok(k)) => s.head_b = Some(k),
                Some(Err(e)) => return Some((Err(e), s)),
                None => s.done_b = true,
            }
        }
        let next: Result<Key> = match (s.head_a, s.head_b) {
            (None, None) => return None,
            (Some(x), None) => {
                s.head_a = None;
                Ok(x)
            }
            (None, Some(y)) => {
                s.head_b = None;
                Ok(y)
            }
            (Some(x), Some(y)) => {
                if x <= y {
                    s.head_a = None;
                }
                if y <= x {
                    s.head_b = None;
                }
                Ok(x.min(y))
            }
        };
        Some((next, s))
    }))
}

/// The keys of ascending stream `a` that ascending stream `b` does not
/// hold, ascending. Errors are passed through as they arrive. (The s3
/// engine's: without it, only the tests use it.)
#[cfg_attr(not(feature = "s3"), allow(dead_code))]
pub(crate) fn subtract_sorted<'a>(a: KeyStream<'a>, b: KeyStream<'a>) -> KeyStream<'a> {
    let state = (a, b, None::<Key>, false);
    Box::pin(futures::stream::unfold(
        state,
        |(mut a, mut b, mut head_b, mut done_b)| async move {
            loop {
                let x = match a.next().await? {
                    Ok(x) => x,
                    Err(e) => return Some((Err(e), (a, b, head_b, done_b))),
                };
                // Advance `b` to the first key at or after `x`.
                while !done_b && head_b.is_none_or(|y| y < x) {
                    match b.next().await {
                        Some(Ok(y)) => head_b = Some(y),
                        Some(Err(e)) => return Some((Err(e), (a, b, head_b, done_b))),
                        None => {
                            done_b = true;
                            head_b = None;
                        }
                    }
                }
                if head_b != Some(x) {
                    return Some((Ok(x), (a, b, head_b, done_b)));
                }
            }
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;

    fn keys(bytes: &[u8]) -> Vec<Key> {
        bytes
            .iter()
            .map(|b| {
                let mut k = [0u8; 32];
                k[0] = *b;
                Key::from_bytes(k)
            })
            .collect()
    }

    fn stream(v: Vec<Key>) -> KeyStream<'static> {
        Box::pin(futures::stream::iter(v.into_iter().map(Ok)))
    }

    #[tokio::test]
    async fn subtract_keeps_what_the_second_lacks() {
        let left: Vec<Key> = subtract_sorted(
            stream(keys(&[1, 3, 5, 7, 9])),
            stream(keys(&[0, 3, 4, 7, 8])),
        )
        .try_collect()
        .await
        .unwrap();
        assert_eq!(left, keys(&[1, 5, 9]));
        let none: Vec<Key> = subtract_sorted(stream(keys(&[2])), stream(keys(&[2])))
            .try_collect()
            .await
            .unwrap();
        assert!(none.is_empty());
    }

    #[tokio::test]
    async fn merge_is_sorted_union_without_duplicates() {
        let merged: Vec<Key> = merge_sorted(stream(keys(&[1, 3, 5, 7])), stream(keys(&[2, 3, 8])))
            .try_collect()
            .await
            .unwrap();
        assert_eq!(merged, keys(&[1, 2, 3, 5, 7, 8]));
        let empty: Vec<Key> = merge_sorted(stream(vec![]), stream(vec![]))
            .try_collect()
            .await
            .unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn threshold_is_inclusive() {
        assert_eq!(tier_for(100, 100), Tier::Kv);
        assert_eq!(tier_for(101, 100), Tier::Large);
        assert_eq!(tier_for(0, 0), Tier::Kv);
    }
}
