//! Presets: the functions that build a whole store — engines and the
//! arbiter that fits them — for one topology. This is where each topology's
//! pairing lives: the embedded default pairs SQLite's durable tables with
//! the single-node arbiter here; `open_postgres` (single-instance
//! PostgreSQL) and `open_fleet` (the fleet arbiter over the extension) go
//! beside it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{DEFAULT_THRESHOLD, Store};
use crate::arbiter::DEFAULT_WINDOW;
use crate::backend::local::{LocalBackend, LocalOptions};
use crate::backend::sqlite::{SqliteBackend, SqliteOptions};
use crate::backend::{Durability, OpenMode};
use crate::{Error, Result};

/// Options for [`Store::open_dir_with`]: a builder, so fields can be added
/// without breaking callers.
///
/// ```
/// use std::time::Duration;
/// let opts = alkblobs::DirOptions::new()
///     .relaxed()                                  // survive crashes, not power cuts
///     .threshold(128 * 1024)
///     .delete_window(Duration::from_secs(60));
/// # let _ = opts;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DirOptions {
    /// Write (with the instance lock), wait for the lock, or read-only.
    pub mode: OpenMode,
    /// Durable (default) or relaxed.
    pub durability: Durability,
    /// The kv threshold.
    pub threshold: u64,
    /// The delete window.
    pub window: Duration,
    /// Point reads of the kv engine on the calling task (default `true`;
    /// see [`SqliteOptions::inline_reads`]).
    pub inline_reads: bool,
    /// The large tier on S3 instead of `dir/large` (feature `s3`).
    #[cfg(feature = "s3")]
    pub s3: Option<crate::backend::s3::S3Options>,
}

impl Default for DirOptions {
    fn default() -> Self {
        DirOptions {
            mode: OpenMode::Write,
            durability: Durability::Durable,
            threshold: DEFAULT_THRESHOLD,
            window: DEFAULT_WINDOW,
            inline_reads: true,
            #[cfg(feature = "s3")]
            s3: None,
        }
    }
}

impl DirOptions {
    /// The defaults: writable (fail at once if another process holds the
    /// store), durable, [`DEFAULT_THRESHOLD`], a 5-minute delete window.
    pub fn new() -> DirOptions {
        DirOptions::default()
    }

    /// How to open: write, wait for the instance lock, or read-only.
    pub fn mode(mut self, mode: OpenMode) -> Self {
        self.mode = mode;
        self
    }

    /// Opens read-only: no lock, every write refused.
    pub fn read_only(self) -> Self {
        self.mode(OpenMode::ReadOnly)
    }

    /// Waits for another process to release the store instead of failing.
    pub fn wait_for_lock(self) -> Self {
        self.mode(OpenMode::WriteWait)
    }

    /// Durability of writes.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// [`Durability::Relaxed`]: a returned put survives a process crash but
    /// may be lost (never torn) on a power cut. Much faster for small puts.
    pub fn relaxed(self) -> Self {
        self.durability(Durability::Relaxed)
    }

    /// The kv threshold in bytes.
    pub fn threshold(mut self, bytes: u64) -> Self {
        self.threshold = bytes;
        self
    }

    /// The store's delete window.
    pub fn delete_window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Whether the kv engine's point reads (small gets, `has`, `stat`, small
    /// ranges) run on the calling async task (default `true`) or on a
    /// blocking thread; turn off when the index is much larger than memory.
    /// No effect on a read-only open, which never reads inline. See
    /// [`SqliteOptions::inline_reads`].
    pub fn inline_reads(mut self, inline: bool) -> Self {
        self.inline_reads = inline;
        self
    }

    /// Keeps large content on S3 (these options; their mode is this
    /// open's) instead of in `dir/large`. A store keeps the large tier it
    /// was created with: `dir/large-tier` records it, and an open that
    /// names another fails with [`Error::Config`].
    #[cfg(feature = "s3")]
    pub fn large_s3(mut self, opts: crate::backend::s3::S3Options) -> Self {
        self.s3 = Some(opts);
        self
    }
}

fn marker_err(path: &Path, e: std::io::Error) -> Error {
    Error::Config(format!(
        "cannot record the store's large tier in {}: {e}",
        path.display()
    ))
}

/// The large tier a store directory was created with (`dir/large-tier`:
/// `local`, or an `s3://bucket/prefix`), checked against `declared`.
/// Returns whether the directory has no record yet (the open records it
/// once its engines opened).
fn check_large_tier(dir: &Path, declared: &str) -> Result<bool> {
    let marker = dir.join("large-tier");
    let recorded = match std::fs::read_to_string(&marker) {
        Ok(text) => return same_tier(dir, text.trim(), declared).map(|()| false),
        // Absent, or unreadable (a directory that cannot exist, no
        // permission): the engines' own opens report that, classified.
        Err(_) => None,
    };
    // Stores made before the record keep their large tier in dir/large.
    let recorded = recorded.or_else(|| Store::dir_paths(dir).0.exists().then_some("local"));
    if let Some(r) = recorded {
        same_tier(dir, r, declared)?;
    }
    Ok(true)
}

fn same_tier(dir: &Path, recorded: &str, declared: &str) -> Result<()> {
    if recorded == declared {
        return Ok(());
    }
    Err(Error::Config(format!(
        "the store in {} keeps large content in {recorded}, not {declared}: open it with that large tier (--large {recorded})",
        dir.display()
    )))
}

/// This store directory's id (`dir/store-id`, made at its first
/// writable s3 open): what it records as the owner of its S3 prefix.
#[cfg(feature = "s3")]
fn store_id(dir: &Path) -> Result<String> {
    let path = dir.join("store-id");
    if let Ok(text) = std::fs::read_to_string(&path)
        && let Some(id) = text.lines().next().filter(|l| !l.is_empty())
    {
        return Ok(id.to_owned());
    }
    let id = format!("{:032x}", rand::random::<u128>());
    // Written whole, then renamed: a crash never leaves an empty id (which
    // the next open would replace, and the prefix then refuse).
    let tmp = dir.join("store-id.tmp");
    std::fs::write(&tmp, format!("{id}\n"))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| marker_err(&path, e))?;
    Ok(id)
}

fn record_large_tier(dir: &Path, declared: &str) -> Result<()> {
    let marker = dir.join("large-tier");
    std::fs::write(&marker, format!("{declared}\n")).map_err(|e| marker_err(&marker, e))
}

impl Store {
    /// Opens the embedded default under `dir`: sqlite kv at
    /// `dir/index.sqlite`, `local` large tier at `dir/large`, durable, with
    /// the instance locks taken, and the single-node arbiter keeping its
    /// staged rows and roots in the same SQLite database.
    pub async fn open_dir(dir: impl AsRef<Path>) -> Result<Store> {
        Store::open_dir_with(dir, DirOptions::default()).await
    }

    /// [`Store::open_dir`] with options.
    pub async fn open_dir_with(dir: impl AsRef<Path>, opts: DirOptions) -> Result<Store> {
        let dir = dir.as_ref();
        let (sqlite, local) = Store::dir_paths(dir);
        #[cfg(feature = "s3")]
        let declared = opts
            .s3
            .as_ref()
            .map_or_else(|| "local".to_owned(), |o| o.location.to_string());
        #[cfg(not(feature = "s3"))]
        let declared = "local".to_owned();
        let mut unrecorded = check_large_tier(dir, &declared)?;
        // A new store records its large tier as soon as its directory
        // exists, before the large engine opens: an open that then fails
        // (a missing bucket, a prefix another store owns) must not leave
        // an index that later opens take for a local store's.
        let fresh = unrecorded && opts.mode.writable() && !sqlite.exists();
        let kv = SqliteBackend::open(
            sqlite,
            SqliteOptions {
                durability: opts.durability,
                mode: opts.mode,
                inline_reads: opts.inline_reads,
                ..SqliteOptions::default()
            },
        )
        .await?;
        if fresh {
            record_large_tier(dir, &declared)?;
            unrecorded = false;
        }
        let builder = Store::builder().sqlite(kv);
        #[cfg(feature = "s3")]
        let builder = match opts.s3 {
            Some(s3) => {
                let mut s3 = s3.mode(opts.mode).shared(false);
                if opts.mode.writable() {
                    s3 = s3.owner(format!("embedded store {}", store_id(dir)?));
                }
                let store = builder
                    .large(crate::backend::s3::S3Backend::open(s3).await?)
                    .threshold(opts.threshold)
                    .delete_window(opts.window)
                    .build()?;
                if unrecorded && opts.mode.writable() {
                    record_large_tier(dir, &declared)?;
                }
                return Ok(store);
            }
            None => builder,
        };
        let large = LocalBackend::open(
            local,
            LocalOptions {
                durability: opts.durability,
                mode: opts.mode,
                ..LocalOptions::default()
            },
        )
        .await?;
        let store = builder
            .large(large)
            .threshold(opts.threshold)
            .delete_window(opts.window)
            .build()?;
        if unrecorded && opts.mode.writable() {
            record_large_tier(dir, &declared)?;
        }
        Ok(store)
    }

    /// The sqlite file and the local root of the embedded layout in `dir`.
    pub fn dir_paths(dir: &Path) -> (PathBuf, PathBuf) {
        (dir.join("index.sqlite"), dir.join("large"))
    }
}
