//! `put`: store files or stdin, creating the store if need be.

use std::path::{Path, PathBuf};

use alkblobs::{Key, PutOutcome, Tier};
use serde::Serialize;

use crate::ctx::Ctx;
use crate::exit::{Exit, Fail, Res};
use crate::output::print_json;

/// Files above this size stream through a progress bar.
const PROGRESS_OVER: u64 = 8 * 1024 * 1024;

/// One stored input, as `--json` prints it.
#[derive(Serialize)]
struct PutLine {
    key: Key,
    size: u64,
    tier: Tier,
    outcome: PutOutcome,
    source: String,
}

pub async fn put(ctx: &Ctx, files: &[PathBuf], root: bool) -> Res {
    let store = ctx.create().await?;
    // Collected rather than streamed: bounded by the command line, and a put
    // that fails on the third file prints no half-array.
    let mut lines = Vec::new();
    for f in files {
        let (put, source) = if f == Path::new("-") {
            (store.put_reader(tokio::io::stdin()).await?, "-".to_owned())
        } else {
            let len = std::fs::metadata(f).map(|m| m.len()).ok();
            let put = match len {
                Some(n) if n > PROGRESS_OVER => {
                    let pb = ctx.bar(
                        Some(n),
                        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                    );
                    pb.set_message(f.display().to_string());
                    let file = tokio::fs::File::open(f).await.map_err(|e| {
                        Fail::new(Exit::BadInput, format!("cannot read {}: {e}", f.display()))
                    })?;
                    let r = store
                        .put_reader(tokio::io::BufReader::with_capacity(
                            1 << 20,
                            pb.wrap_async_read(file),
                        ))
                        .await;
                    pb.finish_and_clear();
                    r?
                }
                _ => store.put_file(f).await?,
            };
            (put, f.display().to_string())
        };
        if root {
            // Recorded before the pin is released: no sweep can slip between.
            store.add_roots(&[put.key]).await?;
        }
        if ctx.json {
            lines.push(PutLine {
                key: put.key,
                size: put.size,
                tier: put.tier,
                outcome: put.outcome,
                source,
            });
        } else {
            println!("{}", put.key);
        }
        if ctx.pg.as_ref().is_some_and(|pg| pg.fleet) {
            // A fleet pin is a row: left in place, it protects the content
            // for one pin TTL after this process exits (its renewal stops
            // with it), time to reference the key in a liveness table.
            std::mem::forget(put.pin);
        } else {
            drop(put.pin);
        }
    }
    if ctx.json {
        print_json(&lines)?;
    }
    Ok(())
}
