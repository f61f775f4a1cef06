//! The store and arbiter conformance suites over the `s3` large engine in
//! the single-node topology (sqlite + s3), against the test S3 server.

#![cfg(feature = "s3")]

use alkblobs::backend::s3::S3Backend;
use alkblobs::backend::sqlite::{SqliteBackend, SqliteOptions};
use alkblobs::conformance::store::Config;
use alkblobs::{Store, arbiter_suite, store_suite};
use alkblobs_tests::s3::options;

const TIERED: Config = Config {
    kv_only: false,
    big: 100 << 20,
    list_keys: 5_000,
};

async fn sqlite_s3(tag: &str, threshold: u64) -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let kv = SqliteBackend::open(dir.path().join("index.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    let large = S3Backend::open(options(tag)).await.unwrap();
    let s = Store::builder()
        .sqlite(kv)
        .large(large)
        .threshold(threshold)
        .build()
        .unwrap();
    (s, dir)
}

store_suite!(sqlite_s3_store, TIERED, sqlite_s3("store", 65_536));
arbiter_suite!(sqlite_s3_arbiter, sqlite_s3("arbiter", 1024));
