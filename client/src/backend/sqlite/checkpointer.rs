//! Checkpoints off the write path (relaxed mode): the WAL hook that notes
//! the log's size after each commit, and the thread that checkpoints.

#[allow(unused_imports)]
use super::*;

/// WAL pages after which a commit asks the checkpointer thread to copy the
/// log into the database (SQLite's own default for its inline checkpoint).
pub(super) const CHECKPOINT_PAGES: i32 = 1000;
/// WAL pages after which the writer checkpoints inline after all (the
/// checkpointer is behind: a reader holding an old snapshot, a slow disk).
pub(super) const CHECKPOINT_BACKSTOP_PAGES: i32 = 16_000;

thread_local! {
    /// Pages in the WAL after this thread's last commit (the writer's WAL
    /// hook sets it during the commit; `SqliteBackend::write` reads it
    /// right after, on the same thread).
    pub(super) static WAL_PAGES: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

pub(super) fn note_wal_pages(
    _: &rusqlite::hooks::Wal,
    pages: std::ffi::c_int,
) -> rusqlite::Result<()> {
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
pub(super) struct Checkpointer {
    wake: Option<std::sync::mpsc::SyncSender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    pub(super) fn start(path: &Path, busy_timeout: Duration) -> rusqlite::Result<Checkpointer> {
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
    pub(super) fn wake(&self) {
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
