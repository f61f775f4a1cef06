//! The paired-ratio harness shared by every benchmark.
//!
//! On a noisy 2-core machine an absolute number from one run means nothing
//! next to one from another run (fsync rates moved 20-40x within minutes).
//! So every scenario runs the alkblobs operation (A) and its raw baseline
//! (B) in the same process, alternating short blocks (A B, then B A, ...),
//! for several rounds, and reports the **median of the per-round
//! throughput ratios A/B** with its spread. Per-op latencies go into HDR
//! histograms for p50/p99. Probes (fdatasync of 4 KiB, BLAKE3 at 64 KiB)
//! bracket the run; a drift over 2x is flagged.

use std::io::Write;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Times individual operations of one block.
pub struct Lat {
    hist: Histogram<u64>,
}

impl Lat {
    fn new() -> Lat {
        Lat {
            hist: Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("histogram bounds"),
        }
    }

    /// Runs `f`, recording its duration as one operation.
    pub fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        let ns = t.elapsed().as_nanos().max(1) as u64;
        let _ = self.hist.record(ns.min(self.hist.high()));
        out
    }

    /// Records an externally measured operation.
    pub fn record(&mut self, d: Duration) {
        let ns = d.as_nanos().max(1) as u64;
        let _ = self.hist.record(ns.min(self.hist.high()));
    }
}

/// One scenario's outcome.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PairResult {
    /// Scenario name.
    pub scenario: String,
    /// Label of A (the alkblobs side).
    pub a: String,
    /// Label of B (the baseline).
    pub b: String,
    /// Rounds run.
    pub rounds: usize,
    /// Median of per-round throughput ratios A/B.
    pub ratio_median: f64,
    /// Smallest per-round ratio.
    pub ratio_min: f64,
    /// Largest per-round ratio.
    pub ratio_max: f64,
    /// Median ops/s of A across rounds.
    pub a_ops_per_s: f64,
    /// Median ops/s of B across rounds.
    pub b_ops_per_s: f64,
    /// Median MB/s of A (0 if not a byte workload).
    pub a_mb_per_s: f64,
    /// Median MB/s of B.
    pub b_mb_per_s: f64,
    /// Latency percentiles (µs): A p50, A p99, B p50, B p99.
    pub lat_us: [f64; 4],
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let n = v.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A block: runs some operations, timing each with `lat`, returns
/// `(operations, bytes)`.
pub type Block<'a> = dyn FnMut(&mut Lat) -> (u64, u64) + 'a;

/// Runs A and B interleaved for `rounds` rounds (alternating which goes
/// first) and prints and records the result.
pub fn paired(
    scenario: &str,
    a_label: &str,
    b_label: &str,
    rounds: usize,
    a: &mut Block<'_>,
    b: &mut Block<'_>,
) -> PairResult {
    let (mut la, mut lb) = (Lat::new(), Lat::new());
    let (mut ratios, mut a_ops, mut b_ops, mut a_mb, mut b_mb) =
        (vec![], vec![], vec![], vec![], vec![]);
    // One warm-up block each, discarded.
    let _ = a(&mut Lat::new());
    let _ = b(&mut Lat::new());
    for round in 0..rounds {
        let run = |side: &mut Block<'_>, lat: &mut Lat| {
            let t = Instant::now();
            let (ops, bytes) = side(lat);
            let s = t.elapsed().as_secs_f64();
            (ops as f64 / s, bytes as f64 / s / 1e6)
        };
        let ((ta, ma), (tb, mb)) = if round % 2 == 0 {
            let x = run(a, &mut la);
            (x, run(b, &mut lb))
        } else {
            let y = run(b, &mut lb);
            (run(a, &mut la), y)
        };
        ratios.push(ta / tb);
        a_ops.push(ta);
        b_ops.push(tb);
        a_mb.push(ma);
        b_mb.push(mb);
    }
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let r = PairResult {
        scenario: scenario.into(),
        a: a_label.into(),
        b: b_label.into(),
        rounds,
        ratio_min: ratios.iter().cloned().fold(f64::INFINITY, f64::min),
        ratio_max: ratios.iter().cloned().fold(0.0, f64::max),
        ratio_median: median(&mut ratios),
        a_ops_per_s: median(&mut a_ops),
        b_ops_per_s: median(&mut b_ops),
        a_mb_per_s: median(&mut a_mb),
        b_mb_per_s: median(&mut b_mb),
        lat_us: [
            us(&la.hist, 0.5),
            us(&la.hist, 0.99),
            us(&lb.hist, 0.5),
            us(&lb.hist, 0.99),
        ],
    };
    report(&r);
    r
}

/// Runs `ops` on a runtime worker (as an application task would) and records
/// each operation's latency. Returns how many ran.
pub fn on_worker<F, Fut>(rt: &tokio::runtime::Runtime, lat: &mut Lat, ops: Vec<F>) -> u64
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let n = ops.len() as u64;
    let times = rt
        .block_on(rt.spawn(async move {
            let mut times = Vec::with_capacity(ops.len());
            for op in ops {
                let t = Instant::now();
                op().await;
                times.push(t.elapsed());
            }
            times
        }))
        .expect("benchmark task");
    for t in times {
        lat.record(t);
    }
    n
}

/// Prints a markdown row and appends the JSON to `target/bench/results.jsonl`.
pub fn report(r: &PairResult) {
    let tput = |ops: f64, mb: f64| {
        if mb > 0.5 {
            format!("{mb:.0} MB/s")
        } else {
            format!("{ops:.0} op/s")
        }
    };
    println!(
        "| {} | {} | {} | **{:.2}×** | {:.2}–{:.2} | {:.0} / {:.0} | {:.0} / {:.0} |",
        r.scenario,
        tput(r.a_ops_per_s, r.a_mb_per_s),
        tput(r.b_ops_per_s, r.b_mb_per_s),
        r.ratio_median,
        r.ratio_min,
        r.ratio_max,
        r.lat_us[0],
        r.lat_us[1],
        r.lat_us[2],
        r.lat_us[3],
    );
    let out = workspace_target().join("bench");
    let _ = std::fs::create_dir_all(&out);
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out.join("results.jsonl"))
    {
        let _ = writeln!(f, "{}", serde_json::to_string(r).unwrap_or_default());
    }
}

/// Prints the table header.
pub fn header(title: &str) {
    println!("\n### {title}\n");
    println!(
        "| scenario | alkblobs | baseline | ratio | spread | p50/p99 µs (alkblobs) | p50/p99 µs (baseline) |"
    );
    println!("|---|---|---|---|---|---|---|");
}

/// Machine probes: fdatasync of a 4 KiB write (p50, µs) and BLAKE3 at
/// 64 KiB (GiB/s).
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    /// fdatasync p50 in µs.
    pub fsync_us: f64,
    /// BLAKE3 single-thread GiB/s at 64 KiB.
    pub blake3_gib_s: f64,
}

/// Runs the probes in `dir`.
pub fn probe(dir: &std::path::Path) -> Probe {
    let path = dir.join("probe");
    let mut f = std::fs::File::create(&path).expect("probe file");
    let buf = vec![7u8; 4096];
    let mut lat = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        f.write_all(&buf).expect("probe write");
        f.sync_data().expect("probe fsync");
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let _ = std::fs::remove_file(&path);
    let data = vec![1u8; 64 * 1024];
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < Duration::from_millis(200) {
        std::hint::black_box(blake3::hash(&data));
        n += 1;
    }
    let gib = (n * 64 * 1024) as f64 / t.elapsed().as_secs_f64() / (1u64 << 30) as f64;
    Probe {
        fsync_us: median(&mut lat),
        blake3_gib_s: gib,
    }
}

/// Collects probes at start, middle and end and prints them with a drift
/// verdict.
#[derive(Default)]
pub struct Probes(Vec<(String, Probe)>);

impl Probes {
    /// Takes a probe labelled `when`.
    pub fn take(&mut self, when: &str, dir: &std::path::Path) {
        let p = probe(dir);
        println!(
            "probe {when}: fdatasync 4 KiB p50 {:.0} µs, BLAKE3 64 KiB {:.2} GiB/s",
            p.fsync_us, p.blake3_gib_s
        );
        self.0.push((when.into(), p));
    }

    /// Prints whether the machine drifted more than 2x during the run.
    pub fn verdict(&self) {
        let f: Vec<f64> = self.0.iter().map(|(_, p)| p.fsync_us).collect();
        let h: Vec<f64> = self.0.iter().map(|(_, p)| p.blake3_gib_s).collect();
        let spread = |v: &[f64]| {
            let max = v.iter().cloned().fold(0.0, f64::max);
            let min = v.iter().cloned().fold(f64::INFINITY, f64::min);
            max / min
        };
        let (sf, sh) = (spread(&f), spread(&h));
        let flag = if sf > 2.0 || sh > 2.0 {
            "DRIFTED (>2x): treat ratios with care"
        } else {
            "stable (<2x)"
        };
        println!("\nprobe drift: fsync {sf:.2}x, blake3 {sh:.2}x — {flag}");
    }
}

pub use alkblobs_tests::data;

/// What every benchmark starts with: a 2-worker runtime (one client pair on
/// a 2-core machine), a scratch directory, and the first probe.
pub fn setup() -> (tokio::runtime::Runtime, tempfile::TempDir, Probes) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let dir = scratch();
    let mut probes = Probes::default();
    probes.take("start", dir.path());
    (rt, dir, probes)
}

/// Peak resident set size of this process so far (VmHWM), in KiB.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Anonymous (heap and stack) resident memory now, in KiB: RSS minus
/// file-backed pages such as SQLite's memory-mapped database.
pub fn rss_anon_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("RssAnon:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Resets the peak RSS counter (Linux `clear_refs` 5).
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The workspace's `target/` directory.
pub fn workspace_target() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target")
}

/// A scratch directory for a benchmark's data: under `ALKBLOBS_BENCH_DIR`
/// if set, else `target/bench-data` (the same filesystem as the build).
pub fn scratch() -> tempfile::TempDir {
    let base = std::env::var("ALKBLOBS_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| workspace_target().join("bench-data"));
    std::fs::create_dir_all(&base).expect("bench data dir");
    tempfile::tempdir_in(base).expect("bench scratch dir")
}

/// Rounds from `ALKBLOBS_BENCH_ROUNDS`, else `default`.
pub fn rounds(default: usize) -> usize {
    std::env::var("ALKBLOBS_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The release CLI (`target/release/alkblobs`), built first if missing.
pub fn release_cli() -> std::path::PathBuf {
    let bin = workspace_target().join("release/alkblobs");
    if !bin.exists() {
        let s = std::process::Command::new(env!("CARGO"))
            .args(["build", "--release", "--bin", "alkblobs"])
            .status()
            .expect("cargo build");
        assert!(s.success(), "cargo build --release --bin alkblobs failed");
    }
    bin
}

/// What [`run_measured`] saw of one process.
#[derive(Debug)]
pub struct Measured {
    /// Wall time from spawn to exit.
    pub wall: Duration,
    /// The process's peak resident set (KiB), from `wait4`.
    pub max_rss_kib: u64,
    /// Its standard output.
    pub stdout: Vec<u8>,
    /// Its standard error.
    pub stderr: Vec<u8>,
    /// Whether it exited with 0.
    pub success: bool,
}

/// Runs `cmd` to its end, measuring its wall time and peak RSS (`wait4`'s
/// `ru_maxrss`: this child's alone).
pub fn run_measured(cmd: &mut std::process::Command) -> Measured {
    use std::io::Read;
    use std::process::Stdio;
    let t = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let mut stdout = Vec::new();
    let _ = out.read_to_end(&mut stdout);
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child, not yet reaped (`child` is never waited
    // on by std after this: it is forgotten below).
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    std::mem::forget(child);
    let wall = t.elapsed();
    Measured {
        wall,
        max_rss_kib: usage.ru_maxrss as u64,
        stdout,
        stderr: reader.join().unwrap_or_default(),
        success: libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
    }
}
