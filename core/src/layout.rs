//! Where a blob lives on disk under a `local` root.
//!
//! `blobs/<hex[0..2]>/<hex>`: one level of 256 shard directories, all
//! created when the root is first opened, so a put never creates (or
//! fsyncs) a directory other than the one it links into. The large tier
//! holds blobs over the kv threshold, so a million of them (64 GiB or more)
//! is about 4,000 files per shard, ten million 40,000 — sizes ext4/XFS
//! hashed directories handle without trouble. The full key as the file name
//! lets an operator find a blob with `ls`. Because the path is built only
//! from a validated [`Key`]'s hex digits, no key can name a path outside the
//! root.

use std::path::PathBuf;

use crate::Key;

/// The shard directory name for `key`, e.g. `"af"`.
pub fn shard_dir(key: &Key) -> String {
    key.to_hex()[0..2].to_owned()
}

/// Every shard directory name, `"00"` to `"ff"`, ascending.
pub fn all_shards() -> impl Iterator<Item = String> {
    (0..=255u8).map(|b| format!("{b:02x}"))
}

/// The path of `key`'s file relative to the `blobs/` directory.
pub fn shard_path(key: &Key) -> PathBuf {
    let hex = key.to_hex();
    let mut p = PathBuf::from(&hex[0..2]);
    p.push(&hex);
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Component;

    #[test]
    fn path_is_one_shard_then_full_hex() {
        let k = Key::of(b"");
        let p = shard_path(&k);
        assert_eq!(p, PathBuf::from("af").join(k.to_hex()));
        assert!(p.components().all(|c| matches!(c, Component::Normal(_))));
        assert_eq!(shard_dir(&k), "af");
        let all: Vec<String> = all_shards().collect();
        assert_eq!(
            (all.len(), all[0].as_str(), all[255].as_str()),
            (256, "00", "ff")
        );
        assert!(all.windows(2).all(|w| w[0] < w[1]));
    }
}
