//! The `alkblobs` binary on a PostgreSQL pool (`--postgres URL --pool
//! NAME`), end to end against the server the test script starts
//! (`ALKBLOBS_PG_URL`; without it the test fails, it never skips).

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_alkblobs");

fn url() -> String {
    std::env::var("ALKBLOBS_PG_URL")
        .expect("ALKBLOBS_PG_URL must name the test server (scripts/test.sh sets it)")
}

fn run(dir: &Path, pool: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("ALKBLOBS_POSTGRES", url())
        .env("ALKBLOBS_POOL", pool)
        .env("ALKBLOBS_DATA_DIR", dir.join("unused"))
        .current_dir(dir)
        .output()
        .expect("run alkblobs")
}

fn ok(dir: &Path, pool: &str, args: &[&str]) -> String {
    let o = run(dir, pool, args);
    assert!(
        o.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exit code")
}

#[test]
fn the_cli_runs_on_a_postgres_pool() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pool = format!("cli-{}", std::process::id());
    // No pool yet: exit 3, and the message says how to make one.
    let o = run(d, &pool, &["ls"]);
    assert_eq!(code(&o), 3, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("pool create"));

    ok(d, &pool, &["pool", "create", &pool, "--window", "0s"]);
    let pools = ok(d, &pool, &["pool", "ls", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&pools).unwrap();
    let mine = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pool"] == pool.as_str())
        .expect("the new pool is listed");
    assert_eq!(mine["mode"], "single");
    assert_eq!(mine["large_tier"], "pg-lo");

    std::fs::write(d.join("small.txt"), b"a small blob").unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(d.join("big.bin"), &big).unwrap();
    let keys = ok(d, &pool, &["put", "small.txt", "big.bin"]);
    let keys: Vec<&str> = keys.lines().collect();
    assert_eq!(keys.len(), 2);
    let stat: serde_json::Value =
        serde_json::from_str(&ok(d, &pool, &["stat", keys[1], "--json"])).unwrap();
    assert_eq!(stat["tier"], "large");
    assert_eq!(stat["size"], 300_000);
    ok(d, &pool, &["get", keys[1], "-o", "copy.bin"]);
    assert_eq!(std::fs::read(d.join("copy.bin")).unwrap(), big);
    let listed = ok(d, &pool, &["ls"]);
    assert_eq!(listed.lines().count(), 2);
    ok(d, &pool, &["verify"]);

    // The window is the pool's: --window is refused, pool alter changes it.
    let o = run(d, &pool, &["gc", "--window", "0s"]);
    assert_eq!(code(&o), 2);
    ok(d, &pool, &["pool", "alter", &pool, "--window", "0s"]);
    ok(d, &pool, &["roots", "add", keys[0]]);
    ok(d, &pool, &["gc"]);
    let listed = ok(d, &pool, &["ls"]);
    assert_eq!(listed.trim(), keys[0], "the root stays, the rest goes");
    let why: serde_json::Value =
        serde_json::from_str(&ok(d, &pool, &["explain", keys[0], "--json"])).unwrap();
    assert_eq!(why["verdict"], "live: a root");
    assert_eq!(code(&run(d, &pool, &["explain", keys[1]])), 3);
    let o = run(d, &pool, &["get", keys[1]]);
    assert_eq!(code(&o), 3);
    // A large tier other than the pool's is refused as bad input.
    let o = run(d, &pool, &["--large", "none", "ls"]);
    assert_eq!(code(&o), 2, "{}", String::from_utf8_lossy(&o.stderr));
}
