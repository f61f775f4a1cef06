//! Where an `s3` engine keeps its objects (`s3://bucket/prefix`), and the
//! names under that prefix: blobs, upload markers, the prefix's lease.

use std::fmt;
use std::str::FromStr;

use object_store::path::Path;

use crate::{Error, Key, Result};

/// A bucket and a prefix inside it: `s3://bucket` or `s3://bucket/a/b`.
///
/// The prefix is a `/`-separated list of non-empty parts without `.` or
/// `..`; every object the engine writes lives under it:
///
/// ```text
/// <prefix>/blobs/ab/ab…(64 hex)      committed blobs, never rewritten
/// <prefix>/blobs/ab/ab…(64 hex).gN   the same, generation N > 0: on a
///                                    fleet's prefix, a key recorded again
///                                    after a claimer was handed its
///                                    deletion and may still send it
/// <prefix>/outboards/ab/ab…(64 hex) the blob's BLAKE3 outboard (one for
///                                    all its generations: it is a function
///                                    of the key), if it is over 16 KiB
/// <prefix>/uploads/<random>          a multipart upload in progress: its
///                                    object path and upload id, touched
///                                    while it runs (abandoned ones are
///                                    aborted by a sweep after a grace)
/// <prefix>/alkblobs.lock             the lease of the one process that
///                                    writes the prefix (not on a fleet's
///                                    shared prefix)
/// <prefix>/alkblobs.owner            which store or pool the prefix
///                                    belongs to (written at its first
///                                    writable open, checked at every one)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct S3Location {
    bucket: String,
    prefix: Vec<String>,
}

impl S3Location {
    /// `bucket` with `prefix` (`""` for the bucket's root).
    pub fn new(bucket: &str, prefix: &str) -> Result<S3Location> {
        let bad =
            |why: &str| Error::Config(format!("invalid S3 location s3://{bucket}/{prefix}: {why}"));
        // S3's bucket naming rules (the strict, DNS-compatible ones).
        let b = bucket.as_bytes();
        if !(3..=63).contains(&b.len())
            || !b
                .iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.')
            || !b[0].is_ascii_alphanumeric()
            || !b[b.len() - 1].is_ascii_alphanumeric()
        {
            return Err(bad(
                "a bucket name is 3 to 63 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit",
            ));
        }
        let mut parts = Vec::new();
        for part in prefix.split('/') {
            match part {
                "" => continue, // leading, trailing or doubled '/'
                "." | ".." => return Err(bad("a prefix part may not be '.' or '..'")),
                // S3's safe characters (what every service and every
                // shell takes without escaping; the database's
                // pools.large_location checks the same).
                p if !p
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "!-_.*'()".contains(c)) =>
                {
                    return Err(bad(
                        "a prefix part is letters, digits and !-_.*'() (S3's safe characters)",
                    ));
                }
                p => parts.push(p.to_owned()),
            }
        }
        if parts.iter().map(|p| p.len() + 1).sum::<usize>() > 512 {
            return Err(bad("the prefix is longer than 512 bytes"));
        }
        Ok(S3Location {
            bucket: bucket.to_owned(),
            prefix: parts,
        })
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The prefix, without leading or trailing `/` (`""` for none).
    pub fn prefix(&self) -> String {
        self.prefix.join("/")
    }

    fn path(&self, tail: &[&str]) -> Path {
        Path::from_iter(
            self.prefix
                .iter()
                .map(String::as_str)
                .chain(tail.iter().copied()),
        )
    }

    /// Where the blob of `key` lives (generation 0).
    pub(super) fn blob(&self, key: &Key) -> Path {
        self.blob_generation(key, 0)
    }

    /// Where generation `generation` of the blob of `key` lives: the
    /// key's own name for 0, with a `.gN` suffix for N > 0.
    pub(super) fn blob_generation(&self, key: &Key, generation: u64) -> Path {
        let hex = key.to_string();
        if generation == 0 {
            self.path(&["blobs", &hex[..2], &hex])
        } else {
            self.path(&["blobs", &hex[..2], &format!("{hex}.g{generation}")])
        }
    }

    /// Where the outboard of `key` lives.
    pub(super) fn outboard(&self, key: &Key) -> Path {
        let hex = key.to_string();
        self.path(&["outboards", &hex[..2], &hex])
    }

    /// The key whose outboard `path` is, if it is exactly this location's
    /// outboard path for a key (not an object of a nested prefix).
    pub(super) fn outboard_key_of(&self, path: &Path) -> Option<Key> {
        let key: Key = path.filename()?.parse().ok()?;
        (*path == self.outboard(&key)).then_some(key)
    }

    /// The prefix every outboard lives under.
    pub(super) fn outboards(&self) -> Path {
        self.path(&["outboards"])
    }

    /// The directory of `key`'s shard (its first byte).
    pub(super) fn shard(&self, key: &Key) -> Path {
        let hex = key.to_string();
        self.path(&["blobs", &hex[..2]])
    }

    /// The prefix every blob lives under.
    pub(super) fn blobs(&self) -> Path {
        self.path(&["blobs"])
    }

    /// The marker of an upload in progress.
    pub(super) fn upload_marker(&self, id: &str) -> Path {
        self.path(&["uploads", id])
    }

    /// The prefix every upload marker lives under.
    pub(super) fn uploads(&self) -> Path {
        self.path(&["uploads"])
    }

    /// The prefix's lease object.
    pub(super) fn lease(&self) -> Path {
        self.path(&["alkblobs.lock"])
    }

    /// The object naming the store or pool the prefix belongs to.
    pub(super) fn owner(&self) -> Path {
        self.path(&["alkblobs.owner"])
    }

    /// A scratch object whose last-modified time is the server's clock.
    pub(super) fn clock(&self) -> Path {
        self.path(&["alkblobs.clock"])
    }

    /// The key and generation a blob object's path names, if it is one.
    pub(super) fn key_of(&self, path: &Path) -> Option<(Key, u64)> {
        let mut parts = path.parts();
        let name = parts.next_back()?;
        let shard = parts.next_back()?;
        let (name, shard) = (name.as_ref(), shard.as_ref());
        let (hex, generation) = match name.split_once(".g") {
            None => (name, 0),
            // A canonical number above 0 (no sign, no leading zero).
            Some((hex, g)) if !g.starts_with('0') && g.bytes().all(|b| b.is_ascii_digit()) => {
                (hex, g.parse().ok()?)
            }
            Some(_) => return None,
        };
        let key: Key = hex.parse().ok()?;
        // Exactly this location's path for the key: a listing is recursive,
        // so another store's prefix nested in this one (`p/blobs/…` under
        // `p`) must not pass for this store's blobs.
        (hex.len() == 64 && shard.len() == 2 && *path == self.blob_generation(&key, generation))
            .then_some((key, generation))
    }

    /// Whether `path` is one of this location's upload markers: a direct
    /// child of `uploads/` named by 32 hex digits (never an object of a
    /// prefix nested below this one).
    pub(super) fn is_marker(&self, path: &Path) -> bool {
        let Some(name) = path.filename() else {
            return false;
        };
        name.len() == 32
            && name.bytes().all(|b| b.is_ascii_hexdigit())
            && *path == self.upload_marker(name)
    }
}

impl fmt::Display for S3Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}", self.bucket)?;
        if !self.prefix.is_empty() {
            write!(f, "/{}", self.prefix.join("/"))?;
        }
        Ok(())
    }
}

impl FromStr for S3Location {
    type Err = Error;

    /// `s3://bucket` or `s3://bucket/prefix`.
    fn from_str(s: &str) -> Result<S3Location> {
        let rest = s.strip_prefix("s3://").ok_or_else(|| {
            Error::Config(format!(
                "an S3 location is s3://bucket or s3://bucket/prefix, got {s:?}"
            ))
        })?;
        if rest.contains(['?', '#', '@']) {
            // Credentials and options never travel in the location: they
            // come from the AWS environment and configuration files.
            return Err(Error::Config(
                "an S3 location is s3://bucket/prefix only: credentials, endpoint and region come from the AWS environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, AWS_REGION, AWS_PROFILE) or ~/.aws/ files".into(),
            ));
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        S3Location::new(bucket, prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_and_name_their_objects() {
        let l: S3Location = "s3://my-bucket/a/b/".parse().unwrap();
        assert_eq!(l.bucket(), "my-bucket");
        assert_eq!(l.prefix(), "a/b");
        assert_eq!(l.to_string(), "s3://my-bucket/a/b");
        let k = Key::of(b"x");
        let hex = k.to_string();
        let p = l.blob(&k);
        assert_eq!(p.as_ref(), format!("a/b/blobs/{}/{hex}", &hex[..2]));
        assert_eq!(l.key_of(&p), Some((k, 0)));
        assert_eq!(l.key_of(&l.lease()), None);
        let g = l.blob_generation(&k, 12);
        assert_eq!(g.as_ref(), format!("a/b/blobs/{}/{hex}.g12", &hex[..2]));
        assert_eq!(l.key_of(&g), Some((k, 12)));
        for bad in [".g0", ".g012", ".g", ".g-1", ".gx", ".h1"] {
            let odd = Path::from(format!("a/b/blobs/{}/{hex}{bad}", &hex[..2]));
            assert_eq!(l.key_of(&odd), None, "{bad}");
        }
        let root: S3Location = "s3://bucket".parse().unwrap();
        assert_eq!(root.prefix(), "");
        assert_eq!(root.blobs().as_ref(), "blobs");
    }

    #[test]
    fn bad_locations_are_refused() {
        for bad in [
            "bucket/x",
            "s3://",
            "s3://ab",
            "s3://Bucket",
            "s3://-bucket",
            "s3://bucket/../x",
            "s3://bucket/a/./b",
            "s3://user:secret@bucket/x",
            "s3://bucket/x?region=y",
        ] {
            assert!(
                matches!(bad.parse::<S3Location>(), Err(Error::Config(_))),
                "{bad}"
            );
        }
    }
}
