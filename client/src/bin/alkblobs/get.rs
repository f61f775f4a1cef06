//! `get`: a blob to stdout or, atomically, to a file.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use alkblobs::{Error, Key};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The most `get` to stdout holds back until the blob verified (64 MiB).
const STDOUT_HOLD: u64 = 64 << 20;

use crate::ctx::Ctx;
use crate::exit::{Exit, Fail, Res};

/// A `--range`: HTTP's byte-range forms, END inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteRange {
    /// `START-END`, or `START-` (to the end) with `None`.
    From(u64, Option<u64>),
    /// `-N`: the last N bytes.
    Suffix(u64),
}

impl ByteRange {
    /// `(offset, len)` in a blob of `size` bytes; `None` if unsatisfiable
    /// (a start at or past the end, or an empty suffix).
    pub fn resolve(self, size: u64) -> Option<(u64, u64)> {
        match self {
            ByteRange::From(start, _) if start >= size => None,
            ByteRange::From(start, end) => {
                let last = end.map_or(size - 1, |e| e.min(size - 1));
                Some((start, last - start + 1))
            }
            ByteRange::Suffix(n) if n == 0 || size == 0 => None,
            ByteRange::Suffix(n) => {
                let n = n.min(size);
                Some((size - n, n))
            }
        }
    }
}

/// Parses `START-END`, `START-` or `-N`.
pub fn range_arg(s: &str) -> Result<ByteRange, String> {
    let bad = || format!("{s:?} is not a byte range: START-END (END inclusive), START- or -N");
    let num = |t: &str| {
        (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            .then(|| t.parse::<u64>().ok())
            .flatten()
            .ok_or_else(bad)
    };
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    match (a.is_empty(), b.is_empty()) {
        (true, true) => Err(bad()),
        (true, false) => Ok(ByteRange::Suffix(num(b)?)),
        (false, true) => Ok(ByteRange::From(num(a)?, None)),
        (false, false) => {
            let (start, end) = (num(a)?, num(b)?);
            if end < start {
                return Err(format!("{s:?}: END is before START"));
            }
            Ok(ByteRange::From(start, Some(end)))
        }
    }
}

pub async fn get(ctx: &Ctx, key: Key, output: Option<&Path>, range: Option<ByteRange>) -> Res {
    let store = ctx.open_read().await?;
    let reader = match range {
        None => store.open_read_verified(&key).await?,
        Some(r) => {
            let size = store.stat(&key).await?.ok_or(Error::NotFound { key })?.size;
            let (offset, len) = r.resolve(size).ok_or_else(|| {
                Fail::new(
                    Exit::BadInput,
                    format!("range {r:?} is not satisfiable: blob {key} has {size} bytes"),
                )
            })?;
            // Every byte it yields was checked through the outboard first.
            store.open_range_verified(&key, offset, len).await?
        }
    };
    let mut reader = reader.ok_or(Error::NotFound { key })?;
    // The verifying reader fails with `InvalidData` when the content does
    // not hash to its key.
    let read_fail = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::InvalidData {
            Fail::new(Exit::Integrity, e.to_string())
        } else {
            Fail::new(Exit::Failure, format!("reading blob {key}: {e}"))
        }
    };
    let Some(path) = output else {
        // Up to STDOUT_HOLD bytes are held back until the whole blob has
        // verified, so a blob that does not match its key (corruption, or a
        // forged key that a SQL-only server accepted) writes nothing to a
        // pipe; a larger one streams and fails at its end (exit 4). Use
        // `-o FILE` for a verified file in every case.
        let mut out = tokio::io::stdout();
        let mut held = Vec::new();
        (&mut reader)
            .take(STDOUT_HOLD + 1)
            .read_to_end(&mut held)
            .await
            .map_err(read_fail)?;
        out.write_all(&held)
            .await
            .map_err(|e| Fail::new(Exit::Failure, format!("writing stdout: {e}")))?;
        if held.len() as u64 > STDOUT_HOLD {
            tokio::io::copy(&mut reader, &mut out)
                .await
                .map_err(read_fail)?;
        }
        return out
            .flush()
            .await
            .map_err(|e| Fail::new(Exit::Failure, format!("writing stdout: {e}")));
    };

    // A temp file of a unique name beside the target, renamed over it only
    // once the content verified and is synced. `TempPath` removes the file
    // when dropped, so every early return below leaves nothing behind.
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let prefix = format!(
        ".{}.",
        path.file_name()
            .map_or_else(|| key.to_string(), |n| n.to_string_lossy().into_owned())
    );
    let (file, tmp) = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".alkblobs-tmp")
        // The umask's permissions, as a plain create would give, not 0600.
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(dir)
        .map_err(|e| {
            Fail::new(
                Exit::Failure,
                format!("cannot create a temporary file in {}: {e}", dir.display()),
            )
        })?
        .into_parts();
    let mut file = tokio::fs::File::from_std(file);
    tokio::io::copy(&mut reader, &mut file)
        .await
        .map_err(read_fail)?;
    file.sync_all()
        .await
        .map_err(|e| Fail::new(Exit::Failure, format!("syncing {}: {e}", tmp.display())))?;
    drop(file);
    tmp.persist(path).map_err(|e| {
        // `e.path` drops here and removes the temp file.
        Fail::new(
            Exit::Failure,
            format!("cannot write {}: {}", path.display(), e.error),
        )
    })?;
    Ok(())
}
