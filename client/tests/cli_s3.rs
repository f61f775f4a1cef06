//! The `alkblobs` binary with its large tier on S3 (`--large
//! s3://BUCKET/PREFIX`): an embedded store, a single-instance pool and a
//! fleet pool, end to end against the test S3 server and PostgreSQL server
//! the test script starts (`ALKBLOBS_S3_BUCKET` and the AWS variables,
//! `ALKBLOBS_PG_URL`; without them the test fails, it never skips).

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_alkblobs");

fn bucket() -> String {
    std::env::var("ALKBLOBS_S3_BUCKET")
        .expect("ALKBLOBS_S3_BUCKET must name the test bucket (scripts/test.sh sets it)")
}

fn url() -> String {
    std::env::var("ALKBLOBS_PG_URL")
        .expect("ALKBLOBS_PG_URL must name the test server (scripts/test.sh sets it)")
}

fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("ALKBLOBS_DATA_DIR", dir.join("store"))
        .current_dir(dir)
        .output()
        .expect("run alkblobs")
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let o = run(dir, args);
    assert!(
        o.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn secrets() -> Vec<String> {
    ["AWS_SECRET_ACCESS_KEY"]
        .iter()
        .filter_map(|k| std::env::var(k).ok())
        .collect()
}

fn no_secret(o: &Output) {
    let all = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    for s in secrets() {
        assert!(!all.contains(&s), "a secret in the output: {all}");
    }
}

/// An embedded store whose large tier is on S3: put, get, usage, verify,
/// gc and explain with `--json`, each command releasing the prefix's lease
/// as it ends (the next one does not wait); the store keeps its tier.
#[test]
fn an_embedded_store_keeps_large_content_on_s3() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let prefix = format!("cli/{}-{}", std::process::id(), rand_suffix());
    let large = format!("s3://{}/{prefix}", bucket());
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(d.join("big"), &big).unwrap();
    std::fs::write(d.join("small"), b"small").unwrap();
    let keys = ok(d, &["--large", &large, "put", "big", "small"]);
    let keys: Vec<&str> = keys.lines().collect();
    assert_eq!(keys.len(), 2);
    let got = run(d, &["--large", &large, "get", keys[0]]);
    assert!(got.status.success());
    assert_eq!(got.stdout, big);
    let usage = json(&ok(d, &["--large", &large, "usage", "--json"]));
    assert_eq!(usage["large"]["entries"], 1, "{usage}");
    assert_eq!(usage["large"]["bytes"], 3_000_000, "{usage}");
    assert!(
        usage["large"]["engine"].as_str().unwrap().contains(&prefix),
        "{usage}"
    );
    let verify = json(&ok(d, &["--large", &large, "verify", "--json"]));
    assert_eq!(verify["checked"], 2, "{verify}");
    assert_eq!(verify["corrupt"].as_array().unwrap().len(), 0, "{verify}");
    let explain = ok(d, &["--large", &large, "explain", keys[0]]);
    assert!(!explain.is_empty());
    // Opening it without the tier (or with another) is refused, naming it.
    let o = run(d, &["usage"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains(&large), "{o:?}");
    // Nothing references the blobs: a sweep with no window takes both.
    let gc = json(&ok(
        d,
        &["--large", &large, "gc", "--window", "0s", "--json"],
    ));
    assert_eq!(gc["deleted"], 2, "{gc}");
    let usage = json(&ok(d, &["--large", &large, "usage", "--json"]));
    assert_eq!(usage["large"]["entries"], 0, "{usage}");
}

/// A missing bucket, a malformed location and refused credentials are
/// each one clear line naming the bucket — no panic, no secret.
#[test]
fn bad_s3_coordinates_are_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let o = run(
        d,
        &["--large", "s3://alkblobs-no-such-bucket/p", "put", "-"],
    );
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("alkblobs-no-such-bucket") && !err.contains("panicked"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    no_secret(&o);
    let o = run(d, &["--large", "s3://Bad_Bucket/p", "usage"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let o = Command::new(BIN)
        .args(["--large", &format!("s3://{}/denied", bucket()), "put", "-"])
        .env("ALKBLOBS_DATA_DIR", d.join("denied"))
        .env(
            "AWS_SECRET_ACCESS_KEY",
            "0000000000000000000000000000000000000000000000000000000000000000",
        )
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&bucket()) && err.contains("credentials"),
        "{err}"
    );
    assert!(!err.contains("0000000000000000000000000000"), "{err}");
    no_secret(&o);
}

/// `pool create NAME --large s3://…` records the pool's location; fleet
/// instances declare it and share the pool's objects; a single-instance
/// pool takes its location from the database.
#[test]
fn pools_on_s3_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tag = format!("{}-{}", std::process::id(), rand_suffix());
    let large = format!("s3://{}/cli-pool/{tag}", bucket());
    let pool = format!("cli-s3-{tag}");
    let pg = |args: &[&str]| -> Output {
        Command::new(BIN)
            .args(args)
            .env("ALKBLOBS_POSTGRES", url())
            .env("ALKBLOBS_POOL", &pool)
            .current_dir(d)
            .output()
            .unwrap()
    };
    let must = |o: Output| -> String {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    must(pg(&[
        "--fleet", "--large", &large, "pool", "create", &pool, "--window", "0s",
    ]));
    let pools = json(&must(pg(&["pool", "ls", "--json"])));
    let row = pools
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pool"] == pool.as_str())
        .cloned()
        .unwrap();
    assert_eq!(row["large_tier"], "s3", "{row}");
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(d.join("big"), &big).unwrap();
    // A fleet instance must declare the tier (the fleet-validity rule).
    let o = pg(&["--fleet", "put", "big"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let key = must(pg(&["--fleet", "--large", &large, "put", "big"]));
    let key = key.trim();
    let o = pg(&["--fleet", "--large", &large, "get", key]);
    assert!(o.status.success());
    assert_eq!(o.stdout, big);
    // Another location is refused, naming the pool's.
    let o = pg(&["--fleet", "--large", &format!("{large}-other"), "get", key]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains(&large), "{o:?}");
    let usage = json(&must(pg(&[
        "--fleet", "--large", &large, "usage", "--json",
    ])));
    assert_eq!(usage["large"]["entries"], 1, "{usage}");
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}
