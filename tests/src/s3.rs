//! The test S3 server's coordinates: `scripts/s3-server.sh start` prints
//! them and `scripts/test.sh` puts them in the environment. Every test
//! works under a prefix of its own in the one bucket, so tests run in
//! parallel and a rerun never meets an earlier run's objects.

use std::sync::atomic::{AtomicU64, Ordering};

use alkblobs::backend::s3::{S3Location, S3Options};

/// The test bucket (`ALKBLOBS_S3_BUCKET`). Panics without one: an s3 test
/// never skips.
pub fn bucket() -> String {
    std::env::var("ALKBLOBS_S3_BUCKET").expect(
        "ALKBLOBS_S3_BUCKET is not set: start the test S3 server with \
         `env $(scripts/s3-server.sh start) cargo test …` (scripts/test.sh does)",
    )
}

/// A fresh prefix in the test bucket, named after `tag`.
pub fn location(tag: &str) -> S3Location {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let prefix = format!(
        "t/{tag}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    S3Location::new(&bucket(), &prefix).expect("a valid test location")
}

/// Options for a fresh prefix: the smallest part S3 allows (5 MiB), so
/// the suites' 8 MiB values take the multipart path.
pub fn options(tag: &str) -> S3Options {
    S3Options::new(location(tag)).part_size(5 << 20)
}

/// The test server's control script (`ALKBLOBS_S3_SERVER`), for the fault
/// tests that kill and restart it.
pub fn server_script() -> String {
    std::env::var("ALKBLOBS_S3_SERVER").expect("ALKBLOBS_S3_SERVER is not set")
}

/// A fresh s3 pool of the test database (`alkblobs_tests::pg`): window 0,
/// pin TTL `ttl`, at a fresh location; fleet unless `single_instance`.
#[cfg(feature = "pg")]
pub async fn pool(tag: &str, ttl: &str, single_instance: bool) -> (String, S3Location) {
    let c = crate::pg::connect().await;
    crate::pg::ensure_extension(&c).await;
    let name = crate::pg::unique(tag);
    let loc = location(tag);
    c.execute(
        "SELECT alkblobs_create_pool($1, '0 seconds', $2::text::interval, 's3', single_instance => $3, large_location => $4)",
        &[&name, &ttl, &single_instance, &loc.to_string()],
    )
    .await
    .expect("create an s3 pool");
    (name, loc)
}
