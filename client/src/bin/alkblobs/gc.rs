//! `gc`: sweep what no root, liveness source or extra roots file protects.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use alkblobs::{Key, LiveSet, SweepOptions, SweepPhase, SweepReport};
use indicatif::HumanBytes;

use crate::ctx::Ctx;
use crate::exit::{Exit, Fail, Res};
use crate::output::print_json;

/// A file of keys, one per line; blank lines and `#` comments skipped.
fn read_roots_file(path: &Path) -> Res<HashSet<Key>> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Fail::new(
            Exit::BadInput,
            format!("cannot read roots file {}: {e}", path.display()),
        )
    })?;
    let mut set = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let key = line.parse::<Key>().map_err(|e| {
            Fail::new(
                Exit::BadInput,
                format!("{}:{}: invalid key: {e}", path.display(), i + 1),
            )
        })?;
        set.insert(key);
    }
    Ok(set)
}

fn summary(r: &SweepReport) -> String {
    format!(
        "examined {}, live {}, pinned {}, newly staged {}, executed {}, deleted {} ({} freed), kept {} on re-check, in {:.2?}",
        r.examined,
        r.live,
        r.pinned,
        r.staged,
        r.executed,
        r.deleted,
        HumanBytes(r.bytes_freed),
        r.kept,
        r.duration
    )
}

pub async fn gc(
    ctx: &Ctx,
    roots_files: &[PathBuf],
    window: Option<Duration>,
    dry_run: bool,
) -> Res {
    if ctx.pg.is_some() && window.is_some() {
        // The window is the pool's, the same for every entry point.
        return Err(crate::exit::Fail::new(
            crate::exit::Exit::BadInput,
            "--window: a PostgreSQL pool's delete window is a property of the pool; change it with `alkblobs pool alter NAME --window …`",
        ));
    }
    let mut extra = HashSet::new();
    for f in roots_files {
        extra.extend(read_roots_file(f)?);
    }
    let store = ctx.open_write().await?;
    let pb = ctx.bar(None, "{spinner} {msg}");
    let pb2 = pb.clone();
    let mut opts = SweepOptions::new().dry_run(dry_run).on_progress(move |p| {
        let phase = match p.phase {
            SweepPhase::Mark => "marking",
            SweepPhase::Window => "waiting out the window",
            _ => "deleting",
        };
        pb2.set_message(format!(
            "{phase}: examined {}, executed {}, deleted {}",
            p.examined, p.executed, p.deleted
        ));
    });
    if let Some(w) = window {
        opts = opts.window(w);
    }
    if !extra.is_empty() {
        let extra = Arc::new(extra);
        opts = opts.protect(LiveSet::new(move || {
            let extra = extra.clone();
            async move { Ok((*extra).clone()) }
        }));
    }
    let report = store.sweep(opts).await?;
    pb.finish_and_clear();
    if ctx.json {
        print_json(&report)?;
    } else {
        let prefix = if dry_run { "dry run: " } else { "" };
        println!("{prefix}{}", summary(&report));
        if !dry_run && report.staged > 0 && !report.window.is_zero() {
            println!(
                "{} candidate(s) become due in {}; run `alkblobs gc` again after that to delete them",
                report.staged,
                humantime::format_duration(report.window)
            );
        }
    }
    match &report.aborted {
        Some(cause) => Err(Fail::new(
            Exit::SweepAborted,
            format!("sweep aborted: {cause}"),
        )),
        None => Ok(()),
    }
}
