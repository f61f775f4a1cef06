//! Many OS processes racing at random: writers at every isolation level,
//! looping sweepers, a pinner stopped past its TTL and an uploader, after
//! which no protected content may be gone. The workers are this test binary
//! re-executed (`race_worker_process_entry_point`). docs/design.md §4 lists
//! which guards it covers.

#![cfg(feature = "pg")]

use std::time::Duration;

use alkblobs_tests::pg::{
    all_named_keys_present, connect, exists, hex, key, pool, register, sqlstate, table_name,
};

/// Environment variable that turns [`race_worker_process_entry_point`] into
/// one worker process of [`randomized_processes_never_lose_protected_content`].
const WORKER: &str = "ALKBLOBS_RACE_WORKER";

/// How long the workers of the randomized race run.
const RACE_FOR: Duration = Duration::from_secs(12);

/// SQLSTATEs a worker may see and carry on: AB002 (the content is not held),
/// 40001 (serialization failure at REPEATABLE READ / SERIALIZABLE), 40P01
/// (two writers deadlocking on the embedder's own table), 23505 (two
/// writers recording the same key). Anything else, XX000 above all, fails
/// the worker.
fn tolerated(e: &tokio_postgres::Error) -> bool {
    ["AB002", "40001", "40P01", "23505"].contains(&sqlstate(e).as_str())
}

fn race_value(i: u64) -> Vec<u8> {
    format!("race content {}", i % 40).into_bytes()
}

/// Tiny deterministic PRNG (xorshift) so a worker needs no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

async fn race_writer(pool: &str, table: &str, idx: u64) {
    let c = connect().await;
    let level = ["read committed", "repeatable read", "serializable"][(idx % 3) as usize];
    c.batch_execute(&format!("SET default_transaction_isolation = '{level}'"))
        .await
        .unwrap();
    let owner = format!("writer-{idx}");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((idx + 1) * 7919));
    let start = std::time::Instant::now();
    while start.elapsed() < RACE_FOR {
        let op = rng.next(8);
        let v = race_value(rng.next(1000));
        let k = key(&v);
        c.batch_execute("BEGIN").await.unwrap();
        let r: Result<(), tokio_postgres::Error> = async {
            match op {
                // put and record in one transaction (the embedder's pattern)
                0 | 1 => {
                    c.query_one("SELECT alkblobs_put($1, $2, $3, $4)", &[&pool, &k, &v, &owner])
                        .await?;
                    c.execute(
                        &format!("INSERT INTO {table} (key, worker) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING"),
                        &[&k, &(idx as i32)],
                    )
                    .await?;
                }
                2 => {
                    c.query_one("SELECT alkblobs_put($1, $2, $3, $4)", &[&pool, &k, &v, &owner])
                        .await?;
                }
                // update a row's key to another key
                3 => {
                    c.execute(
                        &format!("UPDATE {table} SET key = $1 WHERE key = (SELECT key FROM {table} WHERE worker = $2 LIMIT 1) AND NOT EXISTS (SELECT 1 FROM {table} WHERE key = $1)"),
                        &[&k, &(idx as i32)],
                    )
                    .await?;
                }
                4 => {
                    c.execute(
                        &format!("DELETE FROM {table} WHERE ctid IN (SELECT ctid FROM {table} WHERE worker = $1 LIMIT 2)"),
                        &[&(idx as i32)],
                    )
                    .await?;
                }
                // multi-row insert
                5 => {
                    let k2 = key(&race_value(rng.next(1000)));
                    c.execute(
                        &format!("INSERT INTO {table} (key, worker) VALUES ($1, $3), ($2, $3) ON CONFLICT (key) DO NOTHING"),
                        &[&k, &k2, &(idx as i32)],
                    )
                    .await?;
                }
                // COPY
                6 => {
                    let sink = c
                        .copy_in(&format!("COPY {table} (key, worker) FROM STDIN"))
                        .await?;
                    let hexes: String = format!("\\\\x{}\t{idx}\n", hex(&k));
                    futures::pin_mut!(sink);
                    use futures::SinkExt;
                    sink.send(bytes::Bytes::from(hexes)).await?;
                    sink.as_mut().finish().await?;
                }
                _ => {
                    let pinned: bool = c
                        .query_one("SELECT alkblobs_pin($1, $2, $3)", &[&pool, &k, &owner])
                        .await?
                        .get(0);
                    let _ = pinned;
                    c.query_one("SELECT alkblobs_renew($1, $2)", &[&pool, &owner])
                        .await?;
                }
            }
            Ok(())
        }
        .await;
        match r {
            Ok(()) => {
                if let Err(e) = c.batch_execute("COMMIT").await {
                    assert!(tolerated(&e), "writer {idx} ({level}) commit: {e}");
                    continue;
                }
            }
            Err(e) => {
                c.batch_execute("ROLLBACK").await.unwrap();
                assert!(tolerated(&e), "writer {idx} ({level}) op {op}: {e}");
                continue;
            }
        }
        // A fresh pin must read back present (autocommit, after the commit).
        if op <= 2 {
            c.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                .await
                .unwrap();
            let held = c
                .query(
                    "SELECT * FROM alkblobs_pins_held($1, $2, $3)",
                    &[&pool, &owner, &vec![k.clone()]],
                )
                .await
                .unwrap();
            let present = exists(&c, pool, &k).await;
            c.batch_execute("COMMIT").await.unwrap();
            assert!(
                held.is_empty() || present,
                "writer {idx}: a fresh pin reads back missing"
            );
            if rng.next(2) == 0 {
                c.query_one("SELECT alkblobs_unpin($1, $2, $3)", &[&pool, &k, &owner])
                    .await
                    .unwrap();
            }
        }
    }
}

async fn race_sweeper(pool: &str) {
    let c = connect().await;
    let start = std::time::Instant::now();
    while start.elapsed() < RACE_FOR + Duration::from_secs(2) {
        let r = c
            .query_one("SELECT aborted FROM alkblobs_sweep($1)", &[&pool])
            .await
            .unwrap_or_else(|e| panic!("sweep: {e}"));
        let aborted: Option<String> = r.get(0);
        assert!(
            aborted.is_none() || aborted.as_deref() == Some("sweeper_lock"),
            "{aborted:?}"
        );
    }
}

/// Puts its keys, says READY, is stopped (SIGSTOP) past its pin TTL by the
/// parent, and then behaves like a node that does not know it was away.
async fn race_stopped_pinner(pool: &str, table: &str, idx: u64) {
    let c = connect().await;
    let owner = format!("stopped-{idx}");
    let mut ks = Vec::new();
    for i in 0..20u64 {
        let v = format!("stopped pinner {idx} {i}").into_bytes();
        c.query_one(
            "SELECT alkblobs_put($1, $2, $3, $4)",
            &[&pool, &key(&v), &v, &owner],
        )
        .await
        .unwrap();
        ks.push(key(&v));
    }
    println!("READY");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Back: check before publishing, then record references.
    let held: Vec<Vec<u8>> = c
        .query(
            "SELECT * FROM alkblobs_pins_held($1, $2, $3)",
            &[&pool, &owner, &ks],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for k in &held {
        assert!(
            exists(&c, pool, k).await,
            "pins_held confirms deleted content"
        );
    }
    for k in &ks {
        match c
            .execute(
                &format!(
                    "INSERT INTO {table} (key, worker) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING"
                ),
                &[k, &(idx as i32)],
            )
            .await
        {
            Ok(_) => {}
            Err(e) => assert!(tolerated(&e), "stopped pinner: {e}"),
        }
    }
}

async fn race_uploader(pool: &str, idx: u64) {
    let c = connect().await;
    let owner = format!("uploader-{idx}");
    let start = std::time::Instant::now();
    let mut n = 0u64;
    while start.elapsed() < RACE_FOR {
        n += 1;
        let content: Vec<u8> = (0..200_000u32)
            .map(|i| (i.wrapping_mul(31) ^ (n as u32 % 7)) as u8)
            .collect();
        let k = key(&content);
        if n.is_multiple_of(5) {
            // abandoned: created in autocommit, never committed as an entry
            c.query_one("SELECT alkblobs_lo_create($1)", &[&pool])
                .await
                .unwrap();
            continue;
        }
        c.batch_execute("BEGIN").await.unwrap();
        let oid: u32 = c
            .query_one("SELECT alkblobs_lo_create($1)", &[&pool])
            .await
            .unwrap()
            .get(0);
        for (i, chunk) in content.chunks(65_536).enumerate() {
            c.execute(
                "SELECT alkblobs_lo_write($1, $2, $3)",
                &[&oid, &((i * 65_536) as i64), &chunk],
            )
            .await
            .unwrap();
        }
        c.query_one(
            "SELECT alkblobs_lo_commit($1, $2, $3, $4)",
            &[&pool, &k, &oid, &owner],
        )
        .await
        .unwrap();
        c.batch_execute("COMMIT").await.unwrap();
        let back: Option<Vec<u8>> = c
            .query_one("SELECT alkblobs_lo_read($1, $2, 0, 1000000)", &[&pool, &k])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            back.as_deref().map(key),
            Some(k.clone()),
            "an upload reads back other bytes"
        );
        c.query_one("SELECT alkblobs_unpin($1, $2, $3)", &[&pool, &k, &owner])
            .await
            .unwrap();
    }
}

/// `wait_with_output` for a child whose stdout is piped, by reference.
trait WaitRef {
    fn wait_with_output_ref(&mut self) -> (std::process::ExitStatus, String);
}

impl WaitRef for std::process::Child {
    fn wait_with_output_ref(&mut self) -> (std::process::ExitStatus, String) {
        use std::io::Read;
        let mut s = String::new();
        if let Some(mut o) = self.stdout.take() {
            let _ = o.read_to_string(&mut s);
        }
        (self.wait().unwrap(), s)
    }
}

/// Entry point of the worker processes the randomized race starts: this
/// test binary re-executed with `--exact` on this test and `ALKBLOBS_RACE_WORKER`
/// set to `<kind>:<pool>:<table>:<index>`. Without the variable (an ordinary
/// test run) there is nothing to do: the race itself is the test below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn race_worker_process_entry_point() {
    let Ok(spec) = std::env::var(WORKER) else {
        return;
    };
    let parts: Vec<&str> = spec.split(':').collect();
    let (kind, pool, table, idx) = (
        parts[0],
        parts[1],
        parts[2],
        parts[3].parse::<u64>().unwrap(),
    );
    match kind {
        "writer" => race_writer(pool, table, idx).await,
        "sweeper" => race_sweeper(pool).await,
        "stopped" => race_stopped_pinner(pool, table, idx).await,
        "uploader" => race_uploader(pool, idx).await,
        other => panic!("unknown worker kind {other}"),
    }
    println!("WORKER-OK {spec}");
}

/// Writers at all three isolation levels (put / pin / renew / unpin, and
/// liveness rows by insert, key update, delete, multi-row insert and COPY),
/// two looping sweepers, a pinner stopped with SIGSTOP past its TTL, and a
/// large-object uploader, each an OS process. Afterwards no liveness row
/// names deleted content (a write whose content was gone failed with
/// AB002), no fresh pin read back missing, no large object reads back bytes
/// that do not hash to its key, and no worker saw an unexpected error such
/// as XX000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_processes_never_lose_protected_content() {
    use std::process::{Command, Stdio};
    let setup = connect().await;
    let pool = pool(&setup, "random", "0 seconds", "2 seconds").await;
    let table = table_name(&pool, "refs");
    setup
        .batch_execute(&format!(
            "CREATE TABLE {table} (key bytea PRIMARY KEY, worker int)"
        ))
        .await
        .unwrap();
    register(&setup, &pool, &table).await;
    let exe = std::env::current_exe().unwrap();
    let spawn = |spec: String| {
        Command::new(&exe)
            .args([
                "--exact",
                "race_worker_process_entry_point",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(WORKER, spec)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn a worker process")
    };
    let mut stopped = spawn(format!("stopped:{pool}:{table}:0"));
    // Wait for it to say READY, then stop it past its TTL while the rest run.
    let mut out = stopped.stdout.take().unwrap();
    let ready = std::thread::spawn(move || {
        use std::io::Read;
        let mut seen = Vec::new();
        let mut b = [0u8; 1];
        while out.read(&mut b).unwrap_or(0) == 1 {
            seen.push(b[0]);
            if seen.ends_with(b"READY\n") {
                break;
            }
        }
        let mut rest = Vec::new();
        let _ = out.read_to_end(&mut rest);
        seen.extend(rest);
        String::from_utf8_lossy(&seen).into_owned()
    });
    let mut others: Vec<_> = (0..3)
        .map(|i| spawn(format!("writer:{pool}:{table}:{i}")))
        .chain((0..2).map(|i| spawn(format!("sweeper:{pool}:{table}:{i}"))))
        .chain(std::iter::once(spawn(format!("uploader:{pool}:{table}:0"))))
        .collect();
    for _ in 0..200 {
        let n: i64 = setup
            .query_one(
                "SELECT count(*) FROM alkblobs_pins WHERE pool = $1 AND owner = 'stopped-0'",
                &[&pool],
            )
            .await
            .unwrap()
            .get(0);
        if n == 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let spid = stopped.id() as i32;
    unsafe { libc::kill(spid, libc::SIGSTOP) };
    tokio::time::sleep(Duration::from_secs(5)).await;
    unsafe { libc::kill(spid, libc::SIGCONT) };
    let status = stopped.wait().unwrap();
    let said = ready.join().unwrap();
    assert!(
        status.success() && said.contains("WORKER-OK"),
        "stopped pinner: {said}"
    );
    for (i, child) in others.iter_mut().enumerate() {
        let out = child.wait_with_output_ref();
        assert!(
            out.0.success() && out.1.contains("WORKER-OK"),
            "worker {i} failed: {}",
            out.1
        );
    }
    // Afterwards: every recorded key is present...
    assert!(
        all_named_keys_present(&setup, &pool, &table).await,
        "a liveness row names deleted content"
    );
    // ...and every large object hashes to its key.
    let los = setup
        .query(
            "SELECT e.key FROM alkblobs.entries e JOIN alkblobs.pools p ON p.id = e.pool
              WHERE p.name = $1 AND e.tier = 'lo'",
            &[&pool],
        )
        .await
        .unwrap();
    for r in los {
        let k: Vec<u8> = r.get(0);
        let back: Vec<u8> = setup
            .query_one("SELECT alkblobs_lo_read($1, $2, 0, 1000000)", &[&pool, &k])
            .await
            .unwrap()
            .get(0);
        assert_eq!(key(&back), k, "a large object does not hash to its key");
    }
    // ...and an audit (the full mark) finds nothing the review queue
    // missed: every event that left a key unprotected queued it.
    assert_eq!(
        alkblobs_tests::pg::audit_missed(&setup, &pool).await,
        0,
        "keys the review queue missed"
    );
}
