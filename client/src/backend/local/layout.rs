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
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut keys = Vec::new();
    for e in rd {
        let e = e?;
        let name = e.file_name();
        if name
            .to_str()
            .is_some_and(|n| n.ends_with(super::outboard::SUFFIX))
        {
            continue;
        }
        match name.to_str().and_then(|n| Key::parse(n).ok()) {
            // A file in the wrong shard is not where readers look: not listed.
            Some(k) if k.to_hex().starts_with(prefix) => keys.push(k),
            _ => tracing::warn!(file = %e.path().display(), "stray file in the blob tree, ignored"),
        }
    }
    keys.sort_unstable();
    Ok(keys)
}
