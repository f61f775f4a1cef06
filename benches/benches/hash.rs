//! BLAKE3 throughput on this machine (CPU only, criterion): what a put pays
//! to content-address its bytes, to compare with the disk's rate.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn blake3_sizes(c: &mut Criterion) {
    let mut g = c.benchmark_group("blake3");
    for size in [1usize << 10, 4 << 10, 64 << 10, 1 << 20, 16 << 20] {
        let data = alkblobs_benches::data(size as u64, size);
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &data, |b, d| {
            b.iter(|| blake3::hash(d))
        });
    }
    g.finish();
}

/// The benchmark group (criterion).
mod group {
    #![allow(missing_docs)]
    use super::*;
    criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(2)).warm_up_time(std::time::Duration::from_millis(500));
    targets = blake3_sizes
    }
}
criterion_main!(group::benches);
