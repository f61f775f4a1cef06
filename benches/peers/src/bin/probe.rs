//! Throwaway probe: relaxed 1 KiB put latency distribution.
use std::time::Instant;
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let base = std::path::PathBuf::from("target/probe-data");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    for round in 0u32..6 {
        let dir = base.join(format!("r{round}"));
        let relaxed = std::env::var("DURABLE").is_err();
        let opts = if relaxed { alkblobs::DirOptions::new().relaxed() } else { alkblobs::DirOptions::new() };
        let store = alkblobs::Store::open_dir_with(&dir, opts).await.unwrap();
        let blobs: Vec<Vec<u8>> = (0..2000u32).map(|i| { let mut v = vec![0u8; 1024]; v[..4].copy_from_slice(&i.to_le_bytes()); v[4..8].copy_from_slice(&round.to_le_bytes()); v }).collect();
        let mut lat = Vec::with_capacity(2000);
        let t0 = Instant::now();
        for b in blobs { let t = Instant::now(); let p = store.put(b).await.unwrap(); lat.push(t.elapsed().as_micros() as u64); drop(p); }
        let total = t0.elapsed();
        lat.sort();
        let sum: u64 = lat.iter().sum();
        println!("round {round}: {:.0} op/s mean {} us p50 {} p99 {} max {} top10sum {} us", 2000.0 / total.as_secs_f64(), sum / 2000, lat[1000], lat[1980], lat[1999], lat[1990..].iter().sum::<u64>());
        store.close().await.unwrap();
    }
}
