//! `alkblobs`: the command line for people.
//!
//! Works on the embedded default store (sqlite + local files under a data
//! directory, no server). Exit codes: 0 success, 1 failure, 2 bad usage or
//! input, 3 not found, 4 integrity failure (corrupt or missing content),
//! 5 store in use by another process, 6 sweep aborted.

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use alkblobs::backend::mem::MemBackend;
use alkblobs::{
    DirOptions, Error, Key, LiveSet, OpenMode, Store, SweepOptions, SweepPhase, SweepReport,
};
use clap::{Parser, Subcommand};
use futures::TryStreamExt;
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use serde::Serialize;
use tokio::io::AsyncWriteExt;

#[derive(Parser)]
#[command(
    name = "alkblobs",
    version,
    about = "A content-addressed, deduplicated, garbage-collected blob store"
)]
struct Cli {
    /// The store's data directory (sqlite index + large files).
    #[arg(long, global = true, env = "ALKBLOBS_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    json: bool,
    /// Wait for another process to release the store instead of failing.
    #[arg(long, global = true)]
    wait: bool,
    /// No progress bars.
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Store files (or `-` for stdin); prints each key on its own line.
    Put {
        /// Files to store; `-` reads standard input.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Also record each key as a root, so no sweep collects it.
        #[arg(long)]
        root: bool,
    },
    /// Write a blob to stdout or a file, verifying its hash.
    Get {
        /// The key (64 hex characters).
        key: String,
        /// Write to FILE (atomically, only if the content verifies).
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Show a blob's size and tier.
    Stat {
        /// The key.
        key: String,
    },
    /// List every key.
    Ls {
        /// Also show size and tier.
        #[arg(short, long)]
        long: bool,
    },
    /// Re-hash every blob; exit 4 and name each corrupt or missing key.
    Verify,
    /// Entries and bytes per tier.
    Usage,
    /// Protect existing keys persistently (as roots); fails if a key is absent.
    Pin {
        /// Keys to pin.
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Manage roots: keys the garbage collector treats as live.
    Roots {
        #[command(subcommand)]
        action: RootsCmd,
    },
    /// Collect unreferenced blobs.
    Gc {
        /// A file of extra root keys for this run, one per line.
        #[arg(long = "roots", value_name = "FILE")]
        roots_files: Vec<PathBuf>,
        /// Delete window for candidates staged by this run (e.g. 0s, 5m).
        #[arg(long, value_parser = humantime::parse_duration)]
        window: Option<Duration>,
        /// Report what would be staged; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Show what is staged instead of sweeping.
        #[arg(long)]
        status: bool,
    },
    /// Show staged delete candidates and when they become due.
    Staged,
}

#[derive(Subcommand)]
enum RootsCmd {
    /// Add roots (the keys need not exist yet).
    Add {
        /// Keys.
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Remove roots.
    Rm {
        /// Keys.
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// List roots.
    Ls,
}

/// A failure with the exit code it maps to.
struct Fail {
    code: u8,
    message: String,
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        let code = match &e {
            Error::NotFound { .. } => 3,
            Error::InvalidKey(_)
            | Error::TooLarge { .. }
            | Error::Input { .. }
            | Error::Config(_) => 2,
            Error::HashMismatch { .. } | Error::Corrupt { .. } => 4,
            Error::InUse { .. } => 5,
            _ => 1,
        };
        Fail {
            code,
            message: chain(&e),
        }
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        let m = x.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        src = x.source();
    }
    s
}

fn fail(code: u8, message: impl Into<String>) -> Fail {
    Fail {
        code,
        message: message.into(),
    }
}

type Res<T = ()> = std::result::Result<T, Fail>;

fn parse_key(s: &str) -> Res<Key> {
    s.trim()
        .parse::<Key>()
        .map_err(|e| Error::InvalidKey(e).into())
}

fn default_data_dir() -> PathBuf {
    dirs::data_dir()
        .unwrap_or_else(|| PathBuf::from("."))
        .join("alkblobs")
}

struct Ctx {
    dir: PathBuf,
    json: bool,
    wait: bool,
    progress: bool,
}

impl Ctx {
    async fn open_write(&self) -> Res<Store> {
        let mode = if self.wait {
            OpenMode::WriteWait
        } else {
            OpenMode::Write
        };
        Ok(Store::open_dir_with(&self.dir, DirOptions::new().mode(mode)).await?)
    }

    /// Read commands take no lock; a data directory with no store yet reads
    /// as an empty store.
    async fn open_read(&self) -> Res<Store> {
        let (sqlite, _) = Store::dir_paths(&self.dir);
        if !sqlite.exists() {
            return Ok(Store::builder()
                .kv(MemBackend::new())
                .large(MemBackend::new())
                .build()?);
        }
        let opts = DirOptions::new().read_only();
        Ok(Store::open_dir_with(&self.dir, opts).await?)
    }

    fn bar(&self, len: Option<u64>, template: &str) -> ProgressBar {
        if !self.progress {
            return ProgressBar::hidden();
        }
        let pb = match len {
            Some(n) => ProgressBar::new(n),
            None => ProgressBar::new_spinner(),
        };
        pb.set_style(
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        pb.enable_steady_tick(Duration::from_millis(120));
        pb
    }
}

fn print_json<T: Serialize>(v: &T) -> Res {
    let s = serde_json::to_string_pretty(v).map_err(|e| fail(1, e.to_string()))?;
    println!("{s}");
    Ok(())
}

#[derive(Serialize)]
struct PutLine {
    key: Key,
    size: u64,
    tier: alkblobs::Tier,
    outcome: alkblobs::PutOutcome,
    source: String,
}

async fn put(ctx: &Ctx, files: &[PathBuf], root: bool) -> Res {
    let store = ctx.open_write().await?;
    let mut lines = Vec::new();
    for f in files {
        let (put, source) = if f == Path::new("-") {
            (store.put_reader(tokio::io::stdin()).await?, "-".to_owned())
        } else {
            let len = std::fs::metadata(f).map(|m| m.len()).ok();
            let put = match len {
                Some(n) if n > 8 * 1024 * 1024 => {
                    let pb = ctx.bar(
                        Some(n),
                        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                    );
                    pb.set_message(f.display().to_string());
                    let file = tokio::fs::File::open(f)
                        .await
                        .map_err(|source| Error::Input {
                            what: f.display().to_string(),
                            source,
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
        drop(put.pin);
    }
    if ctx.json {
        print_json(&lines)?;
    }
    Ok(())
}

async fn get(ctx: &Ctx, key: &str, output: Option<&Path>) -> Res {
    let key = parse_key(key)?;
    let store = ctx.open_read().await?;
    let mut reader = store
        .open_read_verified(&key)
        .await?
        .ok_or(Error::NotFound { key })?;
    let integrity = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::InvalidData {
            fail(4, e.to_string())
        } else {
            fail(1, format!("reading blob {key}: {e}"))
        }
    };
    match output {
        None => {
            let mut out = tokio::io::stdout();
            tokio::io::copy(&mut reader, &mut out)
                .await
                .map_err(integrity)?;
            out.flush().await.map_err(|e| fail(1, e.to_string()))?;
        }
        Some(path) => {
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let tmp = dir.join(format!(".{}.alkblobs-tmp", key));
            let mut f = tokio::fs::File::create(&tmp)
                .await
                .map_err(|e| fail(1, format!("cannot create {}: {e}", tmp.display())))?;
            let copied = tokio::io::copy(&mut reader, &mut f).await;
            if let Err(e) = copied {
                let _ = tokio::fs::remove_file(&tmp).await;
                return Err(integrity(e));
            }
            f.sync_all().await.map_err(|e| fail(1, e.to_string()))?;
            tokio::fs::rename(&tmp, path)
                .await
                .map_err(|e| fail(1, format!("cannot write {}: {e}", path.display())))?;
        }
    }
    Ok(())
}

async fn stat(ctx: &Ctx, key: &str) -> Res {
    let key = parse_key(key)?;
    let store = ctx.open_read().await?;
    let meta = store.stat(&key).await?.ok_or(Error::NotFound { key })?;
    if ctx.json {
        print_json(&meta)
    } else {
        println!(
            "key:  {}\nsize: {} ({} bytes)\ntier: {}",
            meta.key,
            HumanBytes(meta.size),
            meta.size,
            meta.tier
        );
        Ok(())
    }
}

async fn ls(ctx: &Ctx, long: bool) -> Res {
    let store = ctx.open_read().await?;
    let mut keys = store.list();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let io = |e: std::io::Error| fail(1, e.to_string());
    if ctx.json {
        write!(out, "[").map_err(io)?;
    }
    let mut first = true;
    while let Some(k) = keys.try_next().await? {
        if ctx.json {
            let sep = if first { "" } else { "," };
            if long {
                if let Some(m) = store.stat(&k).await? {
                    write!(
                        out,
                        "{sep}\n  {}",
                        serde_json::to_string(&m).unwrap_or_default()
                    )
                    .map_err(io)?;
                }
            } else {
                write!(out, "{sep}\n  \"{k}\"").map_err(io)?;
            }
        } else if long {
            if let Some(m) = store.stat(&k).await? {
                writeln!(out, "{k}  {:>12}  {}", m.size, m.tier).map_err(io)?;
            }
        } else {
            writeln!(out, "{k}").map_err(io)?;
        }
        first = false;
    }
    if ctx.json {
        writeln!(out, "{}]", if first { "" } else { "\n" }).map_err(io)?;
    }
    out.flush().map_err(io)
}

async fn verify(ctx: &Ctx) -> Res {
    let store = ctx.open_read().await?;
    let pb = ctx.bar(None, "{spinner} verifying: {msg}");
    let report = store
        .verify_with(|p| pb.set_message(format!("{} blobs, {}", p.checked, HumanBytes(p.bytes))))
        .await?;
    pb.finish_and_clear();
    if ctx.json {
        print_json(&report)?;
    } else {
        for c in &report.corrupt {
            println!("corrupt  {}  ({}: {})", c.key, c.tier, c.detail);
        }
        for k in &report.missing {
            println!("missing  {k}  (a root with no content)");
        }
        println!(
            "verified {} blobs ({}): {} corrupt, {} missing",
            report.checked,
            HumanBytes(report.bytes),
            report.corrupt.len(),
            report.missing.len()
        );
    }
    if report.is_clean() {
        Ok(())
    } else {
        Err(fail(
            4,
            format!(
                "{} corrupt and {} missing entries",
                report.corrupt.len(),
                report.missing.len()
            ),
        ))
    }
}

async fn usage(ctx: &Ctx) -> Res {
    let store = ctx.open_read().await?;
    let u = store.usage().await?;
    if ctx.json {
        return print_json(&u);
    }
    println!("{:<6} {:>10} {:>12}  engine", "tier", "entries", "bytes");
    println!(
        "{:<6} {:>10} {:>12}  {}",
        "kv",
        u.kv.entries,
        HumanBytes(u.kv.bytes).to_string(),
        u.kv.engine
    );
    if let Some(l) = &u.large {
        println!(
            "{:<6} {:>10} {:>12}  {}",
            "large",
            l.entries,
            HumanBytes(l.bytes).to_string(),
            l.engine
        );
    }
    let total = u.kv.bytes + u.large.as_ref().map_or(0, |l| l.bytes);
    println!(
        "total  {:>10} {:>12}",
        u.kv.entries + u.large.as_ref().map_or(0, |l| l.entries),
        HumanBytes(total).to_string()
    );
    println!("roots: {}, staged for deletion: {}", u.roots, u.staged);
    Ok(())
}

async fn pin(ctx: &Ctx, keys: &[String]) -> Res {
    let keys: Vec<Key> = keys.iter().map(|k| parse_key(k)).collect::<Res<_>>()?;
    let store = ctx.open_write().await?;
    for key in keys {
        // `pin` fails if the key is absent or collected; the root is recorded
        // while the pin is held, so the protection is continuous.
        let guard = store.pin(&key).await?;
        store.add_roots(&[key]).await?;
        drop(guard);
        if !ctx.json {
            println!("pinned {key}");
        }
    }
    Ok(())
}

async fn roots(ctx: &Ctx, action: &RootsCmd) -> Res {
    match action {
        RootsCmd::Add { keys } | RootsCmd::Rm { keys } => {
            let keys: Vec<Key> = keys.iter().map(|k| parse_key(k)).collect::<Res<_>>()?;
            let store = ctx.open_write().await?;
            let (n, verb) = if matches!(action, RootsCmd::Add { .. }) {
                (store.add_roots(&keys).await?, "added")
            } else {
                (store.remove_roots(&keys).await?, "removed")
            };
            if ctx.json {
                print_json(&serde_json::json!({ verb: n }))
            } else {
                println!("{verb} {n} root(s)");
                Ok(())
            }
        }
        RootsCmd::Ls => {
            let store = ctx.open_read().await?;
            let roots: Vec<Key> = store.roots().try_collect().await?;
            if ctx.json {
                print_json(&roots)
            } else {
                roots.iter().for_each(|k| println!("{k}"));
                Ok(())
            }
        }
    }
}

fn read_roots_file(path: &Path) -> Res<HashSet<Key>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| fail(2, format!("cannot read roots file {}: {e}", path.display())))?;
    let mut set = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let key = line
            .parse::<Key>()
            .map_err(|e| fail(2, format!("{}:{}: invalid key: {e}", path.display(), i + 1)))?;
        set.insert(key);
    }
    Ok(set)
}

fn due_text(visible_after_ms: Option<i64>) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    match visible_after_ms {
        None => "being staged".into(),
        Some(v) if v <= now => "due now".into(),
        Some(v) => {
            let secs = ((v - now) as u64).div_ceil(1000);
            format!(
                "due in {}",
                humantime::format_duration(Duration::from_secs(secs))
            )
        }
    }
}

#[derive(Serialize)]
struct StagedLine {
    key: Key,
    staged_at_ms: i64,
    visible_after_ms: Option<i64>,
    due: String,
}

async fn staged(ctx: &Ctx) -> Res {
    let store = ctx.open_read().await?;
    let mut after = None;
    let mut all = Vec::new();
    loop {
        let rows = store.staged(after, 4096).await?;
        let Some(last) = rows.last() else { break };
        after = Some(last.key);
        for r in rows {
            let line = StagedLine {
                key: r.key,
                staged_at_ms: r.staged_at_ms,
                visible_after_ms: r.visible_after_ms,
                due: due_text(r.visible_after_ms),
            };
            if ctx.json {
                all.push(line);
            } else {
                println!("{}  {}", line.key, line.due);
            }
        }
    }
    if ctx.json {
        print_json(&all)?;
    }
    Ok(())
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

async fn gc(
    ctx: &Ctx,
    roots_files: &[PathBuf],
    window: Option<Duration>,
    dry_run: bool,
    status: bool,
) -> Res {
    if status {
        return staged(ctx).await;
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
        let extra = std::sync::Arc::new(extra);
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
        Some(cause) => Err(fail(6, format!("sweep aborted: {cause}"))),
        None => Ok(()),
    }
}

async fn run(cli: Cli) -> Res {
    let ctx = Ctx {
        dir: cli.data_dir.clone().unwrap_or_else(default_data_dir),
        json: cli.json,
        wait: cli.wait,
        progress: !cli.quiet && std::io::stderr().is_terminal(),
    };
    match &cli.command {
        Command::Put { files, root } => put(&ctx, files, *root).await,
        Command::Get { key, output } => get(&ctx, key, output.as_deref()).await,
        Command::Stat { key } => stat(&ctx, key).await,
        Command::Ls { long } => ls(&ctx, *long).await,
        Command::Verify => verify(&ctx).await,
        Command::Usage => usage(&ctx).await,
        Command::Pin { keys } => pin(&ctx, keys).await,
        Command::Roots { action } => roots(&ctx, action).await,
        Command::Gc {
            roots_files,
            window,
            dry_run,
            status,
        } => gc(&ctx, roots_files, *window, *dry_run, *status).await,
        Command::Staged => staged(&ctx).await,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ALKBLOBS_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("alkblobs: error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("alkblobs: error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}
