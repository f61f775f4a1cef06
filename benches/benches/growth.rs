//! The growth curve (docs/benchmarks.md, "Many files"): embedded stores of
//! 100k and 1M blobs (`ALKBLOBS_BENCH_GROWTH`, comma-separated counts)
//! built through the CLI, one large blob (200 KiB) per 1,000 small ones
//! (1.0–1.6 KiB), and at each size the per-blob cost of `put -r`, `get`
//! (through the API: 20,000 random keys), `ls`, `usage`, `verify` and `gc`
//! (collecting the unrooted half), each command's peak RSS, and the store's
//! size on disk before and after the gc. The last line holds each cost at
//! the largest size against the smallest (target ≤ 1.5×).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use alkblobs::{Key, Store};
use alkblobs_benches::{data, release_cli, run_measured};

fn sizes() -> Vec<usize> {
    std::env::var("ALKBLOBS_BENCH_GROWTH")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![100_000, 1_000_000])
}

/// `n` files, 1,000 to a directory; returns how many bytes.
fn tree(dir: &Path, n: usize) -> u64 {
    let mut bytes = 0;
    for i in 0..n {
        let sub = dir.join(format!("d{:04}", i / 1000));
        if i % 1000 == 0 {
            std::fs::create_dir_all(&sub).unwrap();
        }
        let len = if i % 1000 == 999 {
            200 << 10
        } else {
            1024 + (i * 37) % 600
        };
        std::fs::write(sub.join(format!("f{i:07}")), data(i as u64 * 13 + 5, len)).unwrap();
        bytes += len as u64;
    }
    bytes
}

fn du(p: &Path) -> u64 {
    let o = Command::new("du").args(["-sb"]).arg(p).output().unwrap();
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// One measured command: `(µs per blob, peak RSS MiB, stdout)`.
fn cli(bin: &Path, data_dir: &Path, args: &[&str], n: usize) -> (f64, f64, Vec<u8>) {
    let m = run_measured(Command::new(bin).arg("--data-dir").arg(data_dir).args(args));
    assert!(
        m.success,
        "{args:?}: {}",
        String::from_utf8_lossy(&m.stderr)
    );
    (
        m.wall.as_secs_f64() * 1e6 / n as f64,
        m.max_rss_kib as f64 / 1024.0,
        m.stdout,
    )
}

struct Row {
    n: usize,
    costs: Vec<(&'static str, f64, f64)>,
    disk_mib: f64,
    disk_after_gc_mib: f64,
}

fn main() {
    let bin = release_cli();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let scratch = alkblobs_benches::scratch();
    let mut rows = Vec::new();
    println!("\n### The growth curve (embedded store, durable, through the CLI)\n");
    println!("| blobs | command | µs per blob | peak RSS MiB |");
    println!("|---|---|---|---|");
    for n in sizes() {
        let root = scratch.path().join(format!("n{n}"));
        let t = Instant::now();
        let bytes = tree(&root.join("tree"), n);
        eprintln!(
            "{n} files ({:.0} MiB) written in {:.1?}",
            bytes as f64 / 1048576.0,
            t.elapsed()
        );
        let store = root.join("store");
        let mut costs = Vec::new();
        let tree_arg = root.join("tree");
        let tree_arg = tree_arg.to_str().unwrap();
        let (us, rss, out) = cli(&bin, &store, &["put", "-r", tree_arg], n);
        costs.push(("put -r", us, rss));
        let keys: Vec<Key> = String::from_utf8_lossy(&out)
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        assert_eq!(keys.len(), n);
        let (us, rss, out) = cli(&bin, &store, &["ls"], n);
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), n);
        costs.push(("ls", us, rss));
        let (us, rss, _) = cli(&bin, &store, &["usage"], n);
        costs.push(("usage", us, rss));
        let (us, rss, _) = cli(&bin, &store, &["verify"], n);
        costs.push(("verify", us, rss));
        // Gets through the API: 20,000 keys spread over the store.
        let gets = 20_000.min(n);
        let per_get = rt.block_on(async {
            let s = Store::open_dir(&store).await.unwrap();
            let t = Instant::now();
            for i in 0..gets {
                let k = keys[(i * 7919) % n];
                assert!(s.get(&k).await.unwrap().is_some());
            }
            let d = t.elapsed();
            s.close().await.unwrap();
            d
        });
        costs.push(("get (API)", per_get.as_secs_f64() * 1e6 / gets as f64, 0.0));
        let disk = du(&store);
        // Root every other key; gc collects the rest.
        rt.block_on(async {
            let s = Store::open_dir(&store).await.unwrap();
            for chunk in keys
                .iter()
                .step_by(2)
                .copied()
                .collect::<Vec<_>>()
                .chunks(10_000)
            {
                s.add_roots(chunk).await.unwrap();
            }
            s.close().await.unwrap();
        });
        let (us, rss, _) = cli(&bin, &store, &["gc", "--window", "0s"], n);
        costs.push(("gc", us, rss));
        let disk_after = du(&store);
        for (what, us, rss) in &costs {
            let rss = if *rss > 0.0 {
                format!("{rss:.0}")
            } else {
                "—".into()
            };
            println!("| {n} | {what} | {us:.2} | {rss} |");
        }
        println!(
            "| {n} | on disk | {:.0} MiB; {:.0} MiB after gc collected half | |",
            disk as f64 / 1048576.0,
            disk_after as f64 / 1048576.0
        );
        rows.push(Row {
            n,
            costs,
            disk_mib: disk as f64 / 1048576.0,
            disk_after_gc_mib: disk_after as f64 / 1048576.0,
        });
        let _ = std::fs::remove_dir_all(&root);
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last())
        && rows.len() > 1
    {
        println!(
            "\nper-blob cost at {} against {} (target ≤ 1.5×):",
            last.n, first.n
        );
        for ((what, a, _), (_, b, _)) in last.costs.iter().zip(&first.costs) {
            println!("- {what}: {:.2}×", a / b);
        }
        println!(
            "- size on disk per blob: {:.2}× (after gc {:.2}×)",
            (last.disk_mib / last.n as f64) / (first.disk_mib / first.n as f64),
            (last.disk_after_gc_mib / last.n as f64) / (first.disk_after_gc_mib / first.n as f64)
        );
    }
}
