//! The pooled read-only connections and the snapshots they keep between
//! reads while nothing is written (see "Concurrency" in the module docs).

#[allow(unused_imports)]
use super::*;

/// A pooled read-only connection and the (even) generation its open read
/// transaction was begun at, if it may be reused.
pub(crate) struct Reader {
    conn: Connection,
    snapshot: Option<u64>,
    /// A transaction could not be ended: never pooled again.
    broken: bool,
}

impl Reader {
    pub(super) fn new(conn: Connection) -> Reader {
        Reader {
            conn,
            snapshot: None,
            broken: false,
        }
    }

    /// Ends any open transaction, tagged or not. A connection whose
    /// transaction cannot be ended is marked broken (and closed when given
    /// back) rather than left holding an old snapshot.
    pub(super) fn end_snapshot(&mut self) {
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

impl Inner {
    pub(super) fn open_reader(&self) -> rusqlite::Result<Connection> {
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

    pub(super) fn take_reader(&self) -> rusqlite::Result<Reader> {
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
    pub(super) fn read_on<T>(
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
    pub(super) fn run_read<T>(
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
    pub(super) fn give_back(&self, mut reader: Reader) {
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

    /// Ends the read transactions of idle readers (called as a write
    /// starts), so that none holds back its checkpoint or the WAL's restart.
    pub(super) fn end_idle_snapshots(&self) {
        let mut pool = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        for r in pool.iter_mut() {
            if r.snapshot.is_some() {
                r.end_snapshot();
            }
        }
        pool.retain(|r| !r.broken);
    }
}

impl SqliteBackend {
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
    pub(super) async fn point_read<T, F>(&self, action: &'static str, f: F) -> Result<T>
    where
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        if !self.reads_inline() {
            return self.read(action, f).await;
        }
        let inner = &self.inner;
        let r = crate::backend::inline(&inner.display, || inner.run_read(action, f));
        // A loop of inline reads never suspends otherwise: spend the task's
        // scheduling budget, yielding when it runs out, as an I/O call
        // would.
        tokio::task::coop::consume_budget().await;
        r
    }

    pub(super) fn reads_inline(&self) -> bool {
        self.inner.opts.inline_reads && self.inner.writer.is_some()
    }
}
