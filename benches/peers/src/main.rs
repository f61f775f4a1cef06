//! alkblobs vs iroh-blobs, side by side in one process (issue 11).
//!
//! Every scenario runs each mode in fresh stores on the same filesystem
//! (`benches/peers/target/peers-data`, or `$PEERS_DIR`), alternating the
//! order of the modes round by round (A..F, then F..A), and reports the
//! **median of the per-round throughput ratios** alkblobs/iroh with their
//! min–max spread and per-op p50 latencies. Inputs are pre-generated
//! (seeded, incompressible) outside the timed region; both sides hash
//! (BLAKE3) inside it. Every put's key is checked against BLAKE3 of the input
//! (so both stores give the same key), and every get against the bytes put.
//! Probes (fdatasync 4 KiB p50, BLAKE3 64 KiB) bracket the run.
//!
//! Modes (what each promises when the put returns):
//! - alkblobs durable (default): row committed and fsynced (group commit:
//!   concurrent puts share one transaction and one fsync).
//! - alkblobs relaxed: survives a process crash, may be lost on power cut.
//! - alkblobs put_many (durable): one call, one transaction, one fsync.
//! - iroh default: `add_bytes(..).temp_tag()` / `add_path`: acknowledged
//!   before its metadata commits (redb batches 1,000 writes or 500 ms).
//! - iroh + sync: each add followed by `sync_db()` (the metadata commit).
//! - iroh + 1 sync: all adds, then one `sync_db()` (peer of put_many).
//!
//! `PEERS_ROUNDS` (default 12) sets the rounds.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use iroh_blobs::store::fs::FsStore;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    AlkDurable,
    AlkRelaxed,
    AlkMany,
    Iroh,
    IrohSync,
    IrohSyncEnd,
}

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::AlkDurable => "alkblobs durable (default)",
            Side::AlkRelaxed => "alkblobs relaxed",
            Side::AlkMany => "alkblobs `put_many` (durable)",
            Side::Iroh => "iroh default",
            Side::IrohSync => "iroh + `sync_db` each add",
            Side::IrohSyncEnd => "iroh + one `sync_db` at end",
        }
    }
}

enum Handle {
    Alk(alkblobs::Store),
    Iroh(FsStore),
}

/// What a put leaves to hold until the round ends (a pin or a temp tag).
type Guard = Box<dyn std::any::Any + Send>;

struct Work {
    name: String,
    blobs: Arc<Vec<Bytes>>,
    /// BLAKE3 of each blob, computed outside the timed region.
    keys: Arc<Vec<[u8; 32]>>,
    /// The same blobs as files, for the import workload.
    files: Option<Arc<Vec<PathBuf>>>,
    tasks: usize,
    /// Measure disk use after the puts.
    du: bool,
}

struct Outcome {
    put_s: f64,
    put_lat: Vec<Duration>,
    get_s: f64,
    get_lat: Vec<Duration>,
    disk: u64,
}

/// Seeded, incompressible bytes.
fn gen_blob(seed: u64, len: usize) -> Bytes {
    let mut h = blake3::Hasher::new();
    h.update(b"alkblobs peers bench");
    h.update(&seed.to_le_bytes());
    let mut out = vec![0u8; len];
    h.finalize_xof().fill(&mut out);
    Bytes::from(out)
}

fn du(dir: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if let Ok(m) = e.path().symlink_metadata() {
                total += m.blocks() * 512;
                if m.is_dir() {
                    total += du(&e.path());
                }
            }
        }
    }
    total
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn p50_us(lat: &[Duration]) -> f64 {
    let mut v: Vec<f64> = lat.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    median(&mut v)
}

async fn open(side: Side, dir: &Path) -> Handle {
    std::fs::create_dir_all(dir).unwrap();
    match side {
        Side::AlkDurable | Side::AlkMany => Handle::Alk(
            alkblobs::Store::open_dir_with(dir, alkblobs::DirOptions::new())
                .await
                .expect("open alkblobs"),
        ),
        Side::AlkRelaxed => Handle::Alk(
            alkblobs::Store::open_dir_with(dir, alkblobs::DirOptions::new().relaxed())
                .await
                .expect("open alkblobs relaxed"),
        ),
        _ => Handle::Iroh(FsStore::load(dir).await.expect("open iroh FsStore")),
    }
}

async fn close(h: Handle) {
    match h {
        Handle::Alk(s) => s.close().await.expect("close alkblobs"),
        Handle::Iroh(s) => s.shutdown().await.expect("shutdown iroh"),
    }
}

/// Puts the blobs `idx` (one task's share), returning (index, key, guard)
/// and per-op latencies.
async fn put_share(
    h: Arc<Handle>,
    side: Side,
    blobs: Arc<Vec<Bytes>>,
    files: Option<Arc<Vec<PathBuf>>>,
    idx: Vec<usize>,
) -> (Vec<(usize, [u8; 32])>, Vec<Guard>, Vec<Duration>) {
    let mut keys = Vec::with_capacity(idx.len());
    let mut guards: Vec<Guard> = Vec::with_capacity(idx.len());
    let mut lat = Vec::with_capacity(idx.len());
    match (&*h, side) {
        (Handle::Alk(s), Side::AlkMany) => {
            let t = Instant::now();
            let pm = s
                .put_many(idx.iter().map(|&i| blobs[i].clone()))
                .await
                .expect("alkblobs put_many");
            // Amortised per blob: one call covers the whole share.
            let per = t.elapsed() / idx.len().max(1) as u32;
            for (e, &i) in pm.entries.iter().zip(&idx) {
                keys.push((i, *e.key.as_bytes()));
                lat.push(per);
            }
            guards.push(Box::new(pm.pin));
        }
        (Handle::Alk(s), _) => {
            for &i in &idx {
                let t = Instant::now();
                let p = match &files {
                    Some(f) => s.put_file(&f[i]).await.expect("alkblobs put_file"),
                    None => s.put(blobs[i].clone()).await.expect("alkblobs put"),
                };
                lat.push(t.elapsed());
                keys.push((i, *p.key.as_bytes()));
                guards.push(Box::new(p.pin));
            }
        }
        (Handle::Iroh(s), _) => {
            for &i in &idx {
                let t = Instant::now();
                let tt = match &files {
                    Some(f) => s.add_path(&f[i]).temp_tag().await.expect("iroh add_path"),
                    None => s
                        .add_bytes(blobs[i].clone())
                        .temp_tag()
                        .await
                        .expect("iroh add_bytes"),
                };
                if side == Side::IrohSync {
                    s.sync_db().await.expect("iroh sync_db");
                }
                lat.push(t.elapsed());
                keys.push((i, *tt.hash().as_bytes()));
                guards.push(Box::new(tt));
            }
        }
    }
    (keys, guards, lat)
}

async fn get_share(
    h: Arc<Handle>,
    keys: Arc<Vec<[u8; 32]>>,
    idx: Vec<usize>,
) -> (Vec<(usize, Bytes)>, Vec<Duration>) {
    let mut out = Vec::with_capacity(idx.len());
    let mut lat = Vec::with_capacity(idx.len());
    for i in idx {
        let t = Instant::now();
        let b = match &*h {
            Handle::Alk(s) => s
                .get(&alkblobs::Key::from_bytes(keys[i]))
                .await
                .expect("alkblobs get")
                .expect("alkblobs get: blob missing"),
            Handle::Iroh(s) => s
                .get_bytes(iroh_blobs::Hash::from(keys[i]))
                .await
                .expect("iroh get_bytes"),
        };
        lat.push(t.elapsed());
        out.push((i, b));
    }
    (out, lat)
}

fn shares(n: usize, tasks: usize) -> Vec<Vec<usize>> {
    let mut v = vec![Vec::new(); tasks];
    for i in 0..n {
        v[i % tasks].push(i);
    }
    v
}

static DIR_NR: AtomicU64 = AtomicU64::new(0);

async fn run_side(side: Side, w: &Work, base: &Path) -> Outcome {
    let dir = base.join(format!("{:?}-{}", side, DIR_NR.fetch_add(1, Ordering::Relaxed)));
    let h = Arc::new(open(side, &dir).await);
    let n = w.blobs.len();

    // Puts.
    let t = Instant::now();
    let mut joins = Vec::new();
    for idx in shares(n, w.tasks) {
        joins.push(tokio::spawn(put_share(
            h.clone(),
            side,
            w.blobs.clone(),
            w.files.clone(),
            idx,
        )));
    }
    let (mut got, mut guards, mut put_lat) = (Vec::new(), Vec::new(), Vec::new());
    for j in joins {
        let (k, g, l) = j.await.expect("put task");
        got.extend(k);
        guards.extend(g);
        put_lat.extend(l);
    }
    if side == Side::IrohSyncEnd
        && let Handle::Iroh(s) = &*h
    {
        s.sync_db().await.expect("iroh sync_db");
    }
    let put_s = t.elapsed().as_secs_f64();
    assert_eq!(got.len(), n);
    for (i, k) in &got {
        assert_eq!(
            k, &w.keys[*i],
            "{}: {} gave a key other than BLAKE3 of the bytes",
            w.name,
            side.label()
        );
    }

    // Gets.
    let t = Instant::now();
    let mut joins = Vec::new();
    for idx in shares(n, w.tasks) {
        joins.push(tokio::spawn(get_share(h.clone(), w.keys.clone(), idx)));
    }
    let (mut read, mut get_lat) = (Vec::new(), Vec::new());
    for j in joins {
        let (r, l) = j.await.expect("get task");
        read.extend(r);
        get_lat.extend(l);
    }
    let get_s = t.elapsed().as_secs_f64();
    assert_eq!(read.len(), n);
    for (i, b) in &read {
        assert!(
            b == &w.blobs[*i],
            "{}: {} returned other bytes than were put",
            w.name,
            side.label()
        );
    }
    drop(read);
    drop(guards);
    let h = Arc::into_inner(h).expect("store handle still shared");
    close(h).await;
    let disk = if w.du { du(&dir) } else { 0 };
    // iroh's store runtime shuts down in the background: retry briefly.
    for attempt in 0.. {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => break,
            Err(e) if attempt < 20 => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("remove {}: {e}", dir.display()),
        }
    }
    Outcome {
        put_s,
        put_lat,
        get_s,
        get_lat,
        disk,
    }
}

fn probe(dir: &Path) -> (f64, f64) {
    use std::io::Write;
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
        std::hint::black_box(blake3::hash(std::hint::black_box(&data)));
        n += 1;
    }
    let gib = (n * 64 * 1024) as f64 / t.elapsed().as_secs_f64() / (1u64 << 30) as f64;
    (median(&mut lat), gib)
}

fn print_probe(when: &str, dir: &Path, all: &mut Vec<(f64, f64)>) {
    let (f, b) = probe(dir);
    println!("probe {when}: fdatasync 4 KiB p50 {f:.0} µs, BLAKE3 64 KiB {b:.2} GiB/s");
    all.push((f, b));
}

/// The pairs reported for a workload: (alkblobs mode, iroh mode).
fn pairs(files: bool) -> Vec<(Side, Side)> {
    let mut v = vec![
        (Side::AlkDurable, Side::Iroh),
        (Side::AlkDurable, Side::IrohSync),
        (Side::AlkRelaxed, Side::Iroh),
        (Side::AlkRelaxed, Side::IrohSync),
    ];
    if !files {
        v.push((Side::AlkMany, Side::Iroh));
        v.push((Side::AlkMany, Side::IrohSyncEnd));
    }
    v
}

fn fmt_rate(ops: f64, bytes_per_op: usize) -> String {
    let mb = ops * bytes_per_op as f64 / 1e6;
    if bytes_per_op >= 1 << 20 {
        format!("{mb:.0} MB/s")
    } else {
        format!("{ops:.0} op/s")
    }
}

fn main() {
    let rounds: usize = std::env::var("PEERS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12)
        .max(2);
    let base = std::env::var("PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/peers-data"));
    std::fs::create_dir_all(&base).unwrap();
    let scratch = tempfile::tempdir_in(&base).expect("scratch dir");
    let base = scratch.path().to_path_buf();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let mut probes = Vec::new();
    println!("# alkblobs vs iroh-blobs ({rounds} rounds, modes interleaved A..F then F..A)\n");
    print_probe("start", &base, &mut probes);
    let t_run = Instant::now();

    // (name, size, count, tasks, from files, measure du)
    let specs: Vec<(String, usize, usize, usize, bool, bool)> = vec![
        ("1 KiB × 2000, 1 task".into(), 1024, 2000, 1, false, true),
        ("1 KiB × 2000, 16 tasks".into(), 1024, 2000, 16, false, false),
        ("4 KiB × 2000, 1 task".into(), 4096, 2000, 1, false, true),
        ("4 KiB × 2000, 16 tasks".into(), 4096, 2000, 16, false, false),
        ("1 MiB × 64, 1 task".into(), 1 << 20, 64, 1, false, false),
        ("1 MiB × 128, 16 tasks".into(), 1 << 20, 128, 16, false, false),
        ("64 MiB file × 2, 1 task".into(), 64 << 20, 2, 1, true, false),
        ("64 MiB file × 4, 4 tasks".into(), 64 << 20, 4, 4, true, false),
    ];

    let mut table = Vec::new();
    let mut gets = Vec::new();
    let mut disk_rows = Vec::new();
    for (wi, (name, size, count, tasks, from_files, measure_du)) in specs.into_iter().enumerate() {
        let blobs: Vec<Bytes> = (0..count)
            .map(|i| gen_blob(((wi as u64) << 32) | i as u64, size))
            .collect();
        let keys: Vec<[u8; 32]> = blobs.iter().map(|b| *blake3::hash(b).as_bytes()).collect();
        let files = from_files.then(|| {
            let dir = base.join(format!("src-{wi}"));
            std::fs::create_dir_all(&dir).unwrap();
            let paths: Vec<PathBuf> = blobs
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let p = dir.join(format!("{i}.bin"));
                    std::fs::write(&p, b).unwrap();
                    p
                })
                .collect();
            Arc::new(paths)
        });
        let w = Work {
            name: name.clone(),
            blobs: Arc::new(blobs),
            keys: Arc::new(keys),
            files,
            tasks,
            du: measure_du,
        };
        let sides: Vec<Side> = if from_files {
            vec![Side::AlkDurable, Side::AlkRelaxed, Side::Iroh, Side::IrohSync]
        } else {
            vec![
                Side::AlkDurable,
                Side::AlkRelaxed,
                Side::AlkMany,
                Side::Iroh,
                Side::IrohSync,
                Side::IrohSyncEnd,
            ]
        };
        let t_w = Instant::now();
        // outcomes[round][side index]
        let mut outcomes: Vec<Vec<Option<Outcome>>> = Vec::new();
        for r in 0..rounds {
            let mut row: Vec<Option<Outcome>> = (0..sides.len()).map(|_| None).collect();
            let order: Vec<usize> = if r % 2 == 0 {
                (0..sides.len()).collect()
            } else {
                (0..sides.len()).rev().collect()
            };
            for si in order {
                row[si] = Some(rt.block_on(run_side(sides[si], &w, &base)));
            }
            outcomes.push(row);
        }
        eprintln!("{name}: {:.1} s", t_w.elapsed().as_secs_f64());
        let pos = |s: Side| sides.iter().position(|&x| x == s).unwrap();
        let n = count as f64;
        for (a, b) in pairs(from_files) {
            let (ia, ib) = (pos(a), pos(b));
            let mut ratios: Vec<f64> = outcomes
                .iter()
                .map(|row| {
                    let (oa, ob) = (row[ia].as_ref().unwrap(), row[ib].as_ref().unwrap());
                    ob.put_s / oa.put_s
                })
                .collect();
            let (lo, hi) = (
                ratios.iter().cloned().fold(f64::INFINITY, f64::min),
                ratios.iter().cloned().fold(0.0, f64::max),
            );
            let med = median(&mut ratios);
            let mut ra: Vec<f64> = outcomes.iter().map(|r| n / r[ia].as_ref().unwrap().put_s).collect();
            let mut rb: Vec<f64> = outcomes.iter().map(|r| n / r[ib].as_ref().unwrap().put_s).collect();
            let la: Vec<Duration> = outcomes.iter().flat_map(|r| r[ia].as_ref().unwrap().put_lat.clone()).collect();
            let lb: Vec<Duration> = outcomes.iter().flat_map(|r| r[ib].as_ref().unwrap().put_lat.clone()).collect();
            table.push(format!(
                "| {name} puts | {} | {} | **{med:.2}×** | {lo:.2}–{hi:.2} | {} / {} | {:.0} / {:.0} |",
                a.label(),
                b.label(),
                fmt_rate(median(&mut ra), size),
                fmt_rate(median(&mut rb), size),
                p50_us(&la),
                p50_us(&lb),
            ));
        }
        // Gets: alkblobs (durable store) vs iroh (default store).
        {
            let (ia, ib) = (pos(Side::AlkDurable), pos(Side::Iroh));
            let mut ratios: Vec<f64> = outcomes
                .iter()
                .map(|row| row[ib].as_ref().unwrap().get_s / row[ia].as_ref().unwrap().get_s)
                .collect();
            let (lo, hi) = (
                ratios.iter().cloned().fold(f64::INFINITY, f64::min),
                ratios.iter().cloned().fold(0.0, f64::max),
            );
            let med = median(&mut ratios);
            let mut ra: Vec<f64> = outcomes.iter().map(|r| n / r[ia].as_ref().unwrap().get_s).collect();
            let mut rb: Vec<f64> = outcomes.iter().map(|r| n / r[ib].as_ref().unwrap().get_s).collect();
            let la: Vec<Duration> = outcomes.iter().flat_map(|r| r[ia].as_ref().unwrap().get_lat.clone()).collect();
            let lb: Vec<Duration> = outcomes.iter().flat_map(|r| r[ib].as_ref().unwrap().get_lat.clone()).collect();
            gets.push(format!(
                "| {name} gets | alkblobs `get` | iroh `get_bytes` | **{med:.2}×** | {lo:.2}–{hi:.2} | {} / {} | {:.0} / {:.0} |",
                fmt_rate(median(&mut ra), size),
                fmt_rate(median(&mut rb), size),
                p50_us(&la),
                p50_us(&lb),
            ));
        }
        if measure_du {
            let payload = (count * size) as f64;
            for (si, s) in sides.iter().enumerate() {
                let mut d: Vec<f64> = outcomes.iter().map(|r| r[si].as_ref().unwrap().disk as f64).collect();
                let d = median(&mut d);
                disk_rows.push(format!(
                    "| {name} ({:.0} KiB payload) | {} | {:.0} KiB | {:.2}× |",
                    payload / 1024.0,
                    s.label(),
                    d / 1024.0,
                    d / payload
                ));
            }
        }
        if wi == 3 {
            print_probe("middle", &base, &mut probes);
        }
    }
    print_probe("end", &base, &mut probes);

    println!("\n| workload | alkblobs mode | iroh-blobs mode | ratio (alkblobs/iroh, median) | spread | throughput alkblobs / iroh | p50 µs alkblobs / iroh |");
    println!("|---|---|---|---|---|---|---|");
    for l in table.iter().chain(&gets) {
        println!("{l}");
    }
    println!("\nDisk used after the small-blob puts (du of each store dir after close/shutdown, median over rounds):\n");
    println!("| workload | mode | store dir (du) | × payload |");
    println!("|---|---|---|---|");
    for l in &disk_rows {
        println!("{l}");
    }
    let spread = |v: Vec<f64>| {
        let max = v.iter().cloned().fold(0.0, f64::max);
        let min = v.iter().cloned().fold(f64::INFINITY, f64::min);
        max / min
    };
    let sf = spread(probes.iter().map(|p| p.0).collect());
    let sb = spread(probes.iter().map(|p| p.1).collect());
    let flag = if sf > 2.0 || sb > 2.0 { "DRIFTED (>2x): treat ratios with care" } else { "stable (<2x)" };
    println!("\nprobe drift: fsync {sf:.2}x, blake3 {sb:.2}x — {flag}");
    println!("total run time: {:.0} s", t_run.elapsed().as_secs_f64());
}
