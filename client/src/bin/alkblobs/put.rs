//! `put`: store files, directories (`-r`) or stdin, creating the store if
//! need be. Small files are read ahead on a thread of their own and
//! committed in batches (one transaction, one fsync, per batch: by count,
//! bytes and time); a key is printed once its batch is durable. Large
//! files, stdin and named FIFOs stream on their own. An input that cannot
//! be read does not stop the others: the failures are reported at the end
//! (exit 2).

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use alkblobs::{Error, Key, PutOutcome, Store, Tier};
use bytes::Bytes;
use indicatif::ProgressBar;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::ctx::Ctx;
use crate::exit::{Exit, Fail, Res};
use crate::output::print_json;

/// Files above this size stream through a progress bar of their own.
const PROGRESS_OVER: u64 = 8 * 1024 * 1024;
/// A batch commits at this many files,
const BATCH_FILES: usize = 1000;
/// or this many bytes,
const BATCH_BYTES: usize = 16 << 20;
/// or this long after its first file arrived (a slow source still sees its
/// keys printed).
const BATCH_WAIT: Duration = Duration::from_millis(250);
/// Files read ahead of the commits,
const READ_AHEAD: usize = 2 * BATCH_FILES;
/// handed over this many at a time (one wake-up each, not one per file),
const HANDOVER: usize = 64;
/// or this many bytes (so what is read ahead stays under
/// `READ_AHEAD / HANDOVER` MiB, whatever the files' sizes),
const HANDOVER_BYTES: usize = 1 << 20;
/// or after this long (a slow source still sees its batch go out).
const HANDOVER_WAIT: Duration = Duration::from_millis(20);

/// One stored input, as `--json` prints it.
#[derive(Serialize)]
struct PutLine {
    key: Key,
    size: u64,
    tier: Tier,
    outcome: PutOutcome,
    source: String,
}

/// What the walk finds, in input order.
enum Found {
    /// A file to read.
    File(Input),
    /// Named or listed, and not stored (exit 2).
    Failed(PathBuf, String),
    /// Skipped by design under a directory (said, not an error).
    Skipped(PathBuf, String),
}

/// What a directory entry of `-r` is, when it is not stored.
fn not_stored(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// One input to read.
struct Input {
    path: PathBuf,
    /// Known to be a regular file (listed under a directory): opened at
    /// once. A named one may be a FIFO, which must be opened only once.
    regular: bool,
}

/// The files an argument names, handed to `found` as they are listed
/// (nothing of a tree is kept but the directory being listed, so memory
/// does not grow with the tree): itself, or with `-r` every regular file
/// under a directory (sorted by name; symbolic links to files are
/// followed, those to directories are not, so a link cycle cannot loop).
/// A dangling link or a link loop is a failure; FIFOs, sockets, devices
/// and links to directories under a directory are skipped, each said. An
/// unreadable directory or a directory without `-r` is a failure of its
/// own. Stops when `found` returns false.
fn walk(arg: &Path, recursive: bool, found: &mut dyn FnMut(Found) -> bool) -> bool {
    if arg == Path::new("-") || !arg.is_dir() {
        // Named: read whatever it is (a FIFO streams, `<(cmd)` works).
        return found(Found::File(Input {
            path: arg.to_owned(),
            regular: false,
        }));
    }
    if !recursive {
        return found(Found::Failed(
            arg.to_owned(),
            "is a directory (store its files with -r)".into(),
        ));
    }
    // The type from the listing itself (no stat per entry), names compared
    // as bytes (one component each: the order `Path` would give).
    let mut entries: Vec<(std::ffi::OsString, std::io::Result<std::fs::FileType>)> =
        match std::fs::read_dir(arg) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| (e.file_name(), e.file_type())))
                .collect(),
            Err(e) => return found(Found::Failed(arg.to_owned(), format!("cannot list: {e}"))),
        };
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    for (name, t) in entries {
        let p = arg.join(name);
        let go_on = match t {
            Err(_) => found(Found::Failed(p, "vanished while listed".into())),
            Ok(t) if t.is_dir() => walk(&p, true, found),
            Ok(t) if t.is_file() => found(Found::File(Input {
                path: p,
                regular: true,
            })),
            Ok(t) if t.is_symlink() => match std::fs::metadata(&p) {
                Ok(m) if m.is_file() => found(Found::File(Input {
                    path: p,
                    regular: true,
                })),
                Ok(m) if m.is_dir() => found(Found::Skipped(
                    p,
                    "a symbolic link to a directory (not followed)".into(),
                )),
                Ok(m) => found(Found::Skipped(
                    p,
                    format!("a symbolic link to {}", not_stored(m.file_type())),
                )),
                Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                    found(Found::Failed(p, "a symbolic link loop".into()))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => found(Found::Failed(
                    p,
                    "a dangling symbolic link (its target does not exist)".into(),
                )),
                Err(e) => found(Found::Failed(p, format!("cannot read: {e}"))),
            },
            Ok(t) => found(Found::Skipped(p, not_stored(t).into())),
        };
        if !go_on {
            return false;
        }
    }
    true
}

/// An input as the read-ahead thread found it.
enum Ahead {
    /// A regular file of at most the threshold, read whole: batched.
    Small {
        bytes: Bytes,
        /// Its size when it was opened.
        listed: u64,
    },
    /// Streamed on its own: over the threshold, stdin, not a regular file.
    Stream,
    /// Could not be read.
    Failed(String),
    /// Skipped by design (under a directory: a FIFO, a link to one).
    Skipped(String),
}

/// Reads one input for the batch, if it is a small regular file.
fn read_ahead(input: &Input, threshold: u64) -> Ahead {
    let path = input.path.as_path();
    if path == Path::new("-") {
        return Ahead::Stream;
    }
    // A named input is not opened unless regular: opening a FIFO here
    // would take what the stream needs (and block until a writer comes).
    if !input.regular {
        match std::fs::metadata(path) {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Ahead::Stream,
            Err(e) => return Ahead::Failed(format!("cannot read: {e}")),
        }
    }
    // Non-blocking: a path swapped for a FIFO since it was listed is
    // seen by `fstat` below instead of waiting for a writer for ever.
    let mut file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) => return Ahead::Failed(format!("cannot read: {e}")),
    };
    let listed = match file.metadata() {
        Ok(m) if m.is_file() && m.len() <= threshold => m.len(),
        Ok(_) => return Ahead::Stream,
        Err(e) => return Ahead::Failed(format!("cannot read: {e}")),
    };
    let mut buf = Vec::with_capacity(listed as usize + 1);
    match (&mut file).take(threshold + 1).read_to_end(&mut buf) {
        // It grew past the threshold while read: streamed instead.
        Ok(_) if buf.len() as u64 > threshold => Ahead::Stream,
        Ok(_) => Ahead::Small {
            bytes: buf.into(),
            listed,
        },
        Err(e) => Ahead::Failed(format!("cannot read: {e}")),
    }
}

/// Stores one input as a stream: `Ok(Err(why))` when it could not be read
/// (the failure to report), an error when the store failed.
/// `len`: the file's size when listed (`None`: standard input).
async fn put_one(
    ctx: &Ctx,
    store: &Store,
    f: &Path,
    len: Option<u64>,
) -> Res<Result<alkblobs::Put, String>> {
    let Some(len) = len else {
        return Ok(Ok(store.put_reader(tokio::io::stdin()).await?));
    };
    let unreadable = |e: &dyn std::fmt::Display| Ok(Err(format!("cannot read: {e}")));
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

fn stdout_failed(e: std::io::Error) -> Fail {
    Fail::new(
        Exit::Failure,
        format!("cannot write to standard output: {e}"),
    )
}

/// Small files waiting for their commit.
#[derive(Default)]
struct Batch {
    paths: Vec<PathBuf>,
    listed: Vec<u64>,
    blobs: Vec<Bytes>,
    bytes: usize,
    since: Option<Instant>,
}

impl Batch {
    fn push(&mut self, path: PathBuf, bytes: Bytes, listed: u64) {
        self.since.get_or_insert_with(Instant::now);
        self.bytes += bytes.len();
        self.paths.push(path);
        self.listed.push(listed);
        self.blobs.push(bytes);
    }

    fn full(&self) -> bool {
        self.paths.len() >= BATCH_FILES || self.bytes >= BATCH_BYTES
    }
}

/// Where stored inputs go: printed as they become durable (text), or
/// collected (`--json`: a put that fails in the store prints no
/// half-array).
struct Emit<'a> {
    ctx: &'a Ctx,
    store: &'a Store,
    root: bool,
    lines: Vec<PutLine>,
    out: std::io::BufWriter<std::io::Stdout>,
    /// Files whose size changed while they were read (stored as read).
    changed: Vec<(String, String)>,
}

impl Emit<'_> {
    /// Records `puts` (committed) as roots if asked, and as the lines of
    /// `--json` and the warnings; returns the keys to print.
    async fn stored(&mut self, puts: Vec<(PathBuf, u64, alkblobs::PutInfo)>) -> Res<Vec<Key>> {
        if self.root {
            // Recorded before the pin is released: no sweep can slip between.
            let keys: Vec<Key> = puts.iter().map(|(_, _, p)| p.key).collect();
            self.store.add_roots(&keys).await?;
        }
        let mut keys = Vec::new();
        for (path, listed, p) in puts {
            if listed != p.size {
                self.changed.push((
                    path.display().to_string(),
                    format!(
                        "changed while it was read ({listed} bytes when opened, {} stored)",
                        p.size
                    ),
                ));
            }
            if self.ctx.json {
                self.lines.push(PutLine {
                    key: p.key,
                    size: p.size,
                    tier: p.tier,
                    outcome: p.outcome,
                    source: path.display().to_string(),
                });
            } else {
                keys.push(p.key);
            }
        }
        Ok(keys)
    }

    /// Prints keys, one per line, in input order (`--json` pairs them with
    /// their paths at the end): only keys whose commit has returned.
    fn print(&mut self, keys: &[Key]) -> Res {
        for k in keys {
            writeln!(self.out, "{k}").map_err(stdout_failed)?;
        }
        self.out.flush().map_err(stdout_failed)
    }

    /// Lets the pins of printed keys go.
    fn release(&self, pin: alkblobs::PinGuard) {
        if self.ctx.pg.as_ref().is_some_and(|pg| pg.fleet) {
            // A fleet pin is a row: left in place, it protects the content
            // for one pin TTL after this process exits (its renewal stops
            // with it), time to reference the key in a liveness table.
            std::mem::forget(pin);
        } else {
            drop(pin);
        }
    }

    /// Commits the batch (one transaction), then prints its keys.
    async fn flush(&mut self, batch: &mut Batch, bar: &ProgressBar) -> Res {
        if batch.paths.is_empty() {
            return Ok(());
        }
        let b = std::mem::take(batch);
        let n = b.paths.len() as u64;
        let many = self.store.put_many(b.blobs).await?;
        let puts = b
            .paths
            .into_iter()
            .zip(b.listed)
            .zip(many.entries)
            .map(|((path, listed), p)| (path, listed, p))
            .collect();
        let keys = self.stored(puts).await?;
        self.print(&keys)?;
        self.release(many.pin);
        bar.inc(n);
        Ok(())
    }
}

pub async fn put(ctx: &Ctx, args: &[PathBuf], root: bool, recursive: bool) -> Res {
    let mut failed: Vec<(String, String)> = Vec::new();
    let store = ctx.create().await?;
    // Many files: one bar counting them (big ones add their own). The walk
    // streams, so there is no total to show.
    let count_bar = if args.len() > 1 || recursive {
        ctx.bar(None, "{spinner} {pos} files {wide_msg}")
    } else {
        ProgressBar::hidden()
    };
    // The read-ahead thread walks the inputs in order, reading small files
    // whole, as far ahead of the commits as the channel holds.
    let (tx, mut rx) = mpsc::channel::<Vec<(PathBuf, Ahead)>>(READ_AHEAD / HANDOVER);
    let threshold = store.threshold();
    let args = args.to_vec();
    let reader = tokio::task::spawn_blocking(move || {
        let mut chunk = Vec::with_capacity(HANDOVER);
        let mut bytes = 0usize;
        let mut since = Instant::now();
        let mut send = |found: Found| {
            let item = match found {
                Found::File(input) => {
                    let a = read_ahead(&input, threshold);
                    (input.path, a)
                }
                Found::Failed(p, why) => (p, Ahead::Failed(why)),
                Found::Skipped(p, why) => (p, Ahead::Skipped(why)),
            };
            if chunk.is_empty() {
                since = Instant::now();
                bytes = 0;
            }
            if let Ahead::Small { bytes: b, .. } = &item.1 {
                bytes += b.len();
            }
            chunk.push(item);
            if chunk.len() < HANDOVER && bytes < HANDOVER_BYTES && since.elapsed() < HANDOVER_WAIT {
                return true;
            }
            // An error: the store failed, nothing more is wanted.
            tx.blocking_send(std::mem::replace(&mut chunk, Vec::with_capacity(HANDOVER)))
                .is_ok()
        };
        for a in &args {
            if !walk(a, recursive, &mut send) {
                return;
            }
        }
        if !chunk.is_empty() {
            let _ = tx.blocking_send(chunk);
        }
    });
    // Inputs named or found (skipped ones aside): the total of the closing
    // count.
    let mut total = 0usize;
    let mut emit = Emit {
        ctx,
        store: &store,
        root,
        lines: Vec::new(),
        out: std::io::BufWriter::new(std::io::stdout()),
        changed: Vec::new(),
    };
    let mut batch = Batch::default();
    let mut arrived = Vec::new().into_iter();
    loop {
        let Some((path, ahead)) = arrived.next() else {
            let next = match batch.since {
                Some(since) => {
                    match tokio::time::timeout_at((since + BATCH_WAIT).into(), rx.recv()).await {
                        Ok(next) => next,
                        Err(_) => {
                            emit.flush(&mut batch, &count_bar).await?;
                            continue;
                        }
                    }
                }
                None => rx.recv().await,
            };
            match next {
                Some(chunk) => arrived = chunk.into_iter(),
                None => break,
            }
            continue;
        };
        match ahead {
            Ahead::Small { bytes, listed } => {
                total += 1;
                batch.push(path, bytes, listed);
                if batch.full() {
                    emit.flush(&mut batch, &count_bar).await?;
                }
            }
            Ahead::Failed(why) => {
                total += 1;
                failed.push((path.display().to_string(), why));
                count_bar.inc(1);
            }
            Ahead::Skipped(why) => {
                count_bar.suspend(|| eprintln!("alkblobs: {}: skipped: {why}", path.display()));
            }
            Ahead::Stream => {
                total += 1;
                // In input order: the batch before it commits first.
                emit.flush(&mut batch, &count_bar).await?;
                count_bar.set_message(path.display().to_string());
                let meta = if path == Path::new("-") {
                    None
                } else {
                    match std::fs::metadata(&path) {
                        Ok(m) => Some(m),
                        Err(e) => {
                            failed.push((path.display().to_string(), format!("cannot read: {e}")));
                            count_bar.inc(1);
                            continue;
                        }
                    }
                };
                let len = meta.as_ref().map(|m| m.len());
                let listed = meta.filter(|m| m.is_file());
                match put_one(ctx, &store, &path, len).await? {
                    Ok(put) => {
                        let info = alkblobs::PutInfo {
                            key: put.key,
                            size: put.size,
                            tier: put.tier,
                            outcome: put.outcome,
                        };
                        let listed = listed.map_or(put.size, |m| m.len());
                        let keys = emit.stored(vec![(path, listed, info)]).await?;
                        emit.print(&keys)?;
                        emit.release(put.pin);
                    }
                    Err(why) => failed.push((path.display().to_string(), why)),
                }
                count_bar.inc(1);
            }
        }
    }
    emit.flush(&mut batch, &count_bar).await?;
    drop(rx);
    // A walk that died (a panic) ended the channel early: not a success.
    if let Err(e) = reader.await {
        return Err(Fail::new(
            Exit::Failure,
            format!("reading the inputs failed: {e}"),
        ));
    }
    count_bar.finish_and_clear();
    if ctx.json {
        print_json(&emit.lines)?;
    }
    for (path, why) in &emit.changed {
        eprintln!("alkblobs: {path}: warning: {why}");
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
            total
        ),
    ))
}
