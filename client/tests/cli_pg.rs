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
    run_at(&url(), dir, pool, args)
}

/// `run` against the database at `u`.
fn run_at(u: &str, dir: &Path, pool: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("ALKBLOBS_POSTGRES", u)
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

    // The kind of pool is a required choice: neither, or both, is refused.
    let o = run(d, &pool, &["pool", "create", &pool]);
    assert_eq!(code(&o), 2, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--single-instance"));
    let o = run(
        d,
        &pool,
        &[
            "--fleet",
            "--large",
            "pg-lo",
            "pool",
            "create",
            &pool,
            "--single-instance",
        ],
    );
    assert_eq!(code(&o), 2, "{}", String::from_utf8_lossy(&o.stderr));
    ok(
        d,
        &pool,
        &[
            "pool",
            "create",
            &pool,
            "--window",
            "0s",
            "--single-instance",
        ],
    );
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

/// The CLI on a fleet pool from two processes at once: one puts files while
/// the other runs `gc` (the database sweep) and a third explains; every file
/// put is there afterwards (its pin row protected it until the TTL; the
/// window is 0 s), `explain` shows the pins by owner, `gc --json` carries
/// the database's figures, and `--fleet` without a large tier is refused
/// naming the rule.
#[test]
fn the_cli_runs_on_a_fleet_pool_from_two_processes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pool = format!("cli-fleet-{}", std::process::id());
    ok(
        d,
        &pool,
        &[
            "--fleet", "pool", "create", &pool, "--window", "0s", "--large", "none",
        ],
    );
    let o = run(d, &pool, &["--fleet", "ls"]);
    assert_eq!(code(&o), 2);
    assert!(String::from_utf8_lossy(&o.stderr).contains("fleet-validity rule"));
    let files: Vec<_> = (0..12)
        .map(|i| {
            let p = d.join(format!("f{i}"));
            std::fs::write(&p, format!("fleet file {i}")).unwrap();
            p
        })
        .collect();
    let fleet = |args: &[&str]| {
        let mut v = vec!["--fleet", "--large", "none"];
        v.extend_from_slice(args);
        v.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let spawn = |args: Vec<String>| {
        Command::new(BIN)
            .args(&args)
            .env("ALKBLOBS_POSTGRES", url())
            .env("ALKBLOBS_POOL", &pool)
            .env("ALKBLOBS_DATA_DIR", d.join("unused"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut sweeps = Vec::new();
    let mut puts = Vec::new();
    for f in &files {
        puts.push(spawn(fleet(&["put", f.to_str().unwrap()])));
        sweeps.push(spawn(fleet(&["gc", "--json"])));
    }
    let mut keys = Vec::new();
    for p in puts {
        let o = p.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        keys.push(
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .next()
                .unwrap()
                .to_owned(),
        );
    }
    for s in sweeps {
        let o = s.wait_with_output().unwrap();
        // A sweep either ran or found another one running (exit 6).
        assert!(
            o.status.success() || code(&o) == 6,
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        if o.status.success() {
            let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert!(r.get("pins_reaped").is_some(), "{r}");
        }
    }
    let gc = ok(
        d,
        &pool,
        &fleet(&["gc", "--json"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let r: serde_json::Value = serde_json::from_str(&gc).unwrap();
    assert_eq!(r["deleted"], 0, "pinned puts were collected: {r}");
    for (k, f) in keys.iter().zip(&files) {
        let got = ok(
            d,
            &pool,
            &fleet(&["get", k])
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        );
        assert_eq!(got, std::fs::read_to_string(f).unwrap());
    }
    let why = ok(
        d,
        &pool,
        &fleet(&["explain", &keys[0]])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(why.contains("pin:") && why.contains("owner"), "{why}");
    assert!(why.contains("verdict: live: protected by pin"), "{why}");
}

/// `url()` with its database replaced by `db`.
fn url_of(db: &str) -> String {
    let u = url();
    let (base, query) = u
        .split_once('?')
        .map_or((u.as_str(), None), |(b, q)| (b, Some(q)));
    let (server, _) = base
        .rsplit_once('/')
        .expect("a database in ALKBLOBS_PG_URL");
    match query {
        Some(q) => format!("{server}/{db}?{q}"),
        None => format!("{server}/{db}"),
    }
}

fn psql(u: &str, sql: &str) {
    let o = Command::new("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", u, "-c", sql])
        .output()
        .expect("run psql");
    assert!(
        o.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A `sweep_every` that no scheduler will run is said when it is set, by
/// `pool create` and `pool alter` (on stderr, the command succeeding), in
/// a database the scheduler does not serve; where it does (the test
/// database), nothing is said.
#[test]
fn pool_create_and_alter_warn_when_nothing_will_run_sweep_every() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let db = format!("cli_unscheduled_{}", std::process::id());
    psql(
        &url(),
        &format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"),
    );
    psql(&url(), &format!("CREATE DATABASE {db}"));
    psql(&url_of(&db), "CREATE EXTENSION alkblobs");
    let pool = "unscheduled";
    let cli = |u: &str, args: &[&str]| {
        let all: Vec<&str> = ["--fleet", "--large", "none"]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        let o = run_at(u, d, pool, &all);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let warned = |err: &str| {
        err.contains(&format!("warning: pool {pool}: sweep_every is"))
            && err.contains("scheduling is off")
    };
    let err = cli(
        &url_of(&db),
        &["pool", "create", pool, "--sweep-every", "5m"],
    );
    assert!(warned(&err), "{err}");
    assert!(err.contains("scheduler_databases"), "the reason: {err}");
    let err = cli(
        &url_of(&db),
        &["pool", "alter", pool, "--sweep-every", "1m"],
    );
    assert!(warned(&err), "{err}");
    let err = cli(
        &url_of(&db),
        &["pool", "alter", pool, "--sweep-every", "off"],
    );
    assert!(!err.contains("warning"), "{err}");
    // Served by the scheduler: silent (once its worker is up: a cluster
    // started a moment ago may not have it yet).
    let on = || {
        let o = Command::new("psql")
            .args([
                "-X",
                "-A",
                "-t",
                &url(),
                "-c",
                "SELECT alkblobs.scheduler_state()",
            ])
            .output()
            .expect("run psql");
        String::from_utf8_lossy(&o.stdout).trim() == "on"
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !on() {
        assert!(
            std::time::Instant::now() < deadline,
            "the scheduler never served the test database"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let served = format!("cli-served-{}", std::process::id());
    let err = cli(&url(), &["pool", "create", &served, "--sweep-every", "5m"]);
    assert!(!err.contains("warning"), "{err}");
    psql(&url(), &format!("DROP DATABASE {db} WITH (FORCE)"));
}

/// `pool status` shows `alkblobs_health`: a scheduled fleet pool is
/// swept by the extension's scheduler and reported ok (exit 0); once it is
/// manual and past its critical threshold it is critical (exit 7); a sweep
/// by this CLI (a node) makes it ok again.
#[test]
fn pool_status_reports_health_and_exits_7_when_critical() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pool = format!("cli-status-{}", std::process::id());
    let fleet = |args: &[&str]| {
        let mut v = vec!["--fleet", "--large", "none"];
        v.extend_from_slice(args);
        v.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let args = fleet(&[
        "pool",
        "create",
        &pool,
        "--window",
        "0s",
        "--sweep-every",
        "1s",
    ]);
    ok(
        d,
        &pool,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let listed: serde_json::Value =
        serde_json::from_str(&ok(d, &pool, &["pool", "ls", "--json"])).unwrap();
    let mine = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pool"] == pool.as_str())
        .expect("listed");
    assert_eq!(mine["sweep_every_secs"], 1.0);
    let status = |d: &Path| {
        let o = run(d, &pool, &["pool", "status", &pool, "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
        (code(&o), v[0].clone())
    };
    // Swept by the scheduler with nobody calling it.
    let mut swept = false;
    for _ in 0..600 {
        let (c, h) = status(d);
        if h["last_sweep_age_secs"].is_number() {
            assert_eq!(c, 0);
            assert_eq!(h["status"], "ok", "{h}");
            assert_eq!(h["scheduler"], "on", "{h}");
            swept = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(swept, "the scheduler did not sweep the pool within 60 s");

    ok(d, &pool, &["pool", "alter", &pool, "--sweep-every", "off"]);
    psql(
        &url(),
        &format!("SELECT alkblobs_alter_pool('{pool}', critical_after => '1 second')"),
    );
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let (c, h) = status(d);
    assert_eq!(c, 7, "{h}");
    assert_eq!(h["status"], "critical");
    assert_eq!(h["scheduler"], "manual");
    assert!(
        h["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r.as_str().unwrap().contains("no completed sweep")),
        "{h}"
    );
    let o = run(d, &pool, &["pool", "status", &pool]);
    assert_eq!(code(&o), 7);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains(&pool) && text.contains("critical"), "{text}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("critical"));
    // A node's sweep (this CLI, in fleet mode) is in the history: ok again.
    ok(
        d,
        &pool,
        &fleet(&["gc"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let (c, h) = status(d);
    assert_eq!((c, h["status"].as_str()), (0, Some("ok")), "{h}");
    // An unknown pool is not found.
    let o = run(d, &pool, &["pool", "status", "no-such-pool-here"]);
    assert_eq!(code(&o), 3);
}

/// A large object unlinked behind a pool's back, as a user meets it: verify
/// names the key and its reference and exits 4 (the run goes on: the
/// other blob is read), stat, get and explain exit 4 saying it is lost, and
/// `put` of the same file restores it.
#[test]
fn a_lost_large_object_is_named_by_verify_and_lost_to_every_read() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pool = format!("cli-lost-{}", std::process::id());
    ok(
        d,
        &pool,
        &[
            "pool",
            "create",
            &pool,
            "--single-instance",
            "--large",
            "pg-lo",
        ],
    );
    let (a, b) = (d.join("a.bin"), d.join("b.bin"));
    std::fs::write(&a, vec![7u8; 3 << 20]).unwrap();
    std::fs::write(&b, vec![9u8; 3 << 20]).unwrap();
    let ka = ok(d, &pool, &["put", "--root", a.to_str().unwrap()])
        .trim()
        .to_owned();
    let kb = ok(d, &pool, &["put", "--root", b.to_str().unwrap()])
        .trim()
        .to_owned();
    assert!(ok(d, &pool, &["verify"]).contains("0 missing"));
    let psql = Command::new("psql")
        .args([
            "-X",
            "-q",
            &url(),
            "-c",
            &format!(
                "SELECT lo_unlink(e.loid) FROM alkblobs.entries e JOIN alkblobs.pools p ON p.id = e.pool \
                  WHERE p.name = '{pool}' AND e.key = decode('{ka}', 'hex')"
            ),
        ])
        .output()
        .expect("run psql");
    assert!(
        psql.status.success(),
        "{}",
        String::from_utf8_lossy(&psql.stderr)
    );
    let o = run(d, &pool, &["verify"]);
    assert_eq!(code(&o), 4, "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!(
            "missing  {ka}  (recorded, its large object is gone; referenced by root)"
        )),
        "{out}"
    );
    assert!(
        out.contains("verified 1 blobs") && !out.contains(&kb),
        "{out}"
    );
    let o = run(d, &pool, &["verify", "--json"]);
    assert_eq!(code(&o), 4);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["missing"][0]["key"], ka.as_str(), "{v}");
    assert_eq!(v["missing"][0]["referenced_by"][0], "root", "{v}");
    for args in [
        vec!["stat", &ka],
        vec!["get", &ka, "-o", "copy"],
        vec!["explain", &ka],
    ] {
        let o = run(d, &pool, &args);
        assert_eq!(
            code(&o),
            4,
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("lost"),
            "{args:?}"
        );
    }
    // serve agrees: 500 with code `lost` (not 404), the other key served.
    let mut serve = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("ALKBLOBS_POSTGRES", url())
        .env("ALKBLOBS_POOL", &pool)
        .env("ALKBLOBS_DATA_DIR", d.join("unused"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start alkblobs serve");
    let base = {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(serve.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        line.trim().to_owned()
    };
    assert!(base.starts_with("http://"), "serve printed {base:?}");
    let curl = |key: &str| -> (String, Vec<u8>) {
        let o = Command::new("curl")
            .args(["-sS", "--max-time", "30", "-o", "-", "-w", "\n%{http_code}"])
            .arg(format!("{base}/blobs/{key}"))
            .output()
            .unwrap();
        let nl = o.stdout.iter().rposition(|b| *b == b'\n').unwrap();
        (
            String::from_utf8_lossy(&o.stdout[nl + 1..]).into_owned(),
            o.stdout[..nl].to_vec(),
        )
    };
    let (status, body) = curl(&ka);
    assert_eq!(status, "500", "{}", String::from_utf8_lossy(&body));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "lost", "{v}");
    let (status, body) = curl(&kb);
    assert_eq!((status.as_str(), body.len()), ("200", 3 << 20));
    let _ = serve.kill();
    let _ = serve.wait();

    assert_eq!(ok(d, &pool, &["put", a.to_str().unwrap()]).trim(), ka);
    assert!(ok(d, &pool, &["verify"]).contains("0 corrupt, 0 missing"));
}

/// A database that cannot be reached is an error naming it (exit 1),
/// never "0 missing"; a fleet node whose shared media is not there (an
/// empty directory where it should be mounted) finds every recorded key
/// missing, and says so in one line before the list.
#[test]
fn verify_fails_loudly_and_says_when_the_tier_holds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Nothing listens on port 1.
    let o = Command::new(BIN)
        .arg("verify")
        .env(
            "ALKBLOBS_POSTGRES",
            "postgresql://postgres@127.0.0.1:1/alkblobs?connect_timeout=5",
        )
        .env("ALKBLOBS_POOL", "p")
        .env("ALKBLOBS_DATA_DIR", d.join("unused"))
        .output()
        .unwrap();
    assert_eq!(code(&o), 1, "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("127.0.0.1:1"), "{err}");
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("missing"),
        "{o:?}"
    );

    let pool = format!("cli-media-{}", std::process::id());
    let media = d.join("media");
    let local = format!("local={}", media.display());
    let node = |args: &[&str]| -> Output {
        let mut v = vec!["--fleet", "--large", local.as_str(), "--shared-media"];
        v.extend_from_slice(args);
        run(d, &pool, &v)
    };
    ok(
        d,
        &pool,
        &[
            "--fleet", "pool", "create", &pool, "--window", "0s", "--large", "local",
        ],
    );
    for i in 0..2u8 {
        let f = d.join(format!("f{i}"));
        std::fs::write(&f, vec![i; 1 << 20]).unwrap();
        let o = node(&["put", f.to_str().unwrap()]);
        assert!(o.status.success(), "{o:?}");
    }
    let o = node(&["verify"]);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("2 blobs"),
        "{o:?}"
    );
    std::fs::rename(&media, d.join("media.away")).unwrap();
    std::fs::create_dir(&media).unwrap();
    let o = node(&["verify"]);
    assert_eq!(code(&o), 4, "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    let first = out.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("every one of the 2 keys this store must hold is missing"),
        "{out}"
    );
    assert_eq!(out.matches("missing  ").count(), 2, "{out}");
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// `put -r` of thousands of small files (several batches, one transaction
/// each) and a large one, into a single-instance pool on pg-lo and into a
/// fleet pool: every key printed in path order, each readable, the fleet's
/// protected by its pins through a sweep, and `verify` clean.
#[test]
fn put_r_of_many_files_commits_in_batches_into_single_instance_and_fleet_pools() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let t = d.join("tree");
    let mut contents = Vec::new();
    for i in 0..2_300usize {
        let sub = t.join(format!("d{}", i / 500));
        std::fs::create_dir_all(&sub).unwrap();
        let mut v = format!("pg tree {} file {i}\n", std::process::id()).into_bytes();
        v.resize(1024 + (i * 37) % 600, (i % 251) as u8);
        std::fs::write(sub.join(format!("f{i:05}")), &v).unwrap();
        contents.push(v);
    }
    let b3 = |v: &[u8]| blake3::hash(v).to_hex().to_string();
    for fleet in [false, true] {
        let pool = format!("cli-put-r-{fleet}-{}", std::process::id());
        let mode: &[&str] = if fleet {
            &["--fleet", "--large", "none"]
        } else {
            &[]
        };
        let create: Vec<&str> = mode
            .iter()
            .copied()
            .chain(["pool", "create", &pool, "--window", "0s"])
            .chain(if fleet {
                vec![]
            } else {
                vec!["--single-instance", "--large", "pg-lo"]
            })
            .collect();
        ok(d, &pool, &create);
        let with = |args: &[&str]| -> Vec<String> {
            mode.iter().chain(args).map(|s| s.to_string()).collect()
        };
        let mut pairs: Vec<(String, Vec<u8>)> =
            contents.iter().map(|c| (b3(c), c.clone())).collect();
        let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        if !fleet {
            // A large file between the batches: streamed on its own.
            std::fs::write(t.join("d1/f00700-large"), &big).unwrap();
            pairs.insert(701, (b3(&big), big.clone()));
        }
        let expected: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
        let out = ok(d, &pool, &as_strs(&with(&["put", "-r", "tree"])));
        let printed: Vec<&str> = out.lines().collect();
        assert_eq!(printed, expected, "fleet={fleet}");
        if fleet {
            // Pinned for a TTL after the put exited: a sweep collects
            // nothing.
            let gc = ok(d, &pool, &as_strs(&with(&["gc", "--json"])));
            let r: serde_json::Value = serde_json::from_str(&gc).unwrap();
            assert_eq!(r["deleted"], 0, "{r}");
        } else {
            // Present already: the batches write nothing, and root them.
            let again = ok(d, &pool, &as_strs(&with(&["put", "--root", "-r", "tree"])));
            assert_eq!(again.lines().collect::<Vec<_>>(), expected);
            let gc = ok(d, &pool, &as_strs(&with(&["gc", "--json"])));
            let r: serde_json::Value = serde_json::from_str(&gc).unwrap();
            assert_eq!(r["deleted"], 0, "rooted: {r}");
            std::fs::remove_file(t.join("d1/f00700-large")).unwrap();
        }
        for (k, c) in pairs.iter().step_by(97).chain(pairs.get(701)) {
            let got = run(d, &pool, &as_strs(&with(&["get", k])));
            assert!(got.status.success(), "{k}");
            assert_eq!(got.stdout, *c);
        }
        let v = run(d, &pool, &as_strs(&with(&["verify"])));
        assert_eq!(
            code(&v),
            0,
            "{}{}",
            String::from_utf8_lossy(&v.stdout),
            String::from_utf8_lossy(&v.stderr)
        );
    }
}
