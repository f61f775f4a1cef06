//! `get`: a blob to stdout or, atomically, to a file.

use std::path::Path;

use alkblobs::{Error, Key};
use tokio::io::AsyncWriteExt;

use crate::ctx::Ctx;
use crate::exit::{Exit, Fail, Res};

pub async fn get(ctx: &Ctx, key: Key, output: Option<&Path>) -> Res {
    let store = ctx.open_read().await?;
    let mut reader = store
        .open_read_verified(&key)
        .await?
        .ok_or(Error::NotFound { key })?;
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
        let mut out = tokio::io::stdout();
        tokio::io::copy(&mut reader, &mut out)
            .await
            .map_err(read_fail)?;
        return out
            .flush()
            .await
            .map_err(|e| Fail::new(Exit::Failure, format!("writing stdout: {e}")));
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{}.alkblobs-tmp", key));
    let mut f = tokio::fs::File::create(&tmp).await.map_err(|e| {
        Fail::new(
            Exit::Failure,
            format!("cannot create {}: {e}", tmp.display()),
        )
    })?;
    let copied = tokio::io::copy(&mut reader, &mut f).await;
    if let Err(e) = copied {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(read_fail(e));
    }
    f.sync_all()
        .await
        .map_err(|e| Fail::new(Exit::Failure, e.to_string()))?;
    tokio::fs::rename(&tmp, path).await.map_err(|e| {
        Fail::new(
            Exit::Failure,
            format!("cannot write {}: {e}", path.display()),
        )
    })
}
