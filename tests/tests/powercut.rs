//! Power cuts: the embedded store (`sqlite` index, `local` large tier,
//! durable) loses at a cut every write it had not fsynced, and still keeps
//! what it promised.
//!
//! The store runs on `lossyfs` (src/bin/lossyfs.rs), a FUSE filesystem
//! that keeps what a disk would still hold after a power cut — each
//! file's bytes as of its last fsync, each directory's entries as of its
//! last fsync — and nothing else. The workload (`alkblobs-test-helper
//! powercut`) puts blobs of both tiers one at a time and in a batch,
//! roots them, puts garbage, unroots two, sweeps (deleting the garbage)
//! and puts again, printing each step once it returned. A first run
//! without a cut counts the filesystem requests of each phase; then, for
//! cut points spread over every phase, the workload runs afresh and the
//! power is cut just before that request: the durable image is what a
//! reboot finds. On it, reopened on an ordinary filesystem: the store
//! opens, `verify` finds nothing torn, missing or half-deleted, every
//! acknowledged durable put is there and whole unless a sweep that had
//! begun could collect it (a root acknowledged and not withdrawn: always
//! there), and every acknowledged root is still a root.
//!
//! Needs root, /dev/fuse and `fusermount3` (Debian's fuse3, which
//! scripts/test.sh installs); without them the test fails, it never skips.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use alkblobs::{Key, Store};
use futures::TryStreamExt;

const HELPER: &str = env!("CARGO_BIN_EXE_alkblobs-test-helper");
const LOSSYFS: &str = env!("CARGO_BIN_EXE_lossyfs");
/// Cut points per phase (besides each phase's first request).
const CUTS_PER_PHASE: u64 = 11;

fn mounted(mnt: &Path) -> bool {
    let want = mnt.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(want))
}

fn unmount(mnt: &Path) {
    let _ = Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(mnt)
        .status();
    let t0 = Instant::now();
    while mounted(mnt) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{mnt:?} stays mounted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// lossyfs serving `src` at `mnt`, its durable image going to `img`.
fn lossyfs(src: &Path, mnt: &Path, img: &Path, cut: Option<u64>, log: &Path) -> Child {
    let mut cmd = Command::new(LOSSYFS);
    cmd.arg(src).arg(mnt).arg(img).arg("--log").arg(log);
    if let Some(n) = cut {
        cmd.arg("--cut-at").arg(n.to_string());
    }
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start lossyfs");
    let t0 = Instant::now();
    while !mounted(mnt) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "lossyfs did not mount {mnt:?}: needs root, /dev/fuse and fusermount3 (apt install fuse3)"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

/// The two processes of a run; killed and the mount undone on the way
/// out, also when a check panics.
struct Processes<'a> {
    mnt: &'a Path,
    fs: Child,
    workload: Child,
}

impl Drop for Processes<'_> {
    fn drop(&mut self) {
        // The filesystem first: a process killed while its filesystem
        // stands still cannot exit (closing its files waits for replies).
        let _ = self.fs.kill();
        let _ = self.fs.wait();
        let _ = self.workload.kill();
        let _ = self.workload.wait();
        if mounted(self.mnt) {
            unmount(self.mnt);
        }
    }
}

/// What the workload acknowledged.
#[derive(Default, Debug)]
struct Acks {
    puts: Vec<(Key, bool)>, // (key, acknowledged after the sweep began?)
    roots: HashSet<Key>,
    sweep_started: bool,
    swept: Option<u64>,
    closed: bool,
}

fn acks(path: &Path) -> Acks {
    let mut a = Acks::default();
    for line in std::fs::read_to_string(path).unwrap().lines() {
        let (what, arg) = line.split_once(' ').unwrap_or((line, ""));
        match what {
            "put" => a.puts.push((arg.parse().unwrap(), a.sweep_started)),
            "root" => {
                a.roots.insert(arg.parse().unwrap());
            }
            "unroot" => {
                a.roots.remove(&arg.parse::<Key>().unwrap());
            }
            "sweep-start" => a.sweep_started = true,
            "swept" => a.swept = Some(arg.parse().unwrap()),
            "closed" => a.closed = true,
            other => panic!("unknown acknowledgement {other:?}"),
        }
    }
    a
}

struct Run {
    image: PathBuf,
    acks: Acks,
    /// Requests served (a run without a cut), or the cut's.
    ops: u64,
    phases: BTreeMap<u64, String>,
}

/// One run of the workload on lossyfs, cut at request `cut` (or not).
fn run(base: &Path, src: &Path, tag: &str, cut: Option<u64>) -> Run {
    let mnt = base.join(format!("mnt-{tag}"));
    let img = base.join(format!("img-{tag}"));
    let log = base.join(format!("phases-{tag}"));
    let ack_file = base.join(format!("acks-{tag}"));
    std::fs::create_dir_all(&mnt).unwrap();
    let fs = lossyfs(src, &mnt, &img, cut, &log);
    let workload = Command::new(HELPER)
        .arg("powercut")
        .arg(&mnt)
        .stdout(std::fs::File::create(&ack_file).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the workload");
    let mut p = Processes {
        mnt: &mnt,
        fs,
        workload,
    };
    let t0 = Instant::now();
    let ops = loop {
        if let Some(status) = p.workload.try_wait().unwrap() {
            // It finished before the cut (or there was none): a clean
            // unmount writes the durable image all the same.
            assert!(
                status.success() || cut.is_some(),
                "the uncut workload failed: {status}"
            );
            unmount(&mnt);
            let mut out = String::new();
            std::io::Read::read_to_string(p.fs.stdout.as_mut().unwrap(), &mut out).unwrap();
            break out.trim().parse().unwrap_or(0);
        }
        if img.join(".cut").exists() {
            let n = std::fs::read_to_string(img.join(".cut"))
                .unwrap()
                .parse()
                .unwrap();
            // The power is off: nothing more reaches the disk (dropping
            // `p` kills both and undoes the mount).
            std::fs::remove_file(img.join(".cut")).unwrap();
            break n;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "run {tag} hangs");
        std::thread::sleep(Duration::from_millis(5));
    };
    drop(p);
    let phases = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let (name, at) = l.split_once(' ').unwrap();
            (at.parse().unwrap(), name.to_owned())
        })
        .collect();
    Run {
        image: img,
        acks: acks(&ack_file),
        ops,
        phases,
    }
}

/// What a reboot must find on the image of run `r`.
async fn check(r: &Run, what: &str) {
    let store = Store::open_dir(&r.image)
        .await
        .unwrap_or_else(|e| panic!("{what}: the store does not open after the cut: {e}"));
    let report = store.verify().await.unwrap();
    assert!(
        report.corrupt.is_empty(),
        "{what}: torn blobs {:?}",
        report.corrupt
    );
    assert!(
        report.missing.is_empty(),
        "{what}: roots without content {:?}",
        report.missing
    );
    assert_eq!(report.vanished, 0, "{what}: listed entries without content");
    let roots: HashSet<Key> = store.roots().try_collect().await.unwrap();
    for k in &r.acks.roots {
        assert!(
            roots.contains(k),
            "{what}: an acknowledged root is gone: {k}"
        );
    }
    for (k, after_sweep_began) in &r.acks.puts {
        // Content a sweep that had begun may collect: an unrooted put from
        // before the sweep. Everything else acknowledged must be there.
        let collectable = r.acks.sweep_started && !after_sweep_began && !r.acks.roots.contains(k);
        let got = store
            .get(k)
            .await
            .unwrap_or_else(|e| panic!("{what}: get {k}: {e}"));
        if !collectable {
            let got =
                got.unwrap_or_else(|| panic!("{what}: an acknowledged durable put is lost: {k}"));
            assert_eq!(
                blake3::hash(&got).as_bytes(),
                k.as_bytes(),
                "{what}: {k} is not whole"
            );
        }
    }
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_durable_put_survives_a_power_cut_anywhere() {
    let base = tempfile::tempdir().unwrap();
    let base = base.path();
    // The store as its first open leaves it, on an ordinary filesystem:
    // lossyfs starts from it as from a disk whose contents are durable.
    let src = base.join("src");
    Store::open_dir(&src).await.unwrap().close().await.unwrap();

    let full = run(base, &src, "full", None);
    assert!(
        full.acks.closed,
        "the uncut workload did not finish: {:?}",
        full.acks
    );
    assert!(
        full.acks.swept.unwrap_or(0) >= 6,
        "the sweep should collect the garbage and the unrooted keys: {:?}",
        full.acks.swept
    );
    check(&full, "no cut").await;
    // Phase boundaries, from the first run (later runs differ a little:
    // background checkpoints and group commit move requests around).
    let mut bounds: Vec<(u64, String)> = full.phases.iter().map(|(a, n)| (*a, n.clone())).collect();
    bounds.push((full.ops, "end".into()));
    assert!(
        ["put", "batch", "garbage", "sweep", "after"]
            .iter()
            .all(|p| bounds.iter().any(|(_, n)| n == p)),
        "phases not seen: {bounds:?}"
    );
    let mut cuts = Vec::new();
    for w in bounds.windows(2) {
        let ((start, name), (end, _)) = (&w[0], &w[1]);
        let len = end.saturating_sub(*start).max(1);
        for i in 0..=CUTS_PER_PHASE {
            cuts.push((start + 1 + i * len / (CUTS_PER_PHASE + 1), name.clone()));
        }
    }
    cuts.dedup();
    eprintln!(
        "power-cut: {} requests in the uncut run, phases {bounds:?}; {} cuts",
        full.ops,
        cuts.len()
    );
    let mut reached_sweep = 0;
    for (n, phase) in &cuts {
        let r = run(base, &src, &format!("cut{n}"), Some(*n));
        let what = format!(
            "cut at request {n} (phase {phase}, {} puts acknowledged)",
            r.acks.puts.len()
        );
        check(&r, &what).await;
        if r.acks.sweep_started && r.acks.swept.is_none() {
            reached_sweep += 1;
        }
        std::fs::remove_dir_all(&r.image).unwrap();
    }
    assert!(
        reached_sweep >= 3,
        "only {reached_sweep} cuts fell inside the sweep"
    );
}
