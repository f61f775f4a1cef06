//! The instance lock: one writing process per embedded engine.
//!
//! In-process pins are invisible to other processes, so two processes
//! writing and sweeping one embedded store could delete each other's
//! in-flight puts. A writable open therefore takes an exclusive `flock` on a
//! lock file for the engine's lifetime; the holder writes who it is into the
//! file so that the next process can say "in use by pid 1234 on host x".
//! Read-only opens take no lock.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::{Error, Result};

/// What to do when the lock is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Fail at once with [`Error::InUse`].
    No,
    /// Block until the holder lets go.
    Yes,
}

/// A held instance lock; released when dropped (or when the process dies).
#[derive(Debug)]
pub(crate) struct InstanceLock {
    _file: File,
}

impl InstanceLock {
    /// Takes the lock at `path` (blocking; call from a blocking context).
    pub(crate) fn acquire(path: &Path, wait: Wait, engine: &str) -> Result<InstanceLock> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| {
                Error::engine(
                    engine,
                    format!("unable to open lock file {}: {e}", path.display()),
                )
            })?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => match wait {
                Wait::No => {
                    return Err(Error::InUse {
                        resource: path.to_owned(),
                        holder: read_holder(&mut file),
                    });
                }
                Wait::Yes => file.lock().map_err(|e| {
                    Error::engine(engine, format!("unable to lock {}: {e}", path.display()))
                })?,
            },
            Err(TryLockError::Error(e)) => {
                return Err(Error::engine(
                    engine,
                    format!("unable to lock {}: {e}", path.display()),
                ));
            }
        }
        // Best effort: the holder line is for people, not for correctness.
        let _ = file.set_len(0).and_then(|()| {
            file.seek(SeekFrom::Start(0))?;
            file.write_all(holder_line().as_bytes())
        });
        Ok(InstanceLock { _file: file })
    }
}

fn read_holder(file: &mut File) -> String {
    let mut s = String::new();
    let _ = file.read_to_string(&mut s);
    let s = s.trim();
    if s.is_empty() {
        "holder unknown".to_owned()
    } else {
        s.to_owned()
    }
}

fn holder_line() -> String {
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "?".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "?".into());
    let since = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    format!(
        "pid {} ({exe}) on {host} since {since}\n",
        std::process::id()
    )
}
