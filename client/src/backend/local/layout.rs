//! The blob tree's names: shard directories and the keys of a leaf.

use super::*;

pub(super) fn is_shard_name(name: &str) -> bool {
    name.len() == 2
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Sorted shard directory names under `dir` (missing dir = none).
pub(super) fn shard_names(dir: &Path) -> io::Result<Vec<String>> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for e in rd {
        let e = e?;
        if let Some(n) = e.file_name().to_str().filter(|n| is_shard_name(n)) {
            names.push(n.to_owned());
        }
    }
    names.sort_unstable();
    Ok(names)
}

/// Sorted keys whose files sit in the leaf shard `dir` named `prefix`.
pub(super) fn leaf_keys(dir: &Path, prefix: &str) -> io::Result<Vec<Key>> {
    leaf(dir, prefix).map(|(blobs, _)| blobs)
}

/// Sorted keys of the leaf shard `dir` named `prefix` whose outboard file
/// is there but whose blob is not (see `LargeBackend::orphan_outboards`).
pub(super) fn leaf_orphan_outboards(dir: &Path, prefix: &str) -> io::Result<Vec<Key>> {
    let (blobs, outboards) = leaf(dir, prefix)?;
    Ok(outboards
        .into_iter()
        .filter(|k| blobs.binary_search(k).is_err())
        .collect())
}

/// The leaf shard `dir` named `prefix`: its blobs' keys and its outboard
/// files' keys, each sorted.
fn leaf(dir: &Path, prefix: &str) -> io::Result<(Vec<Key>, Vec<Key>)> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
        Err(e) => return Err(e),
    };
    let (mut keys, mut outboards) = (Vec::new(), Vec::new());
    for e in rd {
        let e = e?;
        let name = e.file_name();
        let (stem, list) = match name.to_str() {
            Some(n) => match n.strip_suffix(super::outboard::SUFFIX) {
                Some(stem) => (Some(stem), &mut outboards),
                None => (Some(n), &mut keys),
            },
            None => (None, &mut keys),
        };
        match stem.and_then(|n| Key::parse(n).ok()) {
            // A file in the wrong shard is not where readers look: not listed.
            Some(k) if k.to_hex().starts_with(prefix) => list.push(k),
            _ => tracing::warn!(file = %e.path().display(), "stray file in the blob tree, ignored"),
        }
    }
    keys.sort_unstable();
    outboards.sort_unstable();
    Ok((keys, outboards))
}
