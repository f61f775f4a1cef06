//! `sqlite`: the embedded kv engine (rusqlite, WAL).
//!
//! (One engine, one file: the connection handling, the schema and every
//! statement the contract needs stay together; that is why it is long.)
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

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use super::{
    Backend, Durability, InstanceLock, KeyStream, OpenMode, PutOutcome, Sharing, blocking,
};
use crate::{Error, Key, Result};

/// The largest value a point read copies on the calling task (see
/// [`SqliteOptions::inline_reads`]); larger ones are read on a blocking
/// thread.
const INLINE_VALUE_MAX: i64 = 256 * 1024;

/// Keys fetched per `list` page.
const LIST_PAGE: i64 = 4096;

/// WAL pages after which a commit asks the checkpointer thread to copy the
/// log into the database (SQLite's own default for its inline checkpoint).
const CHECKPOINT_PAGES: i32 = 1000;
/// WAL pages after which the writer checkpoints inline after all (the
/// checkpointer is behind: a reader holding an old snapshot, a slow disk).
const CHECKPOINT_BACKSTOP_PAGES: i32 = 16_000;

thread_local! {
    /// Pages in the WAL after this thread's last commit (the writer's WAL
    /// hook sets it during the commit; `SqliteBackend::write` reads it
    /// right after, on the same thread).
    static WAL_PAGES: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

fn note_wal_pages(_: &rusqlite::hooks::Wal, pages: std::ffi::c_int) -> rusqlite::Result<()> {
    WAL_PAGES.with(|c| c.set(pages));
    Ok(())
}

/// Checkpoints off the write path: a thread with its own connection runs a
/// PASSIVE checkpoint when a commit reports a WAL of `CHECKPOINT_PAGES`.
/// (SQLite's inline autocheckpoint runs inside the commit that crosses the
/// threshold: that put paid the checkpoint's copy and its two fsyncs — in
/// the peer benchmark ten of 2,000 relaxed puts took 40% of the time.)
/// Durability is unchanged: a checkpoint copies committed pages; what a
/// commit promises is decided when it writes the WAL.
struct Checkpointer {
    wake: Option<std::sync::mpsc::SyncSender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    fn start(path: &Path, busy_timeout: Duration) -> rusqlite::Result<Checkpointer> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(busy_timeout)?;
        let (wake, asked) = std::sync::mpsc::sync_channel::<()>(1);
        let thread = std::thread::Builder::new()
            .name("alkblobs-checkpoint".into())
            .spawn(move || {
                while asked.recv().is_ok() {
                    // A failed checkpoint is retried at the next request; the
                    // writer's backstop bounds the WAL meanwhile.
                    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                    {
                        tracing::debug!(error = %e, "background checkpoint failed");
                    }
                }
            })
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        Ok(Checkpointer {
            wake: Some(wake),
            thread: Some(thread),
        })
    }

    /// Asks for a checkpoint (none if one is already asked for).
    fn wake(&self) {
        if let Some(w) = &self.wake {
            let _ = w.try_send(());
        }
    }
}

impl Drop for Checkpointer {
    /// Stops the thread (after a checkpoint in progress) and closes its
    /// connection, before the writer closes.
    fn drop(&mut self) {
        drop(self.wake.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

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

/// A pooled read-only connection and the (even) generation its open read
/// transaction was begun at, if it may be reused.
pub(crate) struct Reader {
    conn: Connection,
    snapshot: Option<u64>,
    /// A transaction could not be ended: never pooled again.
    broken: bool,
}

impl Reader {
    fn new(conn: Connection) -> Reader {
        Reader {
            conn,
            snapshot: None,
            broken: false,
        }
    }

    /// Ends any open transaction, tagged or not. A connection whose
    /// transaction cannot be ended is marked broken (and closed when given
    /// back) rather than left holding an old snapshot.
    fn end_snapshot(&mut self) {
        self.snapshot = None;
        if !self.conn.is_autocommit() {
            let ended = self
                .conn
                .prepare_cached("ROLLBACK")
                .and_then(|mut s| s.execute([]));
            if ended.is_err() || !self.conn.is_autocommit() {
                self.broken = true;
            }
        }
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

    fn open_reader(&self) -> rusqlite::Result<Connection> {
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(self.opts.busy_timeout)?;
        // Reads are memcpy from the OS page cache instead of a pread per
        // page, and each reader keeps 16 MiB of hot pages. Durability is
        // untouched: mmap is used for reads only (writes go through the
        // writer connection and the WAL as usual).
        conn.pragma_update(None, "mmap_size", 256i64 << 20)?;
        conn.pragma_update(None, "cache_size", -16384i64)?;
        Ok(conn)
    }

    fn take_reader(&self) -> rusqlite::Result<Reader> {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(rusqlite::Error::InvalidParameterName(
                "the engine was closed".into(),
            ));
        }
        let pooled = self.readers.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match pooled {
            Some(r) => Ok(r),
            None => Ok(Reader::new(self.open_reader()?)),
        }
    }

    /// Runs `f` on `reader` in a snapshot at least as new as every write
    /// answered before this call. The reader's open transaction is reused
    /// only if it was begun at the current generation and that is even (no
    /// write has started since); otherwise a new one. While a write runs
    /// (odd) or without a writer in this process (read-only), `f` runs
    /// outside any kept transaction, as before snapshots were reused.
    fn read_on<T>(
        &self,
        reader: &mut Reader,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        // Loaded before the snapshot is taken (at the first read), so a
        // snapshot tagged `now` holds every write finished before the load.
        let now = self.generation.load(std::sync::atomic::Ordering::SeqCst);
        let keep = self.writer.is_some() && now.is_multiple_of(2);
        if !(keep && reader.snapshot == Some(now)) {
            reader.end_snapshot();
            if reader.broken {
                // Its transaction could not be ended: close it, use a new
                // connection.
                *reader = Reader::new(self.open_reader()?);
            }
            if keep {
                reader.conn.prepare_cached("BEGIN")?.execute([])?;
                reader.snapshot = Some(now);
            }
        }
        let r = f(&reader.conn);
        if r.is_err() || !keep || reader.conn.is_autocommit() {
            reader.end_snapshot();
        }
        r
    }

    /// `f` on a pooled reader (see [`Inner::read_on`]).
    fn run_read<T>(
        &self,
        action: &'static str,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T> {
        let mut reader = self.take_reader().map_err(|e| self.fail(action, e))?;
        let r = self.read_on(&mut reader, f);
        self.give_back(reader);
        r.map_err(|e| self.fail(action, e))
    }

    /// Pools `reader` again, its snapshot ended unless still current. The
    /// generation is read under the pool lock: a write that starts after
    /// this check finds the reader in the pool (`end_idle_snapshots`).
    fn give_back(&self, mut reader: Reader) {
        let mut pool = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        if reader.snapshot != Some(self.generation.load(std::sync::atomic::Ordering::SeqCst)) {
            reader.end_snapshot();
        }
        if !reader.broken
            && pool.len() < 16
            && !self.closed.load(std::sync::atomic::Ordering::Acquire)
        {
            pool.push(reader);
        }
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

    /// Ends the read transactions of idle readers (called as a write
    /// starts), so that none holds back its checkpoint or the WAL's restart.
    fn end_idle_snapshots(&self) {
        let mut pool = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        for r in pool.iter_mut() {
            if r.snapshot.is_some() {
                r.end_snapshot();
            }
        }
        pool.retain(|r| !r.broken);
    }

    /// Drops every queued row (its caller gets the "closed before its
    /// commit" error) and releases the lead.
    fn abandon_queue(&self) {
        let mut g = self.group();
        g.pending.clear();
        g.leading = false;
    }

    /// Takes everything queued, noting the group's size for `gather`.
    fn take_queue(&self) -> Vec<PendingPut> {
        let mut g = self.group();
        g.last = g.pending.len();
        std::mem::take(&mut g.pending)
    }

    /// Releases the lead if nothing is queued; whether it did.
    fn release_lead_if_idle(&self) -> bool {
        let mut g = self.group();
        if g.pending.is_empty() {
            g.leading = false;
        }
        !g.leading
    }

    fn group(&self) -> std::sync::MutexGuard<'_, Group> {
        // Every critical section is a push, a take or a flag flip.
        self.group.lock().unwrap_or_else(|p| p.into_inner())
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

    pub(crate) async fn read<T, F>(&self, action: &'static str, f: F) -> Result<T>
    where
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let inner = self.inner.clone();
        blocking(&self.inner.display, move || inner.run_read(action, f)).await
    }

    /// A point read: inline on the calling task when the options allow
    /// (see [`SqliteOptions::inline_reads`]), else as [`Self::read`].
    async fn point_read<T, F>(&self, action: &'static str, f: F) -> Result<T>
    where
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        if !self.reads_inline() {
            return self.read(action, f).await;
        }
        let inner = &self.inner;
        let r = super::inline(&inner.display, || inner.run_read(action, f));
        // A loop of inline reads never suspends otherwise: spend the task's
        // scheduling budget, yielding when it runs out, as an I/O call
        // would.
        tokio::task::coop::consume_budget().await;
        r
    }

    fn durable(&self) -> bool {
        self.inner.opts.durability == Durability::Durable
    }

    fn reads_inline(&self) -> bool {
        self.inner.opts.inline_reads && self.inner.writer.is_some()
    }

    /// Runs `schema` (a companion's own tables, idempotent) on the writer
    /// and installs `hook` for every put from now on, active if `active`
    /// answers true. On a read-only open it does nothing (no put runs).
    /// Installing a hook twice replaces it.
    pub fn install_put_hook(
        &self,
        schema: &str,
        hook: PutHook,
        active: impl FnOnce(&Connection) -> rusqlite::Result<bool>,
    ) -> Result<()> {
        if self.inner.writer.is_none() {
            return Ok(());
        }
        self.inner
            .write_locked("install a companion's tables", |w| {
                w.conn.execute_batch(schema)?;
                w.hook_active = active(&w.conn)?;
                w.hook = Some(hook);
                Ok(())
            })
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

    /// See [`Backend::put`] on this engine: queue the row; if no commit is
    /// being led, lead one (commit everything queued, then hand the lead to
    /// a background task if more queued meanwhile); else wait, without
    /// holding a thread, for the leader's answer.
    async fn put_grouped(&self, key: Key, value: Bytes) -> Result<PutOutcome> {
        if self.inner.writer.is_none() {
            return Err(Error::ReadOnly {
                engine: self.inner.display.clone(),
                action: "insert an entry",
            });
        }
        let (done, answer) = tokio::sync::oneshot::channel();
        let lead = {
            let mut g = self.inner.group();
            g.pending.push(PendingPut { key, value, done });
            !std::mem::replace(&mut g.leading, true)
        };
        if lead {
            // Gathering pays off where a commit waits for an fsync; relaxed
            // commits take tens of microseconds and lead inline, as before.
            let concurrent = self.durable() && self.inner.group().last > 1;
            match tokio::runtime::Handle::try_current() {
                // Lead on a task of its own whenever leading would suspend
                // this caller's future (`gather` yields; off a multi-thread
                // runtime the commit is awaited on the blocking pool), so
                // that no commit waits for this future to be polled again.
                Ok(handle)
                    if concurrent
                        || handle.runtime_flavor()
                            != tokio::runtime::RuntimeFlavor::MultiThread =>
                {
                    self.lead_in_background(&handle)
                }
                _ => {
                    // Hands the lead on however this future ends (even
                    // cancelled).
                    let _lead = LeadGuard(self);
                    // Our row is queued and no other leader exists, so this
                    // group holds it.
                    self.commit_queued().await;
                }
            }
        }
        match answer.await {
            Ok(r) => r.map_err(|e| self.inner.fail("insert an entry", e)),
            // The group holding our row was dropped unanswered (the engine
            // was closed first): nothing of ours was written.
            Err(_) => Err(Error::engine(
                &self.inner.display,
                "unable to insert an entry: the engine was closed before its commit",
            )),
        }
    }

    /// Commits one group: everything queued now. A failure to reach the
    /// writer (a closed engine) drops the group, which answers its callers.
    /// Commits everything queued now and answers its callers (the leader's
    /// caller holds the engine meanwhile). A failure to reach the writer (a
    /// closed engine) drops the group, which answers its callers.
    async fn commit_queued(&self) {
        self.gather().await;
        let group = self.inner.take_queue();
        if group.is_empty() {
            return;
        }
        let _ = self
            .write("insert an entry", move |w| {
                answer_all(commit_group(w, group));
                Ok(())
            })
            .await;
    }

    /// Before a commit, lets the callers of the last group queue again.
    /// Callers that share a commit are answered together and come back
    /// together; a leader that committed at once would take only the first
    /// of them, leave the rest for the next fsync, and the groups would
    /// alternate small and large (8 rows on average for 16 tasks here,
    /// 14 with this). So while fewer rows are queued than the last group
    /// held and the queue still grows, yield to the tasks queueing. A lone
    /// caller (last group of one) never yields: a yield on an otherwise
    /// idle runtime cost ~20 µs here, the whole of a relaxed put.
    async fn gather(&self) {
        if !self.durable() {
            return;
        }
        let mut seen = 0;
        for _ in 0..16 {
            let (queued, last) = {
                let g = self.inner.group();
                (g.pending.len(), g.last)
            };
            if queued >= last || queued == seen {
                return;
            }
            seen = queued;
            tokio::task::yield_now().await;
        }
    }

    /// Ends a lead: if rows queued meanwhile, a background task leads on
    /// (commits until the queue is empty); otherwise the next put leads.
    fn hand_off(&self) {
        let mut g = self.inner.group();
        if g.pending.is_empty() {
            g.leading = false;
            return;
        }
        drop(g);
        let handle = tokio::runtime::Handle::try_current();
        let Ok(handle) = handle else {
            // No runtime to lead on: answer the queued callers with an error
            // rather than leave them waiting.
            self.inner.abandon_queue();
            return;
        };
        self.lead_in_background(&handle);
    }

    /// Leads on a task of its own: commits until the queue is empty. If the
    /// task is dropped unfinished (its runtime shut down), the rows still
    /// queued are answered with an error and the lead is released.
    ///
    /// The task holds the engine only while it gathers and commits: a
    /// commit's callers are answered on the writer's thread after the commit,
    /// the lead's release when the queue is empty, and the task's last
    /// strong reference are done, so a caller that drops the last handle as
    /// soon as its put returns can reopen the database at once (the instance
    /// lock goes with the engine).
    fn lead_in_background(&self, handle: &tokio::runtime::Handle) {
        let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut lead = BackgroundLead {
            engine: Arc::downgrade(&self.inner),
            finished: false,
            released: released.clone(),
        };
        handle.spawn(async move {
            loop {
                // Callers still queued hold the engine; gone, its queue
                // (and their channels) went with it.
                let Some(inner) = lead.engine.upgrade() else {
                    lead.finish();
                    return;
                };
                let db = SqliteBackend { inner };
                db.gather().await;
                let group = db.inner.take_queue();
                let SqliteBackend { inner } = db;
                let display = inner.display.clone();
                let released = released.clone();
                let done = blocking(&display, move || {
                    // On an error the group was dropped unanswered, which
                    // answers its callers.
                    let answers = if group.is_empty() {
                        Vec::new()
                    } else {
                        inner
                            .write_locked("insert an entry", |w| Ok(commit_group(w, group)))
                            .unwrap_or_default()
                    };
                    let done = inner.release_lead_if_idle();
                    if done {
                        // From here the lead may be another's: a late drop
                        // of this task must not abandon its queue.
                        released.store(true, std::sync::atomic::Ordering::Release);
                    }
                    drop(inner);
                    answer_all(answers);
                    Ok(done)
                })
                .await;
                match done {
                    Ok(false) => continue,
                    Ok(true) => lead.finish(),
                    // A panic: `lead`'s drop answers what is queued.
                    Err(_) => {}
                }
                return;
            }
        });
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

/// The group-commit queue: rows waiting, and whether a commit is being led.
#[derive(Default)]
struct Group {
    pending: Vec<PendingPut>,
    /// How many rows the last commit held (see `gather`).
    last: usize,
    leading: bool,
}

/// Hands the lead on when the leading put's future ends.
struct LeadGuard<'a>(&'a SqliteBackend);

impl Drop for LeadGuard<'_> {
    fn drop(&mut self) {
        self.0.hand_off();
    }
}

/// A background leader; see [`SqliteBackend::lead_in_background`].
struct BackgroundLead {
    engine: std::sync::Weak<Inner>,
    finished: bool,
    /// Set once the commit call released the lead.
    released: Arc<std::sync::atomic::AtomicBool>,
}

impl BackgroundLead {
    /// The queue is empty and the lead released: nothing for `drop` to do.
    fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for BackgroundLead {
    fn drop(&mut self) {
        if !self.finished
            && !self.released.load(std::sync::atomic::Ordering::Acquire)
            && let Some(inner) = self.engine.upgrade()
        {
            inner.abandon_queue();
        }
    }
}

/// A durable put queued for the next group commit.
struct PendingPut {
    key: Key,
    value: Bytes,
    done: tokio::sync::oneshot::Sender<rusqlite::Result<PutOutcome>>,
}

/// Commits every queued put in one transaction and one fsync, answering
/// each caller only after that commit. If the shared transaction fails,
/// each put is retried in a transaction of its own so that every caller
/// gets its own outcome (one bad row never fails its neighbours).
fn commit_group(w: &mut Writer, group: Vec<PendingPut>) -> Answers {
    let hook = w.put_hook();
    let batch = (|| {
        let tx = w
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let outs = group
            .iter()
            .map(|p| put_in_tx(&tx, &mut w.next_vid, hook, &p.key, &p.value))
            .collect::<rusqlite::Result<Vec<_>>>()?;
        tx.commit()?;
        Ok::<_, rusqlite::Error>(outs)
    })();
    match batch {
        Ok(outs) => group
            .into_iter()
            .zip(outs)
            .map(|(p, out)| (p.done, Ok(out)))
            .collect(),
        Err(_) if group.len() > 1 => group
            .into_iter()
            .map(|p| {
                let one = (|| {
                    let tx = w
                        .conn
                        .transaction_with_behavior(TransactionBehavior::Immediate)?;
                    let out = put_in_tx(&tx, &mut w.next_vid, hook, &p.key, &p.value)?;
                    tx.commit()?;
                    Ok(out)
                })();
                (p.done, one)
            })
            .collect(),
        Err(e) => group
            .into_iter()
            .map(|p| (p.done, Err(clone_error(&e))))
            .collect(),
    }
}

/// Each caller's channel and its outcome, sent by [`answer_all`].
type Answers = Vec<(
    tokio::sync::oneshot::Sender<rusqlite::Result<PutOutcome>>,
    rusqlite::Result<PutOutcome>,
)>;

/// Answers a group's callers (see `lead_in_background` for when).
fn answer_all(answers: Answers) {
    for (done, r) in answers {
        let _ = done.send(r);
    }
}

/// rusqlite errors are not `Clone`; keep the code and the message.
fn clone_error(e: &rusqlite::Error) -> rusqlite::Error {
    match e {
        rusqlite::Error::SqliteFailure(code, msg) => {
            rusqlite::Error::SqliteFailure(*code, msg.clone().or_else(|| Some(e.to_string())))
        }
        other => rusqlite::Error::ToSqlConversionFailure(other.to_string().into()),
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

#[async_trait]
impl Backend for SqliteBackend {
    fn name(&self) -> &str {
        "sqlite"
    }

    fn sharing(&self) -> Sharing {
        // A writable open holds the instance lock; a read-only one deletes
        // nothing.
        Sharing::Process
    }

    async fn has(&self, key: &Key) -> Result<bool> {
        let k = *key;
        self.point_read("probe an entry", move |c| {
            c.prepare_cached("SELECT 1 FROM entries WHERE key = ?1")?
                .exists([key_param(&k)])
        })
        .await
    }

    async fn get(&self, key: &Key) -> Result<Option<Bytes>> {
        let k = *key;
        // The value is read only if it is small enough to copy inline (the
        // CASE is evaluated before the column is loaded); a larger one is
        // read again on a blocking thread.
        let read = move |c: &Connection, limit: i64| {
            c.prepare_cached(
                "SELECT CASE WHEN e.size <= ?2 THEN v.value END \
                 FROM entries e JOIN vals v ON v.vid = e.vid WHERE e.key = ?1",
            )?
            .query_row(rusqlite::params![key_param(&k), limit], |r| {
                r.get::<_, Option<Vec<u8>>>(0)
            })
            .optional()
        };
        if self.reads_inline() {
            match self
                .point_read("read a value", move |c| read(c, INLINE_VALUE_MAX))
                .await?
            {
                None => return Ok(None),
                Some(Some(v)) => return Ok(Some(Bytes::from(v))),
                // Present, over the limit: read below.
                Some(None) => {}
            }
        }
        match self
            .read("read a value", move |c| read(c, i64::MAX))
            .await?
        {
            None => Ok(None),
            Some(v) => Ok(Some(Bytes::from(v.unwrap_or_default()))),
        }
    }

    /// Puts use group commit: a put queues its row; if no commit is being
    /// led it leads one, committing every queued row in one transaction
    /// (and, durable, one fsync); each caller returns only after the commit
    /// that holds its row. A lone caller on a multi-thread runtime commits
    /// its own row at once, in its own call. Durable: when the last commit
    /// held several rows, the leader first lets those callers queue again
    /// (`gather`) and leads on a task of its own, as every leader does on a
    /// current-thread runtime, so that no commit waits for a caller's future
    /// to be polled. (Relaxed commits cost no fsync, but sharing them still
    /// took 16 concurrent 1 KiB puts from 62–65k to 85–99k/s here, for ~3%
    /// on a lone caller.)
    async fn put(&self, key: &Key, value: Bytes) -> Result<PutOutcome> {
        self.put_grouped(*key, value).await
    }

    async fn delete(&self, key: &Key) -> Result<Option<u64>> {
        let k = *key;
        self.write("delete an entry", move |w| {
            let tx = w
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = delete_in_tx(&tx, &k)?;
            tx.commit()?;
            Ok(out)
        })
        .await
    }

    fn list(&self) -> KeyStream<'_> {
        crate::pager::paged(
            LIST_PAGE as usize,
            |k: &Key| *k,
            move |after| {
                let after = after_param(after);
                self.read("list keys", move |c| {
                    let mut stmt = c.prepare_cached(
                        "SELECT key FROM entries WHERE key > ?1 ORDER BY key LIMIT ?2",
                    )?;
                    let rows = stmt.query_map(rusqlite::params![after, LIST_PAGE], |r| {
                        key_from_row(r.get(0)?)
                    })?;
                    rows.collect::<rusqlite::Result<Vec<Key>>>()
                })
            },
        )
    }

    async fn size(&self, key: &Key) -> Result<Option<u64>> {
        let k = *key;
        self.point_read("probe a size", move |c| {
            c.prepare_cached("SELECT size FROM entries WHERE key = ?1")?
                .query_row([key_param(&k)], |r| r.get::<_, i64>(0))
                .optional()
        })
        .await
        .map(|o| o.map(|s| s as u64))
    }

    async fn get_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        let k = *key;
        let read = move |c: &Connection| {
            // One read transaction: the entry row and its value blob
            // come from the same snapshot (`read` has opened one unless
            // the engine is read-only).
            let _tx = if c.is_autocommit() {
                Some(c.unchecked_transaction()?)
            } else {
                None
            };
            let row: Option<(i64, i64)> = c
                .prepare_cached("SELECT size, vid FROM entries WHERE key = ?1")?
                .query_row([key_param(&k)], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            let Some((size, vid)) = row else {
                return Ok(Range::Missing);
            };
            let size = size as u64;
            if offset > size {
                return Ok(Range::PastEnd(size));
            }
            let n = len.min(size - offset) as usize;
            let mut buf = vec![0u8; n];
            if n > 0 {
                let blob = c.blob_open(rusqlite::MAIN_DB, "vals", "value", vid, true)?;
                blob.read_at_exact(&mut buf, offset as usize)?;
            }
            Ok(Range::Data(buf))
        };
        // Inline only when the copy is small (see `get`).
        let range = if len <= INLINE_VALUE_MAX as u64 {
            self.point_read("read a range", read).await?
        } else {
            self.read("read a range", read).await?
        };
        match range {
            Range::Missing => Ok(None),
            Range::PastEnd(size) => Err(Error::InvalidRange {
                key: *key,
                offset,
                size,
            }),
            Range::Data(d) => Ok(Some(Bytes::from(d))),
        }
    }

    async fn put_many(&self, items: &[(Key, Bytes)]) -> Result<Vec<PutOutcome>> {
        let items = items.to_vec();
        self.write("insert a batch", move |w| {
            let hook = w.put_hook();
            let tx = w
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = items
                .iter()
                .map(|(k, v)| put_in_tx(&tx, &mut w.next_vid, hook, k, v))
                .collect::<rusqlite::Result<Vec<_>>>()?;
            tx.commit()?;
            Ok(out)
        })
        .await
    }

    async fn delete_many(&self, keys: &[Key]) -> Result<Vec<Option<u64>>> {
        let keys = keys.to_vec();
        self.write("delete a batch", move |w| {
            let tx = w
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = keys
                .iter()
                .map(|k| delete_in_tx(&tx, k))
                .collect::<rusqlite::Result<Vec<_>>>()?;
            tx.commit()?;
            Ok(out)
        })
        .await
    }

    async fn usage(&self) -> Result<Option<(u64, u64)>> {
        self.read("count entries", |c| {
            c.query_row(
                "SELECT count(*), coalesce(sum(size), 0) FROM entries",
                [],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
            )
        })
        .await
        .map(Some)
    }

    async fn close(&self) -> Result<()> {
        let inner = self.inner.clone();
        blocking(&self.inner.display, move || inner.close()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tables(path: &Path) -> Vec<String> {
        let c = Connection::open(path).unwrap();
        let mut s = c
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .unwrap();
        s.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    /// The engine is storage: it creates its own two tables and nothing of
    /// garbage collection. A companion's tables and its put statement come
    /// from the companion, and the statement runs in each put's
    /// transaction only while the companion says it is active.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_engine_creates_only_its_own_tables_and_runs_a_companions_hook() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kv.sqlite");
        let db = SqliteBackend::open(&path, SqliteOptions::default())
            .await
            .unwrap();
        assert_eq!(tables(&path), ["entries", "vals"]);
        db.install_put_hook(
            "CREATE TABLE IF NOT EXISTS seen (key BLOB PRIMARY KEY);",
            PutHook {
                on_put: "INSERT INTO seen VALUES (?1) ON CONFLICT DO NOTHING",
            },
            |_| Ok(false),
        )
        .unwrap();
        assert_eq!(tables(&path), ["entries", "seen", "vals"]);
        async fn count(db: &SqliteBackend) -> Result<i64> {
            db.companion_read("count", |c| {
                c.query_row("SELECT count(*) FROM seen", [], |r| r.get::<_, i64>(0))
            })
            .await
        }
        db.put(&Key::of(b"a"), Bytes::from_static(b"a"))
            .await
            .unwrap();
        assert_eq!(count(&db).await.unwrap(), 0, "inactive: not run");
        db.companion_write("activate", |c| {
            c.set_hook_active(true);
            Ok(())
        })
        .await
        .unwrap();
        db.put(&Key::of(b"b"), Bytes::from_static(b"b"))
            .await
            .unwrap();
        db.put_many(&[(Key::of(b"c"), Bytes::from_static(b"c"))])
            .await
            .unwrap();
        assert_eq!(count(&db).await.unwrap(), 2, "active: run in each put");
    }

    /// Values on both sides of the inline limit (over it, `get` reads again
    /// on a blocking thread) come back whole and in ranges, the empty value
    /// included.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn values_over_the_inline_limit_are_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteBackend::open(dir.path().join("kv.sqlite"), SqliteOptions::default())
            .await
            .unwrap();
        for len in [
            0usize,
            1,
            INLINE_VALUE_MAX as usize,
            INLINE_VALUE_MAX as usize + 1,
            1 << 20,
        ] {
            let v = Bytes::from((0..len).map(|i| (i % 251) as u8).collect::<Vec<_>>());
            let k = Key::of(&v);
            db.put(&k, v.clone()).await.unwrap();
            assert_eq!(db.get(&k).await.unwrap(), Some(v.clone()), "len {len}");
            let whole = db.get_range(&k, 0, len as u64).await.unwrap();
            assert_eq!(whole, Some(v.clone()), "range of len {len}");
            if len > 2 {
                let tail = db.get_range(&k, 1, u64::MAX).await.unwrap().unwrap();
                assert_eq!(tail, v.slice(1..), "tail of len {len}");
            }
        }
        db.close().await.unwrap();
    }
    /// Starts a read that takes its snapshot and then waits: returns once
    /// the snapshot is taken, with the read's task (which answers the
    /// number of entries it saw) and the sender that lets it finish.
    async fn hold_snapshot(
        db: &SqliteBackend,
    ) -> (
        tokio::task::JoinHandle<Result<i64>>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (taken_tx, taken) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let busy = db.clone();
        let reading = tokio::spawn(async move {
            busy.read("hold a snapshot", move |c| {
                let n: i64 = c.query_row("SELECT count(*) FROM entries", [], |r| r.get(0))?;
                taken_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                Ok(n)
            })
            .await
        });
        tokio::task::spawn_blocking(move || taken.recv().unwrap())
            .await
            .unwrap();
        (reading, go)
    }

    /// A reader busy in a read while a put (then a delete) commits must not
    /// keep its old snapshot: the next read on that reader (the pool hands
    /// back the last reader returned) sees the write. Fails if writes stop
    /// moving the generation.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_snapshot_older_than_an_answered_put_is_never_reused() {
        for durability in [Durability::Durable, Durability::Relaxed] {
            let dir = tempfile::tempdir().unwrap();
            let db = SqliteBackend::open(
                dir.path().join("kv.sqlite"),
                SqliteOptions::default().durability(durability),
            )
            .await
            .unwrap();
            let first = Bytes::from_static(b"first");
            db.put(&Key::of(&first), first.clone()).await.unwrap();

            // A put answered while a snapshot is open.
            let (reading, go) = hold_snapshot(&db).await;
            let second = Bytes::from_static(b"second");
            let key = Key::of(&second);
            db.put(&key, second.clone()).await.unwrap();
            go.send(()).unwrap();
            assert_eq!(reading.await.unwrap().unwrap(), 1, "{durability:?}");
            assert_eq!(
                db.get(&key).await.unwrap(),
                Some(second),
                "{durability:?}: a read after an answered put missed it"
            );
            assert!(db.has(&key).await.unwrap(), "{durability:?}");

            // The same for a delete.
            let (reading, go) = hold_snapshot(&db).await;
            assert!(db.delete(&key).await.unwrap().is_some());
            go.send(()).unwrap();
            assert_eq!(reading.await.unwrap().unwrap(), 2, "{durability:?}");
            assert_eq!(
                db.get(&key).await.unwrap(),
                None,
                "{durability:?}: a read after an answered delete still saw the value"
            );
            db.close().await.unwrap();
        }
    }
}
