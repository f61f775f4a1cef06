//! Giving the disk back: a database made by this engine frees the pages
//! deleted entries leave (SQLite's incremental auto-vacuum), a bounded
//! step at a time after each deletion; one made before that (auto-vacuum
//! off) is rewritten by [`SqliteBackend::compact_now`], which also switches it
//! to incremental. See `docs/operations.md`, "Disk space".

use std::path::Path;

use super::{DiskSpace, SqliteBackend, Writer};
use crate::{Error, Result};

/// Pages one step frees at most (4 MiB at the default 4 KiB page): one
/// short write transaction, so puts wait no longer than for a batch.
const STEP_PAGES: i64 = 1024;

/// `PRAGMA auto_vacuum`'s value for incremental.
const INCREMENTAL: i64 = 2;

fn pragma(conn: &rusqlite::Connection, name: &str) -> rusqlite::Result<i64> {
    conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
}

/// The database's pages in use and free, in bytes, and its log's size.
fn space(conn: &rusqlite::Connection, path: &Path) -> rusqlite::Result<DiskSpace> {
    let page = pragma(conn, "page_size")? as u64;
    let pages = pragma(conn, "page_count")? as u64;
    let free = pragma(conn, "freelist_count")? as u64;
    // SQLite names the log `<database>-wal`.
    let mut log = path.as_os_str().to_owned();
    log.push("-wal");
    let wal = std::fs::metadata(log).map_or(0, |m| m.len());
    Ok(DiskSpace {
        on_disk: pages * page + wal,
        free: free * page,
    })
}

/// One step: frees up to [`STEP_PAGES`] of the free list (truncating the
/// file at the next checkpoint). Returns the free pages left (0 when the
/// database is not incremental: only [`SqliteBackend::compact_now`] helps it).
fn step(w: &mut Writer) -> rusqlite::Result<i64> {
    if pragma(&w.conn, "auto_vacuum")? != INCREMENTAL {
        return Ok(0);
    }
    if pragma(&w.conn, "freelist_count")? == 0 {
        return Ok(0);
    }
    let mut st = w
        .conn
        .prepare(&format!("PRAGMA incremental_vacuum({STEP_PAGES})"))?;
    let mut rows = st.query([])?;
    while rows.next()?.is_some() {}
    drop(rows);
    drop(st);
    pragma(&w.conn, "freelist_count")
}

/// Free bytes on the filesystem holding `path` (for unprivileged users).
fn available(path: &Path) -> std::io::Result<u64> {
    let s = rustix::fs::statvfs(path)?;
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

/// The directory SQLite writes its temporary files to (VACUUM's copy), as
/// its Unix VFS picks it.
fn sqlite_temp_dir() -> std::path::PathBuf {
    for var in ["SQLITE_TMPDIR", "TMPDIR"] {
        if let Some(d) = std::env::var_os(var).filter(|d| Path::new(d).is_dir()) {
            return d.into();
        }
    }
    ["/var/tmp", "/usr/tmp", "/tmp"]
        .iter()
        .map(Path::new)
        .find(|d| d.is_dir())
        .unwrap_or(Path::new("."))
        .to_owned()
}

impl SqliteBackend {
    /// Frees the pages deleted entries left, in bounded steps (the writer
    /// is taken and released for each), until none is left. A database
    /// that is not incremental is left as it is.
    pub(crate) async fn give_back(&self) -> Result<()> {
        if self.inner.writer.is_none() {
            return Ok(());
        }
        let mut left = i64::MAX;
        loop {
            let now = self.write("free deleted pages", step).await?;
            // Done, or no longer shrinking (nothing more a step can free).
            if now == 0 || now >= left {
                return Ok(());
            }
            left = now;
        }
    }

    /// Pages in use and free, and the log.
    pub(crate) async fn disk_space_now(&self) -> Result<DiskSpace> {
        let path = self.inner.path.clone();
        self.read("measure the database", move |c| space(c, &path))
            .await
    }

    /// Rewrites the database without its free pages (`VACUUM`), switching
    /// one made before incremental auto-vacuum to it, then truncates its
    /// log. It holds the writer throughout (puts wait), and first checks
    /// that the disk can hold the copy it writes: the live pages, once in
    /// SQLite's temporary directory and once in the log beside the
    /// database (twice on one filesystem).
    pub(crate) async fn compact_now(&self) -> Result<(DiskSpace, DiskSpace)> {
        let before = self.disk_space_now().await?;
        let live = before.on_disk.saturating_sub(before.free);
        let dir = self
            .inner
            .path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_owned();
        let tmp = sqlite_temp_dir();
        let display = self.inner.display.clone();
        let no_room = |where_: &Path, need: u64, have: u64| {
            Error::engine(
                &display,
                format!(
                    "not compacted: it needs {need} bytes free in {} (a copy of the {live} bytes in use) and {have} are; nothing was changed",
                    where_.display()
                ),
            )
        };
        let io =
            |e: std::io::Error| Error::engine(&display, format!("cannot measure free space: {e}"));
        let same_fs = {
            use std::os::unix::fs::MetadataExt;
            let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev());
            dev(&dir).map_err(io)? == dev(&tmp).map_err(io)?
        };
        let here = available(&dir).map_err(io)?;
        if same_fs {
            if here < live.saturating_mul(2) {
                return Err(no_room(&dir, live.saturating_mul(2), here));
            }
        } else {
            if here < live {
                return Err(no_room(&dir, live, here));
            }
            let there = available(&tmp).map_err(io)?;
            if there < live {
                return Err(no_room(&tmp, live, there));
            }
        }
        let busy = self
            .write("compact the database", |w| {
                w.conn
                    .execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")?;
                // (busy, log pages, pages checkpointed)
                w.conn
                    .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                        r.get::<_, i64>(0)
                    })
            })
            .await?;
        if busy != 0 {
            // A reader's snapshot kept the log: the rewrite is in it, and
            // the file shrinks at a later checkpoint (`after` shows it).
            tracing::warn!(
                engine = %self.inner.display,
                "compacted, but a reader kept the log from being truncated"
            );
        }
        let after = self.disk_space_now().await?;
        Ok((before, after))
    }
}
