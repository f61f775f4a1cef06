//! Where a blob lives on disk under a `local` root.
//!
//! `blobs/<hex[0..2]>/<hex[2..4]>/<hex>`: two levels of 256 shards keep any
//! one directory small (about 15 files per directory at a million blobs,
//! 1,500 at a hundred million) and the full key as the file name lets an
//! operator find a blob with `ls`. Because the path is built only from a
//! validated [`Key`]'s hex digits, no key can name a path outside the root.

use std::path::PathBuf;

use crate::Key;

/// The two shard directory names for `key`, e.g. `("af", "13")`.
pub fn shard_dirs(key: &Key) -> (String, String) {
    let hex = key.to_hex();
    (hex[0..2].to_owned(), hex[2..4].to_owned())
}

/// The path of `key`'s file relative to the `blobs/` directory.
pub fn shard_path(key: &Key) -> PathBuf {
    let hex = key.to_hex();
    let mut p = PathBuf::from(&hex[0..2]);
    p.push(&hex[2..4]);
    p.push(&hex);
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Component;

    #[test]
    fn path_is_two_shards_then_full_hex() {
        let k = Key::of(b"");
        let p = shard_path(&k);
        assert_eq!(p, PathBuf::from("af/13").join(k.to_hex()));
        assert!(p.components().all(|c| matches!(c, Component::Normal(_))));
        assert_eq!(shard_dirs(&k), ("af".into(), "13".into()));
    }
}
