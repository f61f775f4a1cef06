//! Connections to the test server for the PostgreSQL suites.
//!
//! `ALKBLOBS_PG_URL` (set by `scripts/test.sh`, which starts the server and
//! installs the extension) names the database. A missing variable or an
//! unreachable server is a test failure, never a skip.

use std::sync::atomic::{AtomicU32, Ordering};

use tokio_postgres::{Client, NoTls};

/// The test database URL; panics with instructions if unset.
pub fn url() -> String {
    std::env::var("ALKBLOBS_PG_URL").unwrap_or_else(|_| {
        panic!(
            "ALKBLOBS_PG_URL is not set: the PostgreSQL suites need the server that \
             scripts/test.sh starts (run scripts/test.sh, or scripts/pg-cluster.sh start \
             and export ALKBLOBS_PG_URL=$(scripts/pg-cluster.sh url))"
        )
    })
}

/// A new connection; its driver task runs in the background.
pub async fn connect() -> Client {
    let (client, conn) = tokio_postgres::connect(&url(), NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the test server at {}: {e}", url()));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// Whether the suites run against the SQL-only flavour
/// (`ALKBLOBS_PG_FLAVOUR=sql-only`, set by `scripts/test.sh` for the
/// cluster where the install script ran and the library is never loaded).
pub fn sql_only() -> bool {
    std::env::var("ALKBLOBS_PG_FLAVOUR").as_deref() == Ok("sql-only")
}

/// Creates the extension if needed (tests run in one shared database). In
/// the SQL-only flavour's run, checks instead that the database has that
/// install (scripts/test.sh ran it as a non-superuser) and never creates
/// the extension.
pub async fn ensure_extension(c: &Client) {
    if sql_only() {
        let flavour: String = c
            .query_one("SELECT alkblobs_flavour()", &[])
            .await
            .expect("the SQL-only install (scripts/test.sh runs it before the suites)")
            .get(0);
        assert_eq!(
            flavour, "sql-only",
            "ALKBLOBS_PG_FLAVOUR=sql-only, but the database has the {flavour} flavour"
        );
        return;
    }
    // Tests of a fresh database start together: concurrent CREATE
    // EXTENSION IF NOT EXISTS can both try (23505), so one at a time.
    c.batch_execute(
        "BEGIN; SELECT pg_advisory_xact_lock(7419, 1); CREATE EXTENSION IF NOT EXISTS alkblobs; COMMIT",
    )
    .await
    .expect("CREATE EXTENSION alkblobs");
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A fresh fleet pool with a unique name (large tier `pg-lo`). Calls
/// `alkblobs_create_pool` with the three arguments every version has, so
/// the hardening tests also run against the extension before them.
pub async fn pool(c: &Client, tag: &str, window: &str, ttl: &str) -> String {
    ensure_extension(c).await;
    let name = unique(tag);
    c.execute(
        "SELECT alkblobs_create_pool($1, $2::text::interval, $3::text::interval)",
        &[&name, &window, &ttl],
    )
    .await
    .expect("create pool");
    check_collector(c, &name).await;
    name
}

/// With `ALKBLOBS_PG_COLLECTOR` set (scripts/test.sh's pass over the
/// full-mark collector, whose database defaults to it), checks that
/// `pool` got that collector: the pass must test what it says it tests.
pub async fn check_collector(c: &Client, pool: &str) {
    if let Ok(want) = std::env::var("ALKBLOBS_PG_COLLECTOR") {
        let got: String = c
            .query_one(
                "SELECT collector FROM alkblobs_pools WHERE pool = $1",
                &[&pool],
            )
            .await
            .expect("alkblobs_pools")
            .get(0);
        assert_eq!(
            got, want,
            "ALKBLOBS_PG_COLLECTOR={want}, but pool {pool} has {got}"
        );
    }
}

/// A name for `tag` no other test or run uses.
pub fn unique(tag: &str) -> String {
    format!(
        "{tag}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    )
}

/// A fresh pool with a unique name, its large tier and mode given.
pub async fn pool_with(
    c: &Client,
    tag: &str,
    window: &str,
    ttl: &str,
    large: &str,
    single_instance: bool,
) -> String {
    ensure_extension(c).await;
    let name = unique(tag);
    c.execute(
        "SELECT alkblobs_create_pool($1, $2::text::interval, $3::text::interval, $4, single_instance => $5)",
        &[&name, &window, &ttl, &large, &single_instance],
    )
    .await
    .expect("create pool");
    check_collector(c, &name).await;
    name
}

/// The key of `bytes`.
pub fn key(bytes: &[u8]) -> Vec<u8> {
    blake3::hash(bytes).as_bytes().to_vec()
}

/// `sql` with every `alkblobs_key('<text>')` replaced by the key as a
/// bytea literal computed here, so that a statement runs on the SQL-only
/// flavour too (whose server cannot compute BLAKE3; its `alkblobs_key`
/// says so). The text may not contain a quote.
pub fn sql_keys(sql: &str) -> String {
    let mut out = String::new();
    let mut rest = sql;
    while let Some(at) = rest.find("alkblobs_key('") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "alkblobs_key('".len()..];
        let end = after.find("')").expect("alkblobs_key('…') closed");
        let hex: String = key(&after.as_bytes()[..end])
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        out.push_str(&format!("'\\x{hex}'::bytea"));
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

/// The server's major version (15, 17, 18): the one place the suites ask,
/// for the few behaviours PostgreSQL itself changed between majors.
pub async fn server_major(c: &Client) -> i32 {
    let num: String = c
        .query_one("SELECT current_setting('server_version_num')", &[])
        .await
        .unwrap()
        .get(0);
    num.parse::<i32>().unwrap() / 10000
}

/// The SQLSTATE of a failed statement.
pub fn sqlstate(e: &tokio_postgres::Error) -> String {
    e.code()
        .map(|c| c.code().to_owned())
        .unwrap_or_else(|| format!("no SQLSTATE: {e}"))
}

/// Whether `pid` is waiting on a heavyweight lock (proof a race test really
/// made one session wait for another).
///
/// Polls for up to 20 s and returns as soon as the wait is seen: a loaded
/// server (autovacuum after a large sweep, a cold cache) can take a while to
/// bring the session to its lock, and a short limit would read that as
/// "never waited".
pub async fn waits_on_lock(observer: &Client, pid: i32) -> bool {
    for _ in 0..2000 {
        let row = observer
            .query_opt(
                "SELECT coalesce(wait_event_type, '') FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .expect("pg_stat_activity");
        match row {
            // The session already finished (and hung up): it never waited.
            None => return false,
            Some(r) if r.get::<_, String>(0) == "Lock" => return true,
            Some(_) => {}
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    false
}

/// The backend pid of a connection.
pub async fn pid(c: &Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

/// Whether `key` is an entry of `pool`.
pub async fn exists(c: &Client, pool: &str, key: &[u8]) -> bool {
    c.query_one("SELECT count(*) FROM alkblobs_stat($1, $2)", &[&pool, &key])
        .await
        .unwrap()
        .get::<_, i64>(0)
        == 1
}

/// A connection as `role` (a LOGIN role; the test cluster trusts loopback).
pub async fn connect_as(role: &str) -> Client {
    let url = url().replacen("postgres@", &format!("{role}@"), 1);
    let (client, conn) = tokio_postgres::connect(&url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect as {role}: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A new LOGIN role, unique to this run, member of `member_of` (e.g.
/// `alkblobs_admin`). Created by the superuser connection `c`.
pub async fn login_role(c: &Client, tag: &str, member_of: &str) -> String {
    ensure_extension(c).await;
    let name = format!(
        "t_{tag}_{}_{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    );
    // One at a time (an advisory lock held to commit): two concurrent
    // GRANTs on schema public update its ACL tuple at once and one fails
    // with XX000 "tuple concurrently updated".
    c.batch_execute(&format!(
        "BEGIN; SELECT pg_advisory_xact_lock(7316001); \
         CREATE ROLE {name} LOGIN IN ROLE {member_of}; GRANT CREATE ON SCHEMA public TO {name}; COMMIT"
    ))
    .await
    .expect("create login role");
    name
}

/// Grants `role` `access` ('read', 'write', 'sweep' or 'admin') on `pool`.
/// (Tolerates only a server without per-pool grants, 42883, so that the
/// hardening tests can be run against the extension from before they
/// existed and fail on the defect they target rather than here.)
pub async fn grant_pool(c: &Client, pool: &str, role: &str, access: &str) {
    if let Err(e) = c
        .execute(
            "SELECT alkblobs_grant_pool($1, $2::text::regrole, $3)",
            &[&pool, &role, &access],
        )
        .await
    {
        assert_eq!(sqlstate(&e), "42883", "alkblobs_grant_pool: {e}");
    }
}

/// `alkblobs_put` of `value` pinned for `owner`; true if the entry is new.
pub async fn put(c: &Client, pool: &str, value: &[u8], owner: &str) -> bool {
    c.query_one(
        "SELECT alkblobs_put($1, $2, $3, $4)",
        &[&pool, &key(value), &value, &owner],
    )
    .await
    .unwrap()
    .get(0)
}

/// Releases `owner`'s pin on `value`'s key.
pub async fn unpin(c: &Client, pool: &str, value: &[u8], owner: &str) {
    c.query_one(
        "SELECT alkblobs_unpin($1, $2, $3)",
        &[&pool, &key(value), &owner],
    )
    .await
    .unwrap();
}

/// An unprotected entry: put, then unpinned. Returns its key.
pub async fn garbage(c: &Client, pool: &str, value: &[u8]) -> Vec<u8> {
    put(c, pool, value, "setup").await;
    unpin(c, pool, value, "setup").await;
    key(value)
}

/// Publishes `key` as a file of local-tier `pool` the way a node does:
/// `alkblobs_pin_new` (pin and record), then, with the file in place,
/// `alkblobs_local_published`. Leaves `owner`'s pin in place.
pub async fn publish_file(c: &Client, pool: &str, key: &[u8], owner: &str) {
    c.execute(
        "SELECT alkblobs_pin_new($1, $2, $3)",
        &[&pool, &key, &owner],
    )
    .await
    .expect("alkblobs_pin_new");
    let marked = c
        .query(
            "SELECT * FROM alkblobs_local_published($1, ARRAY[$2::bytea], $3)",
            &[&pool, &key, &owner],
        )
        .await
        .expect("alkblobs_local_published");
    assert_eq!(marked.len(), 1, "the file's record vanished");
}

/// A table name for `pool` with `suffix` (pool names may hold `-.:`).
pub fn table_name(pool: &str, suffix: &str) -> String {
    format!("{}_{suffix}", pool.replace(['-', '.', ':'], "_"))
}

/// The pid of the extension's scheduler serving database `datname`, if
/// one is running now (`pg_stat_activity`, as the superuser `c`).
pub async fn scheduler_pid_now(c: &Client, datname: &str) -> Option<i32> {
    c.query_opt(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'alkblobs scheduler' AND datname = $1",
        &[&datname],
    )
    .await
    .expect("pg_stat_activity")
    .map(|r| r.get(0))
}

/// A connection to `url` and the notices and warnings it receives
/// (`"SEVERITY: message"` each), for tests of what the extension says.
pub async fn connect_collecting(url: &str) -> (Client, std::sync::mpsc::Receiver<String>) {
    let (client, mut conn) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
    let (tx, rx) = std::sync::mpsc::channel();
    tokio::spawn(async move {
        let mut stream = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = futures::StreamExt::next(&mut stream).await {
            if let tokio_postgres::AsyncMessage::Notice(n) = m {
                let _ = tx.send(format!("{}: {}", n.severity(), n.message()));
            }
        }
    });
    (client, rx)
}

/// The lowercase hex digits of `b` (for a `'\x…'::bytea` literal).
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// (deleted, aborted) of one `alkblobs_sweep` call, or its SQLSTATE alone
/// (for tests that compare the error with a SQLSTATE).
pub async fn try_sweep(c: &Client, pool: &str) -> Result<(i64, Option<String>), String> {
    c.query_one("SELECT deleted, aborted FROM alkblobs_sweep($1)", &[&pool])
        .await
        .map(|r| (r.get(0), r.get(1)))
        .map_err(|e| sqlstate(&e))
}

/// (deleted, aborted) of one `alkblobs_sweep` call, or its SQLSTATE, a
/// space and the whole error (`{e:?}`: message, detail and all), for tests
/// that also look at what the error says, e.g. that no planted function
/// ran.
pub async fn try_sweep_detailed(c: &Client, pool: &str) -> Result<(i64, Option<String>), String> {
    c.query_one("SELECT deleted, aborted FROM alkblobs_sweep($1)", &[&pool])
        .await
        .map(|r| (r.get(0), r.get(1)))
        .map_err(|e| format!("{} {e:?}", sqlstate(&e)))
}

/// Registers `table` as a liveness source of `pool`; panics if refused.
pub async fn register(c: &Client, pool: &str, table: &str) {
    c.execute(
        "SELECT alkblobs_register_liveness($1, $2::text::regclass)",
        &[&pool, &table],
    )
    .await
    .unwrap();
}

/// Registers `table` as a liveness source of `pool`: Ok, or the SQLSTATE
/// of the refusal.
pub async fn try_register(c: &Client, pool: &str, table: &str) -> Result<(), String> {
    c.execute(
        "SELECT alkblobs_register_liveness($1, $2::text::regclass)",
        &[&pool, &table],
    )
    .await
    .map(|_| ())
    .map_err(|e| sqlstate(&e))
}

/// `INSERT INTO table VALUES (k)`: Ok, or the SQLSTATE.
pub async fn reference(c: &Client, table: &str, k: &[u8]) -> Result<(), String> {
    c.execute(&format!("INSERT INTO {table} VALUES ($1)"), &[&k])
        .await
        .map(|_| ())
        .map_err(|e| sqlstate(&e))
}

/// The liveness table `<pool>_refs (key bytea PRIMARY KEY, seed bigint)`
/// of the multi-process races (each row names a key and the seed of its
/// bytes), registered with `pool`; its name.
pub async fn seeded_refs(c: &Client, pool: &str) -> String {
    let table = table_name(pool, "refs");
    c.batch_execute(&format!(
        "CREATE TABLE {table} (key bytea PRIMARY KEY, seed bigint NOT NULL)"
    ))
    .await
    .unwrap();
    c.execute(
        "SELECT alkblobs_register_liveness($1, $2::text::regclass)",
        &[&pool, &table],
    )
    .await
    .unwrap();
    table
}

/// Every row of a [`seeded_refs`] table (there is one at least) names a
/// key `store` holds with its seed's bytes (`crate::fleet_value`).
pub async fn seeded_refs_intact(c: &Client, table: &str, store: &alkblobs::Store) {
    let rows = c
        .query(&format!("SELECT key, seed FROM {table}"), &[])
        .await
        .unwrap();
    assert!(!rows.is_empty());
    for r in rows {
        let k = alkblobs::Key::from_slice(&r.get::<_, Vec<u8>>(0)).unwrap();
        let v = crate::fleet_value(r.get::<_, i64>(1) as u64);
        assert_eq!(
            store.get(&k).await.unwrap().as_deref(),
            Some(&v[..]),
            "a live key lost its content"
        );
    }
}

/// Every key named in `table` (its column `key`) is present in `pool`.
pub async fn all_named_keys_present(c: &Client, pool: &str, table: &str) -> bool {
    let rows = c
        .query(&format!("SELECT key FROM {table}"), &[])
        .await
        .unwrap();
    for r in rows {
        let k: Vec<u8> = r.get(0);
        if !exists(c, pool, &k).await {
            return false;
        }
    }
    true
}

/// Runs `scripts/pg-cluster.sh CMD` on the test cluster (`restart`,
/// `down-for 4`, `log`, …); its output, trimmed. Suites that restart the
/// server run alone (scripts/test.sh).
pub fn cluster(cmd: &str) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/pg-cluster.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .args(cmd.split(' '))
        .output()
        .unwrap_or_else(|e| panic!("run pg-cluster.sh {cmd}: {e}"));
    assert!(
        out.status.success(),
        "pg-cluster.sh {cmd} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Retries `f` while it fails with a retryable error (a pool reconnecting
/// after a restart), at most ~10 s.
pub async fn eventually<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = alkblobs::Result<T>>,
{
    for _ in 0..100 {
        match f().await {
            Ok(v) => return v,
            Err(e) => assert!(e.is_retryable(), "not retryable after a restart: {e}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("still failing 10 s after the restart");
}

/// `CALL alkblobs_audit(pool)` (the full mark, bounded calls), then the
/// number of keys that audit's slices staged which no queue row, staged
/// row or pin accounted for: events the review queue missed. The race
/// suites assert 0 after their races (on a 'mark' pool, every sweep
/// marks, and nothing is ever counted).
pub async fn audit_missed(c: &Client, pool: &str) -> i64 {
    let last: i64 = c
        .query_one(
            "SELECT coalesce(max(id), 0) FROM alkblobs_sweeps WHERE pool = $1",
            &[&pool],
        )
        .await
        .expect("alkblobs_sweeps")
        .get(0);
    c.batch_execute(&format!("CALL alkblobs_audit('{pool}')"))
        .await
        .unwrap_or_else(|e| panic!("CALL alkblobs_audit('{pool}'): {e:?}"));
    c.query_one(
        "SELECT coalesce(sum(missed), 0)::bigint FROM alkblobs_sweeps
          WHERE pool = $1 AND id > $2 AND audit IS NOT NULL",
        &[&pool, &last],
    )
    .await
    .expect("alkblobs_sweeps")
    .get(0)
}
