//! `sqlite`: the embedded kv engine (rusqlite, WAL).
//!
//! This file: the engine's state, options, opening and closing, the
//! statements of a put and a delete, and the companion seam (long because
//! opening and closing a WAL database in the right order is). Elsewhere:
//! `readers.rs` (pooled readers and kept snapshots), `group_commit.rs`
//! (durable puts committed together), `checkpointer.rs` (checkpoints off
//! the write path), `engine.rs` (the `Backend` contract), `tests.rs`.
//!
//! # Schema
//!
//! ```sql
//! entries (key BLOB PRIMARY KEY, size INTEGER, vid INTEGER) WITHOUT ROWID
//! vals    (vid INTEGER PRIMARY KEY, value BLOB)
//! ```
//!
//! Entries and values are split so that every probe the contract calls cheap
//! (`has`, `size`, `list`, usage) reads only the small `entries` b-tree —
//! about 50 bytes a row — and never a page of value bytes. `WITHOUT ROWID`
//! suits `entries` because its rows are tiny; values stay in a rowid table
//! (SQLite's guidance: keep `WITHOUT ROWID` rows under ~1/20 of a page).
//!
//! The engine creates and knows only these two tables. A companion may keep
//! its own in the same database — the single-node arbiter keeps its staged
//! candidates and roots there (`arbiter/single/sqlite_tables.rs`) — through
//! a public seam: [`SqliteBackend::install_put_hook`] runs its DDL and gives
//! the engine one statement to run for each put key inside the put's own
//! transaction (the arbiter's: delete the key's staged row, so a re-put key
//! gets a fresh delete window atomically with the put), and
//! [`SqliteBackend::companion_write`] / [`SqliteBackend::companion_read`]
//! run its own statements in the engine's order and snapshot rules.
//!
//! # Concurrency
//!
//! One writer connection behind a mutex and a pool of read-only connections;
//! WAL lets readers run beside the writer. Blocking SQLite calls run through
//! `blocking`: `block_in_place` on a multi-threaded runtime (the worker hands
//! its other tasks away first), the blocking pool otherwise. A writable open
//! takes the instance lock `<db stem>.lock` beside the database — for the
//! embedded default, `index.lock` (see [`OpenMode`]).
//!
//! A pooled reader keeps its read transaction open between reads while
//! nothing is written. A generation counter is bumped as every write starts
//! (to odd) and again when it has finished (to even): its commit, SQLite's
//! inline checkpoint, and any answers sent inside it; callers answered after
//! it are answered after the bump. A read reuses its
//! reader's transaction only if it was begun at the current, even
//! generation; while a write runs, reads take a snapshot each as before.
//! So a read never sees less than a write answered before it began, and no
//! kept snapshot dates from inside a write. Beginning and ending a read
//! transaction takes SQLite's shared-memory lock, one mutex for every
//! connection of the process: a third of a 16-task read workload here.
//! Idle readers' transactions are ended as each write starts, so they never
//! hold back its checkpoint or the WAL's restart. Read-only opens (another
//! process writes) take a snapshot per read. The instance lock makes this
//! process the only writer; a foreign writer on the file while the store is
//! open (`sqlite3` by hand) is not seen by kept snapshots until this
//! process writes.
//!
//! Point reads (`get`, `has`, `size`, and `get` or `get_range` of at most
//! 256 KiB) run on the calling task, spending its tokio scheduling budget,
//! unless [`SqliteOptions::inline_reads`] is off or the open is read-only.
//!
//! # Closing
//!
//! [`Backend::close`] checkpoints the WAL into the database and closes every
//! connection, so `-wal` and `-shm` are removed. Dropping the last handle
//! closes the readers before the writer for the same effect: SQLite removes
//! the WAL only when the last connection to close can write.

mod checkpointer;
mod engine;
mod group_commit;
mod readers;
mod space;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use super::{
    Backend, DiskSpace, Durability, InstanceLock, KeyStream, OpenMode, PutOutcome, Sharing,
    blocking,
};
use crate::{Error, Key, Result};
use checkpointer::{
    CHECKPOINT_BACKSTOP_PAGES, CHECKPOINT_PAGES, Checkpointer, WAL_PAGES, note_wal_pages,
};
use group_commit::Group;
use readers::Reader;

/// The largest value a point read copies on the calling task (see
/// [`SqliteOptions::inline_reads`]); larger ones are read on a blocking
/// thread.
const INLINE_VALUE_MAX: i64 = 256 * 1024;

/// The writer connection's page cache, in KiB (negative: SQLite's unit).
const WRITER_CACHE_KIB: i64 = -65536;

/// Keys fetched per `list` page.
const LIST_PAGE: i64 = 4096;

/// The engine's own tables; anything else in the database is a
/// companion's (see [`PutHook`]).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS entries (
    key   BLOB PRIMARY KEY CHECK (length(key) = 32),
    size  INTEGER NOT NULL,
    vid   INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS vals (
    vid   INTEGER PRIMARY KEY,
    value BLOB NOT NULL
);
PRAGMA user_version = 1;
";

/// A statement a companion of the engine — a component keeping its own
/// tables in the engine's database, as the single-node arbiter keeps its
/// staged candidates and roots — has the engine run for each put key inside
/// that put's own transaction, with the key as `?1`. The engine knows
/// nothing of what it means; it runs it only while the companion says it
/// may change something ([`Companion::set_hook_active`]). Installed with
/// [`SqliteBackend::install_put_hook`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutHook {
    /// One statement, one parameter: the put's key.
    pub on_put: &'static str,
}

/// The writer connection lent to a companion for its own statements
/// ([`SqliteBackend::companion_write`]), in the order of the engine's own
/// writes.
pub struct Companion<'a> {
    w: &'a mut Writer,
}

impl Companion<'_> {
    /// The writer connection (the companion's own tables only).
    pub fn conn(&mut self) -> &mut Connection {
        &mut self.w.conn
    }

    /// Whether puts run the installed [`PutHook`] from now on. Turn it on
    /// before the rows the hook acts on exist (a put racing the write then
    /// finds them), off only when a statement in this write has shown that
    /// there are none.
    pub fn set_hook_active(&mut self, on: bool) {
        self.w.hook_active = on;
    }

    /// Whether puts run the hook now.
    pub fn hook_active(&self) -> bool {
        self.w.hook_active
    }
}

/// Options for [`SqliteBackend::open`]; build with
/// `SqliteOptions::default().durability(..).mode(..)`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SqliteOptions {
    /// `Durable` (default): `synchronous=FULL`. `Relaxed`: `NORMAL`.
    pub durability: Durability,
    /// Write (with the instance lock) or read-only.
    pub mode: OpenMode,
    /// How long a statement waits for another connection's lock before
    /// failing (default 5 s).
    pub busy_timeout: Duration,
    /// Point reads (`get`, `has`, `size`, `get_range`) on the calling async
    /// task instead of a blocking thread (default on; writable opens only).
    /// See [`SqliteOptions::inline_reads`].
    pub inline_reads: bool,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            durability: Durability::Durable,
            mode: OpenMode::Write,
            busy_timeout: Duration::from_secs(5),
            inline_reads: true,
        }
    }
}

impl SqliteOptions {
    /// Durability of commits.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Write, wait for the instance lock, or read-only.
    pub fn mode(mut self, mode: OpenMode) -> Self {
        self.mode = mode;
        self
    }

    /// How long a statement waits for another connection's lock.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Whether point reads (`has`, `size`, `get` of a value of at most
    /// 256 KiB, `get_range` asking for at most 256 KiB; larger ones are read
    /// on a blocking thread) run on the calling async task (default `true`)
    /// or go through a blocking thread like every other statement. From the
    /// page cache such a read takes a few microseconds, less than handing
    /// the async worker to another thread: with 16 tasks reading 1 KiB
    /// values, 330k → 600k gets/s in a probe here (`docs/design.md` §2
    /// sqlite; the peer benchmark in `docs/benchmarks.md`). Each inline
    /// read spends the task's tokio scheduling budget, so a loop of them
    /// still yields. A read that faults pages in from disk holds the worker
    /// for that long, as does SQLite's busy wait in the rare cases a WAL
    /// reader waits (another process recovering the WAL after a crash,
    /// up to the busy timeout), so turn this off when the database is much
    /// larger than memory. Read-only opens (another process writes) never
    /// read inline.
    pub fn inline_reads(mut self, inline: bool) -> Self {
        self.inline_reads = inline;
        self
    }
}

/// What went wrong inside the sqlite engine, named for the failed action.
#[derive(Debug, thiserror::Error)]
enum SqliteError {
    #[error("unable to open the database at {path}: {source}")]
    UnableToOpen {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error(
        "unable to {action}: the database is locked by another connection or process and stayed locked for {waited:?}; close the other user of the file (or raise the busy timeout) and retry"
    )]
    Locked {
        action: &'static str,
        waited: Duration,
        source: rusqlite::Error,
    },
    #[error("unable to {action}: {source}")]
    Statement {
        action: &'static str,
        source: rusqlite::Error,
    },
    #[error("no alkblobs database at {0} (schema missing); open it for writing once to create it")]
    NoSchema(PathBuf),
}

/// The sqlite kv engine. Cloning shares the connections.
#[derive(Clone)]
pub struct SqliteBackend {
    inner: Arc<Inner>,
}

// Field order is drop order: readers close before the writer, so the last
// connection to close can checkpoint and remove the WAL; the instance lock
// is released last.
pub(crate) struct Inner {
    path: PathBuf,
    pub(crate) display: String,
    opts: SqliteOptions,
    readers: Mutex<Vec<Reader>>,
    /// Odd while a write runs, bumped as each starts and ends; see
    /// "Concurrency".
    generation: std::sync::atomic::AtomicU64,
    closed: std::sync::atomic::AtomicBool,
    /// Durable puts waiting for the next group commit (see `put`).
    group: Mutex<Group>,
    /// Closed before the writer (see the field order note above).
    checkpointer: Mutex<Option<Checkpointer>>,
    writer: Option<Mutex<Option<Writer>>>,
    /// The instance lock; released by `close` (or on drop).
    lock: Mutex<Option<InstanceLock>>,
}

/// The writer connection and the state only the writer touches. One
/// instance writes a database (the instance lock), so this state is exact.
pub(crate) struct Writer {
    conn: Connection,
    /// The next `vals.vid` to hand out.
    next_vid: i64,
    /// A companion's statement run in every put transaction while
    /// `hook_active` (see [`PutHook`]).
    hook: Option<PutHook>,
    hook_active: bool,
    /// The WAL size (pages) at the last checkpoint request.
    wal_requested: i32,
}

/// Holds the generation odd while a write runs (see "Concurrency"): from
/// before its first statement until after everything it does, including
/// SQLite's inline checkpoint and answers sent inside it (a background
/// leader answers after it, so after the generation is even again). Even
/// again when dropped, also on a panic.
struct Writing<'a>(&'a std::sync::atomic::AtomicU64);

impl<'a> Writing<'a> {
    fn start(generation: &'a std::sync::atomic::AtomicU64) -> Self {
        generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Writing(generation)
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Writer {
    /// The statement puts run now, if any.
    fn put_hook(&self) -> Option<&'static str> {
        self.hook.filter(|_| self.hook_active).map(|h| h.on_put)
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

pub(crate) fn key_param(k: &Key) -> &[u8] {
    k.as_bytes()
}

pub(crate) fn after_param(after: Option<Key>) -> Vec<u8> {
    // The empty blob sorts before every 32-byte key.
    after.map(|k| k.as_bytes().to_vec()).unwrap_or_default()
}

pub(crate) fn key_from_row(bytes: Vec<u8>) -> rusqlite::Result<Key> {
    Key::from_slice(&bytes).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Blob, Box::new(e))
    })
}

impl Inner {
    pub(crate) fn fail(&self, action: &'static str, e: rusqlite::Error) -> Error {
        let err = if is_busy(&e) {
            SqliteError::Locked {
                action,
                waited: self.opts.busy_timeout,
                source: e,
            }
        } else {
            SqliteError::Statement { action, source: e }
        };
        Error::engine(&self.display, err)
    }

    /// A write on the writer connection, run on the calling thread: the
    /// generation is odd throughout (see "Concurrency"), idle readers'
    /// snapshots are ended first, and a checkpoint is requested (relaxed)
    /// or run (the backstop) after, as the WAL grows.
    fn write_locked<T>(
        &self,
        action: &'static str,
        f: impl FnOnce(&mut Writer) -> rusqlite::Result<T>,
    ) -> Result<T> {
        let Some(writer) = self.writer.as_ref() else {
            return Err(Error::ReadOnly {
                engine: self.display.clone(),
                action,
            });
        };
        let mut slot = writer.lock().unwrap_or_else(|p| p.into_inner());
        let Some(w) = slot.as_mut() else {
            return Err(Error::engine(
                &self.display,
                format!("unable to {action}: the engine was closed"),
            ));
        };
        WAL_PAGES.with(|c| c.set(0));
        // Odd from here until this function returns: no snapshot taken
        // meanwhile is kept, and every older one is stale after.
        let _writing = Writing::start(&self.generation);
        self.end_idle_snapshots();
        let r = f(w);
        let pages = WAL_PAGES.with(|c| c.replace(0));
        if pages > 0 && pages < w.wal_requested {
            // The log was reset (a checkpoint completed): count afresh.
            w.wal_requested = 0;
        }
        if pages >= CHECKPOINT_BACKSTOP_PAGES {
            let _ = w
                .conn
                .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
        } else if pages >= w.wal_requested + CHECKPOINT_PAGES
            && let Some(c) = self
                .checkpointer
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
        {
            w.wal_requested = pages;
            c.wake();
        }
        r.map_err(|e| self.fail(action, e))
    }

    /// Checkpoints and closes every connection; see the module docs.
    fn close(&self) -> Result<()> {
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        self.readers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        if let Some(c) = self
            .checkpointer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            drop(c);
        }
        let Some(writer) = &self.writer else {
            return Ok(());
        };
        let mut slot = writer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = slot.take() {
            w.conn
                .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
                .map_err(|e| self.fail("checkpoint the WAL", e))?;
            w.conn
                .close()
                .map_err(|(_, e)| self.fail("close the database", e))?;
        }
        // Every connection is closed: another process may take the store.
        self.lock.lock().unwrap_or_else(|p| p.into_inner()).take();
        Ok(())
    }
}

impl SqliteBackend {
    /// Opens (creating if needed, unless read-only) the database at `path`.
    ///
    /// A writable open takes the instance lock: `path` with its extension
    /// replaced by `lock` (`index.sqlite` → `index.lock`); a second
    /// writer process gets [`Error::InUse`] (or waits, with
    /// [`OpenMode::WriteWait`]).
    pub async fn open(path: impl AsRef<Path>, opts: SqliteOptions) -> Result<SqliteBackend> {
        let path = path.as_ref().to_owned();
        let display = format!("sqlite({})", path.display());
        let d = display.clone();
        blocking(&d.clone(), move || Self::open_blocking(path, display, opts))
            .await
            .map_err(|e| match e {
                Error::Engine { .. } | Error::InUse { .. } => e,
                other => Error::engine(d, other.to_string()),
            })
    }

    fn open_blocking(path: PathBuf, display: String, opts: SqliteOptions) -> Result<SqliteBackend> {
        let unable = |source| {
            Error::engine(
                &display,
                SqliteError::UnableToOpen {
                    path: path.clone(),
                    source,
                },
            )
        };
        let (writer, lock, checkpointer) = if opts.mode.writable() {
            let lock_path = path.with_extension("lock");
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|e| {
                    Error::engine(
                        &display,
                        format!("unable to create directory {}: {e}", parent.display()),
                    )
                })?;
            }
            let lock = InstanceLock::acquire(&lock_path, opts.mode.wait(), &display)?;
            let conn = Connection::open_with_flags(
                &path,
                OpenFlags::SQLITE_OPEN_READ_WRITE
                    | OpenFlags::SQLITE_OPEN_CREATE
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(unable)?;
            conn.busy_timeout(opts.busy_timeout).map_err(unable)?;
            // Before WAL mode (which writes the header of a new database):
            // a new database frees deleted pages (see `space`); an older one
            // keeps its mode until compacted.
            conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
                .map_err(unable)?;
            // A log grown by a large batch is cut back after its checkpoint.
            conn.pragma_update(None, "journal_size_limit", 64i64 << 20)
                .map_err(unable)?;
            let mode: String = conn
                .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
                .map_err(unable)?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(Error::engine(
                    &display,
                    format!("the database refused WAL mode (journal_mode is {mode})"),
                ));
            }
            let sync = match opts.durability {
                Durability::Durable => "FULL",
                Durability::Relaxed => "NORMAL",
            };
            conn.pragma_update(None, "synchronous", sync)
                .map_err(unable)?;
            // A batch of puts lands on leaves all over the key-ordered
            // `entries` b-tree: a cache that holds its interior pages and
            // most leaves keeps a large store's puts from reading pages
            // back (SQLite's default is 2 MiB; at most this is used).
            conn.pragma_update(None, "cache_size", WRITER_CACHE_KIB)
                .map_err(unable)?;
            conn.execute_batch(SCHEMA).map_err(unable)?;
            // Relaxed: checkpoints move to the checkpointer thread (this
            // replaces SQLite's inline autocheckpoint on this connection).
            // Durable commits keep SQLite's own: a checkpoint's fsyncs
            // running beside theirs made them twice as slow here.
            let relaxed = opts.durability == Durability::Relaxed;
            if relaxed {
                conn.wal_hook(Some(note_wal_pages));
            }
            let next_vid: i64 = conn
                .query_row("SELECT coalesce(max(vid), 0) + 1 FROM vals", [], |r| {
                    r.get(0)
                })
                .map_err(unable)?;
            let w = Writer {
                conn,
                next_vid,
                hook: None,
                hook_active: false,
                wal_requested: 0,
            };
            let ckpt = if relaxed {
                Some(Checkpointer::start(&path, opts.busy_timeout).map_err(unable)?)
            } else {
                None
            };
            (Some(Mutex::new(Some(w))), Some(lock), ckpt)
        } else {
            (None, None, None)
        };
        let inner = Inner {
            path: path.clone(),
            display: display.clone(),
            opts,
            readers: Mutex::new(Vec::new()),
            generation: std::sync::atomic::AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
            group: Mutex::new(Group::default()),
            checkpointer: Mutex::new(checkpointer),
            writer,
            lock: Mutex::new(lock),
        };
        // Prove a reader can open and the schema is there.
        let reader = inner.open_reader().map_err(unable)?;
        let version: i64 = reader
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(unable)?;
        if version < 1 {
            return Err(Error::engine(&display, SqliteError::NoSchema(path)));
        }
        inner.give_back(Reader::new(reader));
        Ok(SqliteBackend {
            inner: Arc::new(inner),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    fn durable(&self) -> bool {
        self.inner.opts.durability == Durability::Durable
    }

    /// Runs `schema` (a companion's own tables, idempotent) on the writer
    /// and installs `hook` for every put from now on, active if `active`
    /// answers true. On a read-only open it does nothing (no put runs).
    /// Installing the same hook again re-reads its flag; a different one is
    /// refused ([`Error::Config`]): one companion per database.
    pub fn install_put_hook(
        &self,
        schema: &str,
        hook: PutHook,
        active: impl FnOnce(&Connection) -> rusqlite::Result<bool>,
    ) -> Result<()> {
        if self.inner.writer.is_none() {
            return Ok(());
        }
        let mut taken = None;
        self.inner
            .write_locked("install a companion's tables", |w| {
                if let Some(h) = w.hook.filter(|h| *h != hook) {
                    // One companion per database: a second would replace the
                    // first's statement, and either's flag would switch both.
                    taken = Some(h);
                    return Ok(());
                }
                w.conn.execute_batch(schema)?;
                w.hook_active = active(&w.conn)?;
                w.hook = Some(hook);
                Ok(())
            })?;
        match taken {
            None => Ok(()),
            Some(h) => Err(Error::Config(format!(
                "{}: a companion's put hook ({:?}) is installed already; one companion per database",
                self.inner.display, h.on_put
            ))),
        }
    }

    /// A companion's write on the writer connection (see [`Companion`]),
    /// serialized with the engine's own writes.
    pub async fn companion_write<T, F>(&self, action: &'static str, f: F) -> Result<T>
    where
        F: FnOnce(&mut Companion<'_>) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        self.write(action, move |w| f(&mut Companion { w })).await
    }

    /// A companion's read on a pooled reader, in the engine's snapshot rules.
    pub async fn companion_read<T, F>(&self, action: &'static str, f: F) -> Result<T>
    where
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        self.read(action, f).await
    }

    pub(crate) async fn write<T, F>(&self, action: &'static str, f: F) -> Result<T>
    where
        F: FnOnce(&mut Writer) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        // (`write_locked` refuses a read-only engine.)
        let inner = self.inner.clone();
        blocking(&self.inner.display, move || inner.write_locked(action, f)).await
    }

    /// Overwrites a stored value in place, behind the contract's back, to
    /// simulate bit rot. Test support only.
    #[doc(hidden)]
    pub async fn corrupt_for_test(&self, key: &Key, value: Vec<u8>) -> Result<()> {
        let k = *key;
        self.write("corrupt a value for a test", move |w| {
            w.conn.execute(
                "UPDATE vals SET value = ?2 WHERE vid = (SELECT vid FROM entries WHERE key = ?1)",
                rusqlite::params![key_param(&k), value],
            )
            .map(|_| ())
        })
        .await
    }
}

impl fmt::Debug for SqliteBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteBackend")
            .field("path", &self.inner.path)
            .field("opts", &self.inner.opts)
            .finish()
    }
}

impl fmt::Display for SqliteBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.display)
    }
}

/// Inserts one entry inside the writer's open transaction.
fn put_in_tx(
    tx: &rusqlite::Transaction<'_>,
    next_vid: &mut i64,
    hook: Option<&'static str>,
    key: &Key,
    value: &[u8],
) -> rusqlite::Result<PutOutcome> {
    let k = key_param(key);
    let vid = *next_vid;
    // Immutable once committed: a present key is never rewritten. The
    // conflict check is the insert itself (no separate probe).
    let inserted = tx
        .prepare_cached(
            "INSERT INTO entries (key, size, vid) VALUES (?1, ?2, ?3) ON CONFLICT (key) DO NOTHING",
        )?
        .execute(rusqlite::params![k, value.len() as i64, vid])?
        == 1;
    if let Some(sql) = hook {
        // A companion's statement, in the put's transaction (see PutHook).
        tx.prepare_cached(sql)?.execute([k])?;
    }
    if !inserted {
        return Ok(PutOutcome::Existed);
    }
    tx.prepare_cached("INSERT INTO vals (vid, value) VALUES (?1, ?2)")?
        .execute(rusqlite::params![vid, value])?;
    // A rolled-back transaction leaves a gap in the ids, never a reuse.
    *next_vid += 1;
    Ok(PutOutcome::Created)
}

fn delete_in_tx(tx: &rusqlite::Transaction<'_>, key: &Key) -> rusqlite::Result<Option<u64>> {
    let row: Option<(i64, i64)> = tx
        .prepare_cached("DELETE FROM entries WHERE key = ?1 RETURNING size, vid")?
        .query_row([key_param(key)], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((size, vid)) = row else {
        return Ok(None);
    };
    tx.prepare_cached("DELETE FROM vals WHERE vid = ?1")?
        .execute([vid])?;
    Ok(Some(size as u64))
}

enum Range {
    Missing,
    PastEnd(u64),
    Data(Vec<u8>),
}

#[cfg(test)]
mod tests;
