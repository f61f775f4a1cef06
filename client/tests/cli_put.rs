//! `alkblobs put` of many inputs, driven as a user would: small files
//! commit in batches and each key is printed once durable, in input order;
//! what a tree holds that is not a regular file is said, one line each.

mod common;

use std::io::BufRead;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use alkblobs::{Key, Store};
use common::{Tmpfs, b3, cmd, code, run, stderr, stdout};

/// A blob of several 16 KiB groups, over the default kv threshold.
fn groups_blob(len: u32) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect()
}

/// The content of small file `i` (1.0–1.6 KiB, distinct).
fn small(i: usize) -> Vec<u8> {
    let mut v = format!("file {i}\n").into_bytes();
    v.resize(1024 + (i * 37) % 600, (i % 251) as u8);
    v
}

/// `n` small files under `dir`, in directories of 500; returns each
/// file's content in path order.
fn tree(dir: &Path, n: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for i in 0..n {
        let sub = dir.join(format!("d{:03}", i / 500));
        std::fs::create_dir_all(&sub).unwrap();
        let v = small(i);
        std::fs::write(sub.join(format!("f{i:06}")), &v).unwrap();
        out.push(v);
    }
    out
}

#[test]
fn put_r_stores_a_tree_and_reports_what_it_could_not_read_at_the_end() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::create_dir_all(d.join("tree/a/c")).unwrap();
    std::fs::write(d.join("tree/a/b.txt"), b"b").unwrap();
    std::fs::write(d.join("tree/a/c/d.bin"), groups_blob(100_000)).unwrap();
    std::fs::write(d.join("tree/e.txt"), b"e").unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", d.join("tree/dangling")).unwrap();
    std::fs::write(d.join("other.txt"), b"other").unwrap();

    // A directory without -r is refused; the other inputs are stored.
    let o = run(d, &["put", "tree", "other.txt"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("tree: is a directory"),
        "{}",
        stderr(&o)
    );
    assert_eq!(stdout(&o).trim(), b3(b"other"));

    // With -r: every file, in path order, each paired with its key in
    // --json; an unreadable input in the middle does not stop the rest,
    // and a dangling link is named.
    let o = run(
        d,
        &["--json", "put", "-r", "tree", "missing.bin", "other.txt"],
    );
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = serde_json::from_str(&stdout(&o)).unwrap();
    let pairs: Vec<(String, String)> = lines
        .iter()
        .map(|l| {
            (
                l["source"].as_str().unwrap().to_owned(),
                l["key"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        pairs,
        vec![
            ("tree/a/b.txt".to_owned(), b3(b"b")),
            ("tree/a/c/d.bin".to_owned(), b3(&groups_blob(100_000))),
            ("tree/e.txt".to_owned(), b3(b"e")),
            ("other.txt".to_owned(), b3(b"other")),
        ]
    );
    let err = stderr(&o);
    assert!(err.contains("missing.bin: cannot read"), "{err}");
    assert!(
        err.contains("tree/dangling: a dangling symbolic link"),
        "{err}"
    );
    assert!(err.contains("2 of 6 inputs could not be stored"), "{err}");
    assert_eq!(
        run(d, &["get", &b3(&groups_blob(100_000)), "--range", "0-9"]).stdout,
        groups_blob(100_000)[..10]
    );
}

/// FIFOs, sockets and links to directories under a tree are skipped by
/// design, each said on stderr (exit 0 for those alone); a link loop is a
/// failure (exit 2). A FIFO named on the command line is read as a stream.
#[test]
fn put_r_names_what_it_skips_and_reads_a_named_fifo() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let t = d.join("tree");
    std::fs::create_dir_all(t.join("sub")).unwrap();
    std::fs::write(t.join("a.txt"), b"a").unwrap();
    let fifo = |p: &Path| {
        let s = Command::new("mkfifo").arg(p).status().unwrap();
        assert!(s.success());
    };
    fifo(&t.join("pipe"));
    let _sock = std::os::unix::net::UnixListener::bind(t.join("sock")).unwrap();
    std::os::unix::fs::symlink("sub", t.join("to-dir")).unwrap();

    let o = run(d, &["put", "-r", "tree"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), b3(b"a"));
    let err = stderr(&o);
    assert!(err.contains("tree/pipe: skipped: a FIFO"), "{err}");
    assert!(err.contains("tree/sock: skipped: a socket"), "{err}");
    assert!(
        err.contains("tree/to-dir: skipped: a symbolic link to a directory"),
        "{err}"
    );

    std::os::unix::fs::symlink("loop", t.join("loop")).unwrap();
    let o = run(d, &["put", "-r", "tree"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("tree/loop: a symbolic link loop"), "{err}");
    assert!(err.contains("1 of 2 inputs could not be stored"), "{err}");

    // Named, a FIFO is read to its end (opened once: a put that opened it
    // twice would wait for a second writer for ever).
    let p = t.join("pipe");
    let writer = std::thread::spawn(move || std::fs::write(p, b"through a pipe").unwrap());
    let mut child = cmd(d, &["put", "tree/pipe"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            // Let the writer go, if it still waits for a reader.
            let _ = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(t.join("pipe"));
            panic!("put of a named FIFO did not finish in 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), b3(b"through a pipe"));
}

/// Thousands of small files (several batches), a large file and duplicate
/// content among them: every key printed once, in path order, every blob
/// stored and rooted; the store verifies.
#[test]
fn put_r_of_many_files_prints_every_key_in_input_order_across_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let t = d.join("tree");
    let mut contents = tree(&t, 2_300);
    // A large file between batches, and a copy of an early file late on.
    std::fs::write(t.join("d001/f000700-large"), groups_blob(200_000)).unwrap();
    contents.insert(701, groups_blob(200_000));
    std::fs::write(t.join("d004/f999999-copy"), small(3)).unwrap();
    contents.push(small(3));

    let o = run(d, &["put", "--root", "-r", "tree"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let printed: Vec<String> = stdout(&o).lines().map(str::to_owned).collect();
    let expected: Vec<String> = contents.iter().map(|c| b3(c)).collect();
    assert_eq!(printed.len(), expected.len());
    assert_eq!(printed, expected);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = Store::open_dir(d.join("data")).await.unwrap();
        for (k, c) in printed.iter().zip(&contents) {
            let key: Key = k.parse().unwrap();
            assert_eq!(store.get(&key).await.unwrap().unwrap(), c[..], "{k}");
        }
        let roots: Vec<Key> = futures_roots(&store).await;
        assert_eq!(roots.len(), expected.len() - 1, "one root per distinct key");
        store.close().await.unwrap();
    });
    let o = run(d, &["verify"]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
}

async fn futures_roots(store: &Store) -> Vec<Key> {
    use futures::TryStreamExt;
    store.roots().try_collect().await.unwrap()
}

/// Every printed key is the key of the input at its place (path order)
/// and reads back as that input from the store at `dir/data`; returns how
/// the store's close went.
fn printed_are_stored(
    dir: &Path,
    printed: &[String],
    contents: &[Vec<u8>],
    case: &str,
) -> alkblobs::Result<()> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = Store::open_dir(dir.join("data")).await.unwrap();
        for (k, c) in printed.iter().zip(contents) {
            assert_eq!(*k, b3(c), "{case}: printed in path order");
            let key: Key = k.parse().unwrap();
            let got = store.get(&key).await.unwrap();
            assert_eq!(
                got.as_deref(),
                Some(&c[..]),
                "{case}: printed {k}, not stored"
            );
        }
        store.close().await
    })
}

/// `put -r` killed (SIGKILL) or interrupted (SIGINT, a Ctrl-C) part-way
/// through many batches: every key it printed is readable afterwards, and
/// the store verifies. (A key printed before its batch committed would be
/// gone.)
#[test]
fn a_put_r_killed_mid_run_leaves_every_printed_key_readable() {
    for signal in ["KILL", "INT"] {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let contents = tree(&d.join("tree"), 30_000);
        let mut child = cmd(d, &["put", "-r", "tree"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut printed = Vec::new();
        let mut line = String::new();
        while printed.len() < 2_500 && out.read_line(&mut line).unwrap() > 0 {
            printed.push(line.trim().to_owned());
            line.clear();
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "SIG{signal}: it finished before the signal"
        );
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        // What it wrote before it died.
        while out.read_line(&mut line).unwrap() > 0 {
            printed.push(line.trim().to_owned());
            line.clear();
        }
        let status = child.wait().unwrap();
        assert!(!status.success(), "SIG{signal}: it ran to the end");
        assert!(
            printed.len() >= 2_500 && printed.len() < contents.len(),
            "SIG{signal}: killed part-way: {} of {} printed",
            printed.len(),
            contents.len()
        );
        printed_are_stored(d, &printed, &contents, &format!("SIG{signal}"))
            .expect("close the store");
        let o = run(d, &["verify"]);
        assert_eq!(code(&o), 0, "{}", stdout(&o));
    }
}

/// A file whose size changes between its opening and the end of its read
/// is stored as read, with a warning naming it (procfs files say 0 bytes
/// and read as more: the same path, deterministically).
#[test]
fn a_file_that_changes_while_read_is_stored_as_read_and_named() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let o = run(d, &["put", "/proc/version"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let key = stdout(&o).trim().to_owned();
    let err = stderr(&o);
    assert!(
        err.contains("/proc/version: warning: changed while it was read (0 bytes when opened,"),
        "{err}"
    );
    let got = run(d, &["get", &key]);
    assert_eq!(got.stdout, std::fs::read("/proc/version").unwrap());
}

/// The disk fills part-way through a tree (a 4 MiB tmpfs under the data
/// directory; needs root, as the power-cut test does): a clear error, no
/// key printed that is not stored, and the store opens and verifies after.
#[test]
fn a_disk_that_fills_mid_batch_prints_no_key_it_did_not_store() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let _fs = Tmpfs::mount(&d.join("data"), "4m");
    let contents = tree(&d.join("tree"), 3_000);
    let o = run(d, &["put", "-r", "tree"]);
    assert_ne!(
        code(&o),
        0,
        "3.8 MiB of files and their index fit in 4 MiB?"
    );
    let err = stderr(&o);
    // One error line naming the cause (and a warning that the close could
    // not checkpoint, for the same cause).
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("alkblobs: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(errors[0].contains("database or disk is full"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let printed: Vec<String> = stdout(&o).lines().map(str::to_owned).collect();
    assert!(
        !printed.is_empty() && printed.len() < contents.len(),
        "full part-way: {} of {} printed",
        printed.len(),
        contents.len()
    );
    // The disk is still full: the close cannot checkpoint the log into
    // the database (it stays, and is read on the next open).
    let _ = printed_are_stored(d, &printed, &contents, "full disk");
    let v = run(d, &["verify"]);
    assert_eq!(code(&v), 0, "{}{}", stdout(&v), stderr(&v));
}
