//! `put`: store files, directories (`-r`) or stdin, creating the store if
//! need be. An input that cannot be read does not stop the others: the
//! failures are reported at the end (exit 2).

use std::path::{Path, PathBuf};

use alkblobs::{Error, Key, PutOutcome, Store, Tier};
use indicatif::ProgressBar;
use serde::Serialize;

use crate::ctx::Ctx;
use crate::exit::{Exit, Fail, Res};
use crate::output::print_json;

/// Files above this size stream through a progress bar of their own.
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

/// The files an argument names: itself, or with `-r` every regular file
/// under a directory (sorted; symbolic links to files are followed, those
/// to directories are not, so a link cycle cannot loop). An unreadable
/// directory or a directory without `-r` is a failure of its own.
fn expand(
    arg: &Path,
    recursive: bool,
    files: &mut Vec<PathBuf>,
    failed: &mut Vec<(String, String)>,
) {
    if arg == Path::new("-") || !arg.is_dir() {
        files.push(arg.to_owned());
        return;
    }
    if !recursive {
        failed.push((
            arg.display().to_string(),
            "is a directory (store its files with -r)".into(),
        ));
        return;
    }
    let mut entries: Vec<PathBuf> = match std::fs::read_dir(arg) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(e) => {
            failed.push((arg.display().to_string(), format!("cannot list: {e}")));
            return;
        }
    };
    entries.sort();
    for p in entries {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            failed.push((p.display().to_string(), "vanished while listed".into()));
            continue;
        };
        if meta.is_dir() {
            expand(&p, true, files, failed);
        } else if meta.is_file() || (meta.is_symlink() && p.is_file()) {
            files.push(p);
        }
        // Sockets, FIFOs, devices and links to directories are skipped.
    }
}

/// Stores one input: `Ok(Err(why))` when it could not be read (the
/// failure to report), an error when the store failed.
async fn put_one(ctx: &Ctx, store: &Store, f: &Path) -> Res<Result<alkblobs::Put, String>> {
    if f == Path::new("-") {
        return Ok(Ok(store.put_reader(tokio::io::stdin()).await?));
    }
    let unreadable = |e: &dyn std::fmt::Display| Ok(Err(format!("cannot read: {e}")));
    let len = match std::fs::metadata(f) {
        Ok(m) => m.len(),
        Err(e) => return unreadable(&e),
    };
    let put = if len > PROGRESS_OVER {
        let pb = ctx.bar(
            Some(len),
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
        );
        pb.set_message(f.display().to_string());
        let file = match tokio::fs::File::open(f).await {
            Ok(file) => file,
            Err(e) => return unreadable(&e),
        };
        let r = store
            .put_reader(tokio::io::BufReader::with_capacity(
                1 << 20,
                pb.wrap_async_read(file),
            ))
            .await;
        pb.finish_and_clear();
        r
    } else {
        store.put_file(f).await
    };
    match put {
        Ok(p) => Ok(Ok(p)),
        // The file could not be read (not the store failing): the others
        // go on.
        Err(Error::Input { source, .. }) => unreadable(&source),
        Err(e) => Err(e.into()),
    }
}

pub async fn put(ctx: &Ctx, args: &[PathBuf], root: bool, recursive: bool) -> Res {
    let mut files = Vec::new();
    let mut failed: Vec<(String, String)> = Vec::new();
    for a in args {
        expand(a, recursive, &mut files, &mut failed);
    }
    // Arguments that named no file (a directory without -r, one that
    // could not be listed) count as inputs too.
    let unlisted = failed.len();
    let store = ctx.create().await?;
    // Many files: one bar counting them (big ones add their own).
    let count_bar = if files.len() > 1 {
        ctx.bar(Some(files.len() as u64), "{pos}/{len} files {wide_msg}")
    } else {
        ProgressBar::hidden()
    };
    // Collected rather than streamed: a put that fails in the store prints
    // no half-array.
    let mut lines = Vec::new();
    for f in &files {
        count_bar.set_message(f.display().to_string());
        let put = match put_one(ctx, &store, f).await? {
            Ok(put) => put,
            Err(why) => {
                failed.push((f.display().to_string(), why));
                count_bar.inc(1);
                continue;
            }
        };
        count_bar.inc(1);
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
                source: f.display().to_string(),
            });
        } else {
            // One key per line, in input order (--json pairs them with
            // their paths).
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
    count_bar.finish_and_clear();
    if ctx.json {
        print_json(&lines)?;
    }
    if failed.is_empty() {
        return Ok(());
    }
    for (path, why) in &failed {
        eprintln!("alkblobs: {path}: {why}");
    }
    Err(Fail::new(
        Exit::BadInput,
        format!(
            "{} of {} inputs could not be stored (the others were)",
            failed.len(),
            files.len() + unlisted
        ),
    ))
}
