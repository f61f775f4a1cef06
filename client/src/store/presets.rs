//! Presets: the functions that build a whole store — engines and the
//! arbiter that fits them — for one topology. This is where each topology's
//! pairing lives: the embedded default pairs SQLite's durable tables with
//! the single-node arbiter here; `open_postgres` (single-instance
//! PostgreSQL) and `open_fleet` (the fleet arbiter over the extension) go
//! beside it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{DEFAULT_THRESHOLD, Store};
use crate::Result;
use crate::arbiter::DEFAULT_WINDOW;
use crate::backend::local::{LocalBackend, LocalOptions};
use crate::backend::sqlite::{SqliteBackend, SqliteOptions};
use crate::backend::{Durability, OpenMode};

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
}

impl Default for DirOptions {
    fn default() -> Self {
        DirOptions {
            mode: OpenMode::Write,
            durability: Durability::Durable,
            threshold: DEFAULT_THRESHOLD,
            window: DEFAULT_WINDOW,
            inline_reads: true,
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
        let large = LocalBackend::open(
            local,
            LocalOptions {
                durability: opts.durability,
                mode: opts.mode,
                ..LocalOptions::default()
            },
        )
        .await?;
        Store::builder()
            .sqlite(kv)
            .large(large)
            .threshold(opts.threshold)
            .delete_window(opts.window)
            .build()
    }

    /// The sqlite file and the local root of the embedded layout in `dir`.
    pub fn dir_paths(dir: &Path) -> (PathBuf, PathBuf) {
        (dir.join("index.sqlite"), dir.join("large"))
    }
}
