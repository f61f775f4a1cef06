//! BLAKE3 tree outboards: what lets a reader verify any range of a large
//! blob without reading the rest of it.
//!
//! A blob's key is the root of BLAKE3's hash tree over its 1 KiB chunks.
//! The outboard stores the tree's inner nodes down to 16 KiB chunk groups
//! (`bao-tree`'s `BlockSize::from_chunk_log(4)`, the layout iroh-blobs
//! uses): for every parent node, its two children's chaining values, 64
//! bytes, in post order. That is 64 bytes per 16 KiB group (0.39% of the
//! blob); a blob of one group or less has an empty outboard.
//!
//! To verify `[start, end)` a reader fetches the groups covering it and the
//! pairs on their paths to the root, hashes the groups, and checks every
//! pair up to the key. A mismatch names the first bad offset.
//!
//! - [`Builder`] computes the key and the outboard in one pass over the
//!   bytes (the put's own hash pass), on every core for big buffers.
//! - [`plan`] says which groups and which outboard windows a range needs;
//!   [`check`] verifies them.
//!
//! An outboard is a pure function of the blob's bytes, hence of its key: a
//! stale outboard file left by a crash is never wrong for a later put of the
//! same key, and the engines treat one as replaceable.

use std::ops::Range;

use bao_tree::blake3::hazmat::{
    ChainingValue, HasherExt, Mode, merge_subtrees_non_root, merge_subtrees_root,
};
use bao_tree::iter::BaoChunk;
use bao_tree::{BaoTree, BlockSize, ChunkNum, ChunkRanges, TreeNode};

use crate::Key;

/// Chunk group log: 2^4 chunks of 1 KiB.
const GROUP_LOG: u8 = 4;
/// Bytes in a chunk group, the unit a range is verified in.
pub const GROUP: u64 = 16 * 1024;
/// Bytes of one outboard entry: a parent's two children.
pub const PAIR: u64 = 64;
/// From this many whole groups in one update or check, groups hash on
/// rayon's threads.
const PARALLEL_GROUPS: usize = 16;

fn block_size() -> BlockSize {
    BlockSize::from_chunk_log(GROUP_LOG)
}

/// The tree of a blob of `size` bytes.
pub fn tree(size: u64) -> BaoTree {
    BaoTree::new(size, block_size())
}

/// The outboard's length for a blob of `size` bytes.
pub fn outboard_len(size: u64) -> u64 {
    tree(size).outboard_size()
}

/// The chaining value of group `index`: a subtree, never the root unless
/// it is the blob's only group.
fn hash_group(index: u64, bytes: &[u8], is_root: bool) -> ChainingValue {
    if is_root {
        return *blake3::hash(bytes).as_bytes();
    }
    let mut h = blake3::Hasher::new();
    h.set_input_offset(index * GROUP);
    h.update(bytes);
    h.finalize_non_root()
}

fn parent(left: &ChainingValue, right: &ChainingValue, is_root: bool) -> ChainingValue {
    if is_root {
        *merge_subtrees_root(left, right, Mode::Hash).as_bytes()
    } else {
        merge_subtrees_non_root(left, right, Mode::Hash)
    }
}

/// Computes a blob's key and its outboard in one pass over its bytes.
///
/// The last group is held back until more bytes arrive or
/// [`Builder::finish`]: only then is it known whether it is the root (a
/// blob of one group) or a subtree. Memory: one group plus the outboard
/// (0.39% of the bytes so far).
#[derive(Debug, Default)]
pub struct Builder {
    /// Chaining values of complete subtrees, largest first (BLAKE3's stack).
    stack: Vec<ChainingValue>,
    /// The bytes of the last group, not hashed yet (at most [`GROUP`]).
    pending: Vec<u8>,
    /// Groups hashed so far.
    groups: u64,
    /// The outboard so far: pairs in post order.
    outboard: Vec<u8>,
    /// Hash a large update's groups on every core (rayon); off where the
    /// caller already runs several builders at once.
    sequential: bool,
}

impl Builder {
    /// An empty builder.
    pub fn new() -> Builder {
        Builder::default()
    }

    /// An empty builder that hashes on the calling thread only: for a
    /// caller that already runs several at once (`verify --jobs`), where
    /// handing groups to other cores costs more in wake-ups than it saves.
    pub fn sequential() -> Builder {
        Builder {
            sequential: true,
            ..Builder::default()
        }
    }

    /// Bytes seen so far.
    pub fn len(&self) -> u64 {
        self.groups * GROUP + self.pending.len() as u64
    }

    /// Whether no byte was seen.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds a group's chaining value, known not to be the last, merging
    /// every pair of complete subtrees it completes (each merge is a parent
    /// in post order: its pair is appended to the outboard).
    fn push_group(&mut self, cv: ChainingValue) {
        self.stack.push(cv);
        self.groups += 1;
        // A complete subtree per set bit of the group count: merge the rest.
        while self.stack.len() > self.groups.count_ones() as usize {
            let right = self.stack.pop().expect("two subtrees to merge");
            let left = self.stack.pop().expect("two subtrees to merge");
            self.outboard.extend_from_slice(&left);
            self.outboard.extend_from_slice(&right);
            // Not the root: at least one more group follows.
            self.stack.push(parent(&left, &right, false));
        }
    }

    /// Feeds bytes. Many whole groups at once hash on every core.
    pub fn update(&mut self, mut data: &[u8]) {
        let group = GROUP as usize;
        if !self.pending.is_empty() || data.len() <= group {
            let take = (group - self.pending.len()).min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
            if data.is_empty() {
                return;
            }
            // More bytes follow a full pending group: it is not the last.
            let cv = hash_group(self.groups, &self.pending, false);
            self.pending.clear();
            self.push_group(cv);
        }
        // Hash every whole group of `data` that has bytes after it; keep
        // the last (whole or not) pending.
        let whole = (data.len() - 1) / group;
        let (body, rest) = data.split_at(whole * group);
        let first = self.groups;
        let cvs: Vec<ChainingValue> = if whole >= PARALLEL_GROUPS && !self.sequential {
            use rayon::prelude::*;
            body.par_chunks(group)
                .enumerate()
                .map(|(i, g)| hash_group(first + i as u64, g, false))
                .collect()
        } else {
            body.chunks(group)
                .enumerate()
                .map(|(i, g)| hash_group(first + i as u64, g, false))
                .collect()
        };
        for cv in cvs {
            self.push_group(cv);
        }
        self.pending.extend_from_slice(rest);
    }

    /// The key and the outboard.
    pub fn finish(mut self) -> (Key, Vec<u8>) {
        let only = self.groups == 0;
        let mut cv = hash_group(self.groups, &self.pending, only);
        if only {
            return (Key::from_bytes(cv), self.outboard);
        }
        // Merge the right edge, smallest subtree first; the last is the root.
        while let Some(left) = self.stack.pop() {
            let is_root = self.stack.is_empty();
            self.outboard.extend_from_slice(&left);
            self.outboard.extend_from_slice(&cv);
            cv = parent(&left, &cv, is_root);
        }
        (Key::from_bytes(cv), self.outboard)
    }
}

/// The key and outboard of a whole buffer (blocks: call it off the async
/// workers for big buffers).
pub fn of(bytes: &[u8]) -> (Key, Vec<u8>) {
    let mut b = Builder::new();
    b.update(bytes);
    b.finish()
}

/// A blob's content read to its end and hashed in one pass: what `verify`
/// holds a stored blob against.
#[derive(Debug)]
pub enum Digest {
    /// Every byte was read: the key the bytes hash to, their number and
    /// their outboard.
    Whole {
        /// The key the bytes hash to.
        hash: Key,
        /// How many bytes there were.
        len: u64,
        /// Their outboard (empty for one chunk group or less).
        outboard: Vec<u8>,
    },
    /// The read failed midway.
    Unreadable {
        /// Bytes read before it failed.
        after: u64,
        /// The storage's own words.
        error: String,
    },
}

/// The most a digest reads at once.
const DIGEST_BUF: usize = 1 << 20;
/// What a blocking digest reads at once: small enough that the bytes the
/// kernel copies in are still in the core's cache when they are hashed
/// (1 MiB buffers, one per blocking thread, made the copy cost more than
/// the hashing).
const SYNC_BUF: usize = 64 << 10;

/// Reads `reader` to its end through a sequential [`Builder`] (the caller
/// runs several digests at once already), in reads of up to `size_hint`
/// bytes (at most 1 MiB).
pub async fn digest_async<R>(mut reader: R, size_hint: u64) -> Digest
where
    R: tokio::io::AsyncRead + Unpin,
{
    use tokio::io::AsyncReadExt;
    let mut builder = Builder::sequential();
    let mut buf = vec![0u8; size_hint.clamp(1, DIGEST_BUF as u64) as usize];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) => break,
            Ok(got) => builder.update(&buf[..got]),
            Err(e) => return unreadable(&builder, e),
        }
    }
    whole(builder)
}

/// The same on the calling thread, which it blocks: for an engine whose
/// reads are system calls (local files), one blocking call per blob
/// instead of a hop to the blocking pool per read. The buffer (64 KiB)
/// is one per thread, kept: a fresh one per blob costs its page faults
/// each time. `reader` must not call back into a digest on the same
/// thread (the buffer is borrowed for the whole read).
pub fn digest_sync(reader: &mut impl std::io::Read) -> Digest {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with_borrow_mut(|buf| {
        buf.resize(SYNC_BUF, 0);
        let mut builder = Builder::sequential();
        loop {
            match reader.read(buf) {
                Ok(0) => break,
                Ok(got) => builder.update(&buf[..got]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return unreadable(&builder, e),
            }
        }
        whole(builder)
    })
}

fn unreadable(builder: &Builder, e: std::io::Error) -> Digest {
    Digest::Unreadable {
        after: builder.len(),
        error: e.to_string(),
    }
}

fn whole(builder: Builder) -> Digest {
    let len = builder.len();
    let (hash, outboard) = builder.finish();
    Digest::Whole {
        hash,
        len,
        outboard,
    }
}

/// What verifying a byte range of a blob needs.
#[derive(Debug, Clone)]
pub struct Plan {
    tree: BaoTree,
    ranges: ChunkRanges,
    /// The bytes to read: the requested range widened to whole groups.
    pub data: Range<u64>,
    /// The outboard entries needed, in the order [`check`] consumes them:
    /// each a node and its byte offset in the outboard.
    nodes: Vec<(TreeNode, u64)>,
}

impl Plan {
    /// The outboard windows to read, each a byte range of the outboard:
    /// the needed pairs, with gaps under `merge_gap` bytes read through.
    pub fn outboard_windows(&self, merge_gap: u64) -> Vec<Range<u64>> {
        let mut offsets: Vec<u64> = self.nodes.iter().map(|(_, o)| *o).collect();
        offsets.sort_unstable();
        let mut out: Vec<Range<u64>> = Vec::new();
        for o in offsets {
            match out.last_mut() {
                Some(w) if o <= w.end + merge_gap => w.end = w.end.max(o + PAIR),
                _ => out.push(o..o + PAIR),
            }
        }
        out
    }
}

/// The plan for `[start, end)` of a blob of `size` bytes (`start < end <=
/// size`; an empty range needs nothing and is not planned).
pub fn plan(size: u64, range: Range<u64>) -> Plan {
    let tree = tree(size);
    let first = range.start / GROUP * (GROUP / 1024);
    let last = range.end.div_ceil(GROUP) * (GROUP / 1024);
    let ranges = ChunkRanges::from(ChunkNum(first)..ChunkNum(last));
    let mut nodes = Vec::new();
    for chunk in tree.ranges_pre_order_chunks_iter_ref(&ranges, 0) {
        if let BaoChunk::Parent { node, .. } = chunk
            && let Some(o) = tree.post_order_offset(node)
        {
            nodes.push((node, o.value() * PAIR));
        }
    }
    let data = (first * 1024)..(last * 1024).min(size);
    Plan {
        tree,
        ranges,
        data,
        nodes,
    }
}

/// Where a verified range went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// The group starting at this byte does not hash to what the tree says.
    Data(u64),
    /// The outboard's entry for the subtree starting at this byte is wrong
    /// (or missing): the bytes cannot be checked against the key.
    Outboard(u64),
}

impl Mismatch {
    /// The first byte of the damaged group or subtree.
    pub fn offset(&self) -> u64 {
        match self {
            Mismatch::Data(o) | Mismatch::Outboard(o) => *o,
        }
    }
}

/// A group's chaining value, as [`hash_groups`] computes it (`None`: the
/// bytes read did not reach it).
pub type GroupHash = Option<[u8; 32]>;

/// Verifies `data` (the bytes of `plan.data`) against `key`, reading the
/// outboard entries through `pair(offset)` (the 64 bytes at that outboard
/// offset, or `None` if the stored outboard is too short). Checks in tree
/// order, so the first mismatch is the one at the lowest offset.
pub fn check(
    key: &Key,
    plan: &Plan,
    data: &[u8],
    pair: impl FnMut(u64) -> Option<[u8; 64]>,
) -> Result<(), Mismatch> {
    let cvs = hash_groups(plan, data, true);
    check_hashed(key, plan, cvs, pair)
}

/// The chaining values of the plan's groups, in order, from `data` (the
/// bytes read of `plan.data`; shorter if the blob ended early: a group
/// they do not cover is `None`). With `parallel`, many groups hash on
/// rayon's threads. The hashing half of [`check`], so that a reader
/// chooses where the hashing runs.
pub fn hash_groups(plan: &Plan, data: &[u8], parallel: bool) -> Vec<GroupHash> {
    let from = plan.data.start;
    let leaves: Vec<(u64, usize, bool)> = plan
        .tree
        .ranges_pre_order_chunks_iter_ref(&plan.ranges, 0)
        .filter_map(|c| match c {
            BaoChunk::Leaf {
                start_chunk,
                size,
                is_root,
                ..
            } => Some((start_chunk.0 * 1024, size, is_root)),
            BaoChunk::Parent { .. } => None,
        })
        .collect();
    let leaf_cv = |&(at, size, is_root): &(u64, usize, bool)| {
        let at_in = (at - from) as usize;
        let bytes = data.get(at_in..at_in + size)?;
        Some(hash_group(at / GROUP, bytes, is_root))
    };
    if parallel && leaves.len() >= PARALLEL_GROUPS {
        use rayon::prelude::*;
        leaves.par_iter().map(leaf_cv).collect()
    } else {
        leaves.iter().map(leaf_cv).collect()
    }
}

/// The walk half of [`check`]: the groups' chaining values (every group of
/// the plan, in order, as [`hash_groups`] gives them) checked up the tree
/// to `key` through the outboard's pairs.
pub fn check_hashed(
    key: &Key,
    plan: &Plan,
    cvs: Vec<GroupHash>,
    pair: impl FnMut(u64) -> Option<[u8; 64]>,
) -> Result<(), Mismatch> {
    let mut cvs = cvs.into_iter();
    walk(key, plan, pair, |at, expected| {
        let cv = cvs.next().flatten().ok_or(Mismatch::Data(at))?;
        if cv != expected {
            return Err(Mismatch::Data(at));
        }
        Ok(())
    })
}

/// The tree walk of a plan from `key` down: each pair (read through
/// `pair`) must merge to what its parent says; each group's expected
/// chaining value, with its first byte, goes to `leaf`.
fn walk(
    key: &Key,
    plan: &Plan,
    mut pair: impl FnMut(u64) -> Option<[u8; 64]>,
    mut leaf: impl FnMut(u64, ChainingValue) -> Result<(), Mismatch>,
) -> Result<(), Mismatch> {
    let mut stack: Vec<ChainingValue> = vec![*key.as_bytes()];
    let mut nodes = plan.nodes.iter();
    for chunk in plan.tree.ranges_pre_order_chunks_iter_ref(&plan.ranges, 0) {
        match chunk {
            BaoChunk::Parent {
                node,
                is_root,
                left,
                right,
                ..
            } => {
                let at = node.chunk_range().start.0 * 1024;
                let offset = match nodes.next() {
                    Some((n, o)) if *n == node => *o,
                    _ => return Err(Mismatch::Outboard(at)),
                };
                let p = pair(offset).ok_or(Mismatch::Outboard(at))?;
                let (l, r) = p.split_at(32);
                let l: ChainingValue = l.try_into().expect("32 bytes");
                let r: ChainingValue = r.try_into().expect("32 bytes");
                let expected = stack.pop().ok_or(Mismatch::Outboard(at))?;
                if parent(&l, &r, is_root) != expected {
                    return Err(Mismatch::Outboard(at));
                }
                if right {
                    stack.push(r);
                }
                if left {
                    stack.push(l);
                }
            }
            BaoChunk::Leaf { start_chunk, .. } => {
                let at = start_chunk.0 * 1024;
                let expected = stack.pop().ok_or(Mismatch::Outboard(at))?;
                leaf(at, expected)?;
            }
        }
    }
    Ok(())
}

/// Whether `outboard` is the outboard of a blob of `size` bytes under
/// `key`: its length is the tree's, and every pair merges to what its
/// parent says, up to the key. The entries of the groups themselves bind
/// to the key only through the pairs above them, which BLAKE3 makes
/// unforgeable, so a valid outboard is the blob's (without its bytes).
pub fn validate(key: &Key, size: u64, outboard: &[u8]) -> bool {
    if outboard.len() as u64 != outboard_len(size) {
        return false;
    }
    if outboard.is_empty() {
        return true;
    }
    let pair = |o: u64| {
        outboard
            .get(o as usize..(o + PAIR) as usize)?
            .try_into()
            .ok()
    };
    walk(key, &plan(size, 0..size), pair, |_, _| Ok(())).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bao_tree::io::outboard::PostOrderMemOutboard;
    use proptest::prelude::*;

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
            .collect()
    }

    /// `bao-tree`'s own outboard of the same bytes: the oracle.
    fn oracle(data: &[u8]) -> (Key, Vec<u8>) {
        let ob = PostOrderMemOutboard::create(data, block_size());
        (Key::from_bytes(*ob.root.as_bytes()), ob.data)
    }

    /// Reads the outboard like an engine would.
    fn pairs(ob: &[u8]) -> impl FnMut(u64) -> Option<[u8; 64]> + '_ {
        |o| ob.get(o as usize..o as usize + 64)?.try_into().ok()
    }

    #[test]
    fn sizes_around_group_and_tree_edges_match_bao_tree() {
        let g = GROUP as usize;
        for n in [
            0,
            1,
            1024,
            g - 1,
            g,
            g + 1,
            2 * g,
            3 * g + 7,
            4 * g,
            5 * g,
            8 * g - 1,
            8 * g,
            8 * g + 1,
            300 * g + 5,
        ] {
            let data = bytes(n, 7);
            let (key, ob) = of(&data);
            assert_eq!(key, Key::of(&data), "key of {n} bytes");
            assert_eq!((key, ob.clone()), oracle(&data), "outboard of {n} bytes");
            assert_eq!(ob.len() as u64, outboard_len(n as u64), "length of {n}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Any split into updates gives the one-shot result.
        #[test]
        fn updates_in_any_pieces_match(n in 0usize..(200 * 1024), cuts in prop::collection::vec(0usize..70_000, 0..8)) {
            let data = bytes(n, 3);
            let mut b = Builder::new();
            let mut rest = &data[..];
            for c in cuts {
                let c = c.min(rest.len());
                b.update(&rest[..c]);
                rest = &rest[c..];
            }
            b.update(rest);
            prop_assert_eq!(b.finish(), oracle(&data));
        }

        /// Every range verifies; a flipped byte inside the groups read is
        /// reported at its group, and one outside them is not seen.
        #[test]
        fn ranges_verify_and_flips_are_found_at_their_group(
            n in 1u64..(300 * 1024), a in 0u64..(300 * 1024), len in 1u64..(80 * 1024), flip in 0u64..(300 * 1024),
        ) {
            let data = bytes(n as usize, 9);
            let (key, ob) = of(&data);
            let start = a % n;
            let end = (start + len).min(n);
            let p = plan(n, start..end);
            prop_assert!(p.data.start <= start && end <= p.data.end);
            let read = &data[p.data.start as usize..p.data.end as usize];
            prop_assert_eq!(check(&key, &p, read, pairs(&ob)), Ok(()));
            let f = flip % n;
            let mut bad = data.clone();
            bad[f as usize] ^= 0x40;
            let read = &bad[p.data.start as usize..p.data.end as usize];
            let got = check(&key, &p, read, pairs(&ob));
            if p.data.contains(&f) {
                prop_assert_eq!(got, Err(Mismatch::Data(f / GROUP * GROUP)));
            } else {
                prop_assert_eq!(got, Ok(()));
            }
        }
    }

    #[test]
    fn a_wrong_or_short_outboard_is_named() {
        let n = 40 * GROUP as usize + 100;
        let data = bytes(n, 1);
        let (key, ob) = of(&data);
        let p = plan(n as u64, 20 * GROUP..20 * GROUP + 10);
        let read = &data[p.data.start as usize..p.data.end as usize];
        for w in p.outboard_windows(0) {
            let mut bad = ob.clone();
            bad[w.start as usize] ^= 1;
            assert!(matches!(
                check(&key, &p, read, pairs(&bad)),
                Err(Mismatch::Outboard(_))
            ));
        }
        let short = &ob[..ob.len() - 64];
        assert!(matches!(
            check(&key, &p, read, pairs(short)),
            Err(Mismatch::Outboard(_))
        ));
        // Another blob's outboard and bytes do not verify under this key.
        let other = bytes(n, 2);
        let (_, other_ob) = of(&other);
        let read = &other[p.data.start as usize..p.data.end as usize];
        assert!(check(&key, &p, read, pairs(&other_ob)).is_err());
    }

    #[test]
    fn an_outboard_validates_against_its_key_alone() {
        for n in [0usize, 100, 16 * 1024, 16 * 1024 + 1, 40 * 16 * 1024 + 7] {
            let data = bytes(n, 5);
            let (key, ob) = of(&data);
            assert!(validate(&key, n as u64, &ob), "{n}");
            if ob.is_empty() {
                continue;
            }
            for i in [0, ob.len() / 2, ob.len() - 1] {
                let mut bad = ob.clone();
                bad[i] ^= 1;
                assert!(!validate(&key, n as u64, &bad), "{n}: byte {i}");
            }
            assert!(!validate(&key, n as u64, &ob[64..]), "{n}: short");
            let (other, other_ob) = of(&bytes(n, 6));
            assert!(!validate(&key, n as u64, &other_ob), "{n}: another blob's");
            assert!(validate(&other, n as u64, &other_ob));
        }
    }

    #[test]
    fn windows_cover_every_needed_pair_and_merge_gaps() {
        let n = 1000 * GROUP;
        let p = plan(n, 500 * GROUP..500 * GROUP + (1 << 20));
        let tight = p.outboard_windows(0);
        let loose = p.outboard_windows(1 << 20);
        assert_eq!(loose.len(), 1);
        assert!(tight.len() > 1);
        for (_, o) in &p.nodes {
            assert!(tight.iter().any(|w| w.start <= *o && o + PAIR <= w.end));
        }
        assert_eq!(p.data, 500 * GROUP..500 * GROUP + (1 << 20));
    }
}
