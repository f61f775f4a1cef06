//! Registered liveness tables: registration and unregistration, the guard
//! trigger on their writes, and DDL on them after registration (the rows
//! and definitions a sweep relies on), each over real connections to the
//! test server. docs/design.md §4 lists which guard each test covers and
//! the mutation runs against it.

#![cfg(feature = "pg")]

use std::time::Duration;

use alkblobs_tests::pg::{
    all_named_keys_present, connect, connect_as, exists, garbage, grant_pool, hex, key, login_role,
    pid, pool, put, reference, register, sql_keys, sqlstate, table_name, try_register, try_sweep,
    try_sweep_detailed, waits_on_lock,
};
use tokio_postgres::Client;

/// Runs `write` (a statement naming `k` in `table`) while an executor that
/// has already deleted `k` holds its locks, then commits the executor.
/// Returns the write's outcome; asserts no committed row names gone content.
async fn write_while_collected(
    obs: &Client,
    pool: &str,
    table: &str,
    k: &[u8],
    write: String,
) -> Result<u64, String> {
    let s = connect().await;
    let w = connect().await;
    s.batch_execute("BEGIN").await.unwrap();
    assert_eq!(try_sweep(&s, pool).await, Ok((1, None)));
    let w_pid = pid(&w).await;
    let k2 = k.to_vec();
    let writer =
        tokio::spawn(async move { w.execute(&write, &[&k2]).await.map_err(|e| sqlstate(&e)) });
    // The write must wait for the executor (or fail at once); give it time.
    let waited = waits_on_lock(obs, w_pid).await;
    s.batch_execute("COMMIT").await.unwrap();
    let r = writer.await.unwrap();
    assert!(
        all_named_keys_present(obs, pool, table).await,
        "a liveness row names deleted content (waited: {waited}, write: {r:?})"
    );
    r
}

async fn db_name(c: &Client) -> String {
    c.query_one("SELECT current_database()", &[])
        .await
        .unwrap()
        .get(0)
}

/// A registered table dropped by `DROP TYPE … CASCADE` or `DROP EXTENSION`
/// (not `DROP TABLE`) is unregistered too, so its OID cannot be reused by
/// another table that then silently counts as a liveness source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_dropped_by_cascade_is_unregistered() {
    let c = connect().await;
    let pool = pool(&c, "cascade", "0 seconds", "60 seconds").await;
    let ty = table_name(&pool, "ty");
    let t1 = table_name(&pool, "typed");
    c.batch_execute(&format!(
        "CREATE TYPE {ty} AS (key bytea); CREATE TABLE {t1} OF {ty}"
    ))
    .await
    .unwrap();
    register(&c, &pool, &t1).await;
    c.batch_execute(&format!("DROP TYPE {ty} CASCADE"))
        .await
        .unwrap();
    let t2 = table_name(&pool, "member");
    c.batch_execute(&format!(
        "CREATE EXTENSION IF NOT EXISTS tcn; CREATE TABLE {t2} (key bytea PRIMARY KEY)"
    ))
    .await
    .unwrap();
    register(&c, &pool, &t2).await;
    c.batch_execute(&format!(
        "ALTER EXTENSION tcn ADD TABLE {t2}; DROP EXTENSION tcn CASCADE"
    ))
    .await
    .unwrap();
    // The SQL-only flavour has no event triggers: a dropped table's
    // registration goes at the pool's next use (a sweep here). The library
    // flavour's drop trigger removes it at once, so nothing runs first.
    if alkblobs_tests::pg::sql_only() {
        try_sweep(&c, &pool)
            .await
            .expect("the sweep that removes them");
    }
    // The registrations themselves, not alkblobs_usage (whose count leaves
    // out a row naming a relation that no longer exists).
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM alkblobs.liveness l JOIN alkblobs.pools p ON p.id = l.pool \
             WHERE p.name = $1",
            &[&pool],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "registrations of dropped tables must go with them");
}

/// (a) A writer at REPEATABLE READ whose snapshot predates the put.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_repeatable_read_writer_cannot_record_a_key_it_does_not_lock() {
    let obs = connect().await;
    let w = connect().await;
    let pool = pool(&obs, "guard-rr", "0 seconds", "60 seconds").await;
    let table = table_name(&pool, "live");
    obs.batch_execute(&format!("CREATE TABLE {table} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    register(&obs, &pool, &table).await;
    w.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .await
        .unwrap();
    let k = garbage(&obs, &pool, b"put after the writer's snapshot").await;
    let wrote = w
        .execute(&format!("INSERT INTO {table} VALUES ($1)"), &[&k])
        .await;
    let swept = try_sweep(&obs, &pool).await;
    let committed = match wrote {
        Ok(_) => w.batch_execute("COMMIT").await.map_err(|e| sqlstate(&e)),
        Err(e) => {
            w.batch_execute("ROLLBACK").await.unwrap();
            Err(sqlstate(&e))
        }
    };
    if committed.is_ok() {
        assert!(
            all_named_keys_present(&obs, &pool, &table).await,
            "a committed liveness row names deleted content (sweep: {swept:?})"
        );
    } else {
        assert!(
            ["AB002", "40001"].contains(&committed.clone().unwrap_err().as_str()),
            "{committed:?}"
        );
    }
}

/// (b) a STORED generated key and (c) a user BEFORE trigger that sets the
/// key after the guard ran: the guard must see the final key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_guard_sees_generated_keys_and_keys_set_by_later_triggers() {
    let obs = connect().await;
    let pool = pool(&obs, "guard-final", "0 seconds", "60 seconds").await;
    let generated = table_name(&pool, "gen");
    obs.batch_execute(&format!(
        "CREATE TABLE {generated} (hex text, key bytea GENERATED ALWAYS AS (decode(hex, 'hex')) STORED)"
    ))
    .await
    .unwrap();
    register(&obs, &pool, &generated).await;
    let k = garbage(&obs, &pool, b"generated key").await;
    let r = write_while_collected(
        &obs,
        &pool,
        &generated,
        &k,
        format!("INSERT INTO {generated} (hex) VALUES (encode($1, 'hex'))"),
    )
    .await;
    assert_eq!(r, Err("AB002".into()));

    let late = table_name(&pool, "late");
    obs.batch_execute(&format!(
        "CREATE TABLE {late} (key bytea, hex text);
         CREATE FUNCTION {late}_set() RETURNS trigger LANGUAGE plpgsql AS $f$
         BEGIN NEW.key := decode(NEW.hex, 'hex'); RETURN NEW; END $f$;"
    ))
    .await
    .unwrap();
    register(&obs, &pool, &late).await;
    obs.batch_execute(&format!(
        "CREATE TRIGGER zzz_set_key BEFORE INSERT ON {late} FOR EACH ROW EXECUTE FUNCTION {late}_set()"
    ))
    .await
    .unwrap();
    let k = garbage(&obs, &pool, b"key set by a later trigger").await;
    let r = write_while_collected(
        &obs,
        &pool,
        &late,
        &k,
        format!("INSERT INTO {late} (hex) SELECT encode($1::bytea, 'hex')"),
    )
    .await;
    assert_eq!(r, Err("AB002".into()));
}

/// (d) INHERITS children: registration refuses a parent with children, and
/// a child added later makes every sweep refuse the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inheritance_children_are_refused() {
    let obs = connect().await;
    let pool = pool(&obs, "guard-inherit", "0 seconds", "60 seconds").await;
    let parent = table_name(&pool, "parent");
    let child = table_name(&pool, "child");
    obs.batch_execute(&format!("CREATE TABLE {parent} (key bytea)"))
        .await
        .unwrap();
    register(&obs, &pool, &parent).await;
    obs.batch_execute(&format!("CREATE TABLE {child} () INHERITS ({parent})"))
        .await
        .unwrap();
    let k = garbage(&obs, &pool, b"named by a child row").await;
    let s = connect().await;
    s.batch_execute("BEGIN").await.unwrap();
    let swept = try_sweep(&s, &pool).await;
    let wrote = obs
        .execute(&format!("INSERT INTO {child} VALUES ($1)"), &[&k])
        .await
        .map_err(|e| sqlstate(&e));
    s.batch_execute("COMMIT").await.unwrap();
    assert!(
        all_named_keys_present(&obs, &pool, &parent).await,
        "a child row names deleted content (sweep {swept:?}, write {wrote:?})"
    );
    assert_eq!(swept, Ok((0, Some("liveness_table_invalid".into()))));
    // A parent that already has children cannot be registered at all.
    let other = alkblobs_tests::pg::pool(&obs, "guard-inherit2", "0 seconds", "60 seconds").await;
    let e = obs
        .execute(
            "SELECT alkblobs_register_liveness($1, $2::text::regclass)",
            &[&other, &parent],
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "42809", "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_tables_owner_unregisters_it() {
    let su = connect().await;
    let team_a = login_role(&su, "team_a", "alkblobs_admin").await;
    let team_b = login_role(&su, "team_b", "alkblobs_admin").await;
    let a = connect_as(&team_a).await;
    let b = connect_as(&team_b).await;
    let pool = pool(&a, "unregister", "0 seconds", "60 seconds").await;
    let other = alkblobs_tests::pg::pool(&a, "unregister-other", "0 seconds", "60 seconds").await;
    grant_pool(&a, &pool, &team_b, "admin").await;
    let table = table_name(&pool, "a");
    a.batch_execute(&format!("CREATE TABLE {table} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    register(&a, &pool, &table).await;
    // Registered with a second pool too, so that unregistering from the
    // first drops no trigger (PostgreSQL's own ownership check on DROP
    // TRIGGER does not come into play): the extension must check.
    a.execute(
        "SELECT alkblobs_register_liveness($1, $2::text::regclass, forward_references => true)",
        &[&other, &table],
    )
    .await
    .unwrap();
    let k = garbage(&a, &pool, b"team a's live key").await;
    a.execute(&format!("INSERT INTO {table} VALUES ($1)"), &[&k])
        .await
        .unwrap();
    let r = b
        .query_one(
            "SELECT alkblobs_unregister_liveness($1, $2::text::regclass)",
            &[&pool, &table],
        )
        .await
        .map(|r| r.get::<_, bool>(0))
        .map_err(|e| sqlstate(&e));
    assert_eq!(
        r,
        Err("42501".into()),
        "another team unregistered the table"
    );
    // (PostgreSQL reports an error before its transaction has aborted and
    // released the pool lock the call took: wait for b to be idle, or the
    // sweep below may find the lock still held.)
    b.batch_execute("SELECT 1").await.unwrap();
    assert_eq!(try_sweep(&a, &pool).await, Ok((0, None)));
    assert!(exists(&su, &pool, &k).await);
    let e = a
        .query_one("SELECT alkblobs_unregister_liveness($1, NULL)", &[&pool])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22004", "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_to_absent_content_fails_with_ab002_unless_forward_references_are_allowed() {
    let c = connect().await;
    let pool = pool(&c, "absent-ref", "0 seconds", "60 seconds").await;
    let table = table_name(&pool, "live");
    c.batch_execute(&format!("CREATE TABLE {table} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    register(&c, &pool, &table).await;
    let k = garbage(&c, &pool, b"collected before the reference").await;
    assert_eq!(try_sweep(&c, &pool).await, Ok((1, None)));
    let e = c
        .execute(&format!("INSERT INTO {table} VALUES ($1)"), &[&k])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "AB002", "{e}");
    // Multi-row inserts too.
    let e = c
        .execute(
            &sql_keys(&format!(
                "INSERT INTO {table} VALUES ($1), (alkblobs_key('never put'))"
            )),
            &[&k],
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "AB002", "{e}");
    // Forward references are a registration option.
    let fwd = table_name(&pool, "fwd");
    c.batch_execute(&format!("CREATE TABLE {fwd} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    c.execute(
        "SELECT alkblobs_register_liveness($1, $2::text::regclass, forward_references => true)",
        &[&pool, &fwd],
    )
    .await
    .unwrap();
    c.execute(&format!("INSERT INTO {fwd} VALUES ($1)"), &[&k])
        .await
        .unwrap();
}

/// The lock rows are only ever locked, never updated: unregistering (the
/// one call that takes the sweeper lock and runs at every isolation level;
/// registration, staging, claims and sweeps need READ COMMITTED) in a
/// transaction whose snapshot predates a committed sweep, which locked the
/// same row, is not a serialization failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unregistration_after_a_sweep_at_every_isolation_level() {
    let c = connect().await;
    let other = connect().await;
    let pool = pool(&c, "locks-iso", "0 seconds", "60 seconds").await;
    for level in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let table = table_name(&pool, &level.replace(' ', "_").to_lowercase());
        c.batch_execute(&format!("CREATE TABLE {table} (key bytea PRIMARY KEY)"))
            .await
            .unwrap();
        register(&c, &pool, &table).await;
        // The snapshot is taken by the first statement.
        c.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}; SELECT 1"))
            .await
            .unwrap();
        assert_eq!(try_sweep(&other, &pool).await, Ok((0, None)));
        let unreg = c
            .query_one(
                "SELECT alkblobs_unregister_liveness($1, $2::text::regclass)",
                &[&pool, &table],
            )
            .await
            .map(|r| r.get::<_, bool>(0))
            .map_err(|e| sqlstate(&e));
        c.batch_execute(if unreg.is_ok() { "COMMIT" } else { "ROLLBACK" })
            .await
            .unwrap();
        assert_eq!(unreg, Ok(true), "unregistration at {level}");
    }
}

/// `alkblobs_health`'s status, invalid_sources and reasons for `pool`.
async fn pool_health(c: &Client, pool: &str) -> (String, i64, Vec<String>) {
    let r = c
        .query_one(
            "SELECT status, invalid_sources, reasons FROM alkblobs_health WHERE pool = $1",
            &[&pool],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

/// Rows that reached a registered table while its guard was off (DISABLE
/// then ENABLE TRIGGER, a partition attached with rows already in it) are
/// checked by the next sweep, which aborts while one names content the
/// pool does not hold, and goes on once it is fixed. In the library
/// flavour an event trigger marks the table for that check at the ALTER
/// TABLE; the SQL-only flavour has no event triggers and sees the changed
/// guard triggers instead (alkblobs.guard_state): this test runs in both.
#[tokio::test]
async fn rows_written_past_a_disabled_guard_make_the_next_sweep_check_every_row() {
    let c = connect().await;
    let pool = pool(&c, "guardoff", "0 seconds", "60 seconds").await;
    let t = table_name(&pool, "lv");
    c.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    register(&c, &pool, &t).await;
    assert_eq!(try_sweep(&c, &pool).await, Ok((0, None)));
    let absent = key(b"never put: written past the guard");
    c.batch_execute(&format!(
        "ALTER TABLE {t} DISABLE TRIGGER alkblobs_liveness_guard"
    ))
    .await
    .unwrap();
    c.execute(&format!("INSERT INTO {t} VALUES ($1)"), &[&absent])
        .await
        .unwrap();
    c.batch_execute(&format!(
        "ALTER TABLE {t} ENABLE ALWAYS TRIGGER alkblobs_liveness_guard"
    ))
    .await
    .unwrap();
    assert_eq!(
        try_sweep(&c, &pool).await,
        Ok((0, Some("liveness_table_invalid".into()))),
        "a row written past the guard went unchecked"
    );
    // Health says what the sweeps see: every sweep aborts, so critical.
    let (status, invalid, reasons) = pool_health(&c, &pool).await;
    assert_eq!((status.as_str(), invalid), ("critical", 1), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains(&t)), "{reasons:?}");
    c.execute(&format!("DELETE FROM {t} WHERE key = $1"), &[&absent])
        .await
        .unwrap();
    assert_eq!(try_sweep(&c, &pool).await, Ok((0, None)));
    let (status, invalid, reasons) = pool_health(&c, &pool).await;
    assert_eq!((status.as_str(), invalid), ("ok", 0), "{reasons:?}");

    // A partitioned table: a partition attached with a row already in it.
    let pt = table_name(&pool, "pt");
    let part = table_name(&pool, "pt_1");
    c.batch_execute(&format!(
        "CREATE TABLE {pt} (key bytea NOT NULL, n int NOT NULL) PARTITION BY RANGE (n);
         CREATE TABLE {part} (key bytea NOT NULL, n int NOT NULL);"
    ))
    .await
    .unwrap();
    register(&c, &pool, &pt).await;
    c.execute(&format!("INSERT INTO {part} VALUES ($1, 1)"), &[&absent])
        .await
        .unwrap();
    c.batch_execute(&format!(
        "ALTER TABLE {pt} ATTACH PARTITION {part} FOR VALUES FROM (0) TO (10)"
    ))
    .await
    .unwrap();
    assert_eq!(
        try_sweep(&c, &pool).await,
        Ok((0, Some("liveness_table_invalid".into()))),
        "an attached partition's rows went unchecked"
    );
}

/// While a sweep's transaction relies on a registered table, its owner
/// cannot disable the guard, add an index or attach anything: those wait
/// for the sweep (SHARE UPDATE EXCLUSIVE), writers do not. DDL that holds
/// the table makes a sweep give up after a bounded wait, as report data.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sweep_freezes_its_tables_definition_and_gives_up_on_ddl_in_progress() {
    let obs = connect().await;
    let pool = pool(&obs, "frozen", "0 seconds", "60 seconds").await;
    let t = table_name(&pool, "live");
    obs.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    try_register(&obs, &pool, &t).await.unwrap();
    let k = garbage(&obs, &pool, b"frozen live").await;
    let live = key(b"frozen other");
    put(&obs, &pool, b"frozen other", "w").await;
    let sweeper = connect().await;
    sweeper.batch_execute("BEGIN").await.unwrap();
    assert_eq!(try_sweep_detailed(&sweeper, &pool).await, Ok((1, None)));
    // A writer is not held up by the sweep…
    let w = connect().await;
    tokio::time::timeout(Duration::from_secs(10), reference(&w, &t, &live))
        .await
        .expect("a writer waited for the sweep")
        .unwrap();
    // …DDL on the table is.
    for ddl in [
        format!("ALTER TABLE {t} DISABLE TRIGGER alkblobs_liveness_guard"),
        format!("CREATE INDEX ON {t} (length(key))"),
    ] {
        let ddl_conn = connect().await;
        let ddl_pid = pid(&ddl_conn).await;
        let task = tokio::spawn(async move { ddl_conn.batch_execute(&ddl).await });
        assert!(
            waits_on_lock(&obs, ddl_pid).await,
            "DDL went ahead under a sweep that relies on the table"
        );
        obs.query_one("SELECT pg_cancel_backend($1)", &[&ddl_pid])
            .await
            .unwrap();
        let _ = task.await.unwrap();
    }
    sweeper.batch_execute("COMMIT").await.unwrap();
    assert!(!alkblobs_tests::pg::exists(&obs, &pool, &k).await);

    // DDL in progress: the sweep waits a bounded time and reports it.
    let ddl = connect().await;
    ddl.batch_execute(&format!("BEGIN; LOCK TABLE {t} IN SHARE MODE"))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(60), try_sweep_detailed(&sweeper, &pool))
        .await
        .expect("the sweep hung behind DDL");
    ddl.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(got, Ok((0, Some("liveness_table_busy".into()))));
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "no wait at all"
    );
}

/// Rows already in a table when it is registered (AB002 from the
/// registration), rows a partition brings in by ATTACH and rows written
/// while the guard was disabled (the next sweep aborts until they are gone)
/// and rows written under session_replication_role = replica (AB002) must
/// all name content the pool holds, and an unlogged table (emptied by a
/// crash) is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_that_bypassed_the_guard_are_checked_too() {
    let c = connect().await;
    let pool = pool(&c, "bypass", "0 seconds", "60 seconds").await;
    let absent = key(b"content nobody put");
    // Rows before registration.
    let pre = table_name(&pool, "pre");
    c.batch_execute(&format!("CREATE TABLE {pre} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    reference(&c, &pre, &absent).await.unwrap();
    assert_eq!(try_register(&c, &pool, &pre).await, Err("AB002".into()));
    // ATTACH PARTITION of a table with rows.
    let parted = table_name(&pool, "parted");
    let part = table_name(&pool, "part");
    c.batch_execute(&format!(
        "CREATE TABLE {parted} (key bytea NOT NULL) PARTITION BY HASH (key);
         CREATE TABLE {part} (key bytea NOT NULL);
         INSERT INTO {part} VALUES ('\\x{}'::bytea)",
        hex(&absent)
    ))
    .await
    .unwrap();
    try_register(&c, &pool, &parted).await.unwrap();
    // The DDL goes through (an event trigger reads no user table); the next
    // sweep checks the rows under its lock and refuses until they are gone.
    c.batch_execute(&format!(
        "ALTER TABLE {parted} ATTACH PARTITION {part} FOR VALUES WITH (MODULUS 1, REMAINDER 0)"
    ))
    .await
    .unwrap();
    assert_eq!(
        try_sweep_detailed(&c, &pool).await,
        Ok((0, Some("liveness_table_invalid".into())))
    );
    c.batch_execute(&format!("DELETE FROM {part}"))
        .await
        .unwrap();
    assert_eq!(try_sweep_detailed(&c, &pool).await, Ok((0, None)));
    // Written while the guard was disabled, found once it is back.
    let t = table_name(&pool, "live");
    c.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    try_register(&c, &pool, &t).await.unwrap();
    c.batch_execute(&format!(
        "ALTER TABLE {t} DISABLE TRIGGER alkblobs_liveness_guard"
    ))
    .await
    .unwrap();
    reference(&c, &t, &absent).await.unwrap();
    c.batch_execute(&format!(
        "ALTER TABLE {t} ENABLE ALWAYS TRIGGER alkblobs_liveness_guard"
    ))
    .await
    .unwrap();
    assert_eq!(
        try_sweep_detailed(&c, &pool).await,
        Ok((0, Some("liveness_table_invalid".into())))
    );
    c.batch_execute(&format!("DELETE FROM {t}")).await.unwrap();
    assert_eq!(try_sweep_detailed(&c, &pool).await, Ok((0, None)));
    // session_replication_role = replica (a superuser's setting).
    c.batch_execute("SET session_replication_role = replica")
        .await
        .unwrap();
    let r = reference(&c, &t, &absent).await;
    c.batch_execute("RESET session_replication_role")
        .await
        .unwrap();
    assert_eq!(r, Err("AB002".into()));
    // Unlogged.
    let unlogged = table_name(&pool, "unlogged");
    c.batch_execute(&format!(
        "CREATE UNLOGGED TABLE {unlogged} (key bytea PRIMARY KEY)"
    ))
    .await
    .unwrap();
    assert_eq!(
        try_register(&c, &pool, &unlogged).await,
        Err("42809".into())
    );
}

/// Registration takes the pool's sweeper lock before it locks the table,
/// the order a sweep takes them: re-registering a table while a sweep
/// holds the pool waits for the sweep and neither deadlocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn registering_during_a_sweep_does_not_deadlock() {
    let obs = connect().await;
    let pool = pool(&obs, "reg-order", "0 seconds", "60 seconds").await;
    let t = table_name(&pool, "live");
    obs.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    try_register(&obs, &pool, &t).await.unwrap();
    let id: i32 = obs
        .query_one("SELECT id FROM alkblobs.pools WHERE name = $1", &[&pool])
        .await
        .unwrap()
        .get(0);
    // A sweep that has taken the pool and not yet its tables.
    let sweeper = connect().await;
    sweeper
        .batch_execute(&format!("BEGIN; SELECT alkblobs.take_lock({id}, false)"))
        .await
        .unwrap();
    let admin = connect().await;
    let admin_pid = pid(&admin).await;
    let (p2, t2) = (pool.clone(), t.clone());
    let reg = tokio::spawn(async move { try_register(&admin, &p2, &t2).await });
    assert!(waits_on_lock(&obs, admin_pid).await);
    let swept = try_sweep_detailed(&sweeper, &pool).await;
    sweeper.batch_execute("COMMIT").await.unwrap();
    assert_eq!(swept, Ok((0, None)));
    assert_eq!(reg.await.unwrap(), Ok(()));
}

/// The extension reads a registered table through a view bound to its OID:
/// once schemas are swapped so that the table's old name means a decoy
/// whose rows come from the attacker's function, sweeps still read the
/// real table (and the protected key stays); and if the view itself were
/// made to read something else, every use refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renaming_schemas_cannot_swap_a_registered_table() {
    let su = connect().await;
    let m = login_role(&su, "swapper", "alkblobs_admin").await;
    su.batch_execute(&format!(
        "GRANT CREATE ON DATABASE {} TO {m}",
        db_name(&su).await
    ))
    .await
    .unwrap();
    let c = connect_as(&m).await;
    let pool = pool(&c, "swap", "0 seconds", "60 seconds").await;
    let app = table_name(&pool, "app");
    let decoy = table_name(&pool, "decoy");
    c.batch_execute(&format!(
        "CREATE SCHEMA {app}; CREATE TABLE {app}.refs (key bytea PRIMARY KEY);
         GRANT USAGE ON SCHEMA {app} TO alkblobs_owner;
         CREATE SCHEMA {decoy};
         CREATE FUNCTION {decoy}.pwn() RETURNS bytea LANGUAGE plpgsql AS $x$
         BEGIN
             IF current_user = 'alkblobs_owner' THEN RAISE EXCEPTION 'evil ran as %', current_user; END IF;
             RETURN NULL;
         END $x$;
         CREATE VIEW {decoy}.refs AS SELECT {decoy}.pwn() AS key;
         GRANT USAGE ON SCHEMA {decoy} TO alkblobs_owner;
         GRANT SELECT ON {decoy}.refs TO alkblobs_owner;"
    ))
    .await
    .unwrap();
    try_register(&c, &pool, &format!("{app}.refs"))
        .await
        .unwrap();
    let k = garbage(&c, &pool, b"kept by the real table").await;
    reference(&c, &format!("{app}.refs"), &k).await.unwrap();
    c.batch_execute(&format!(
        "ALTER SCHEMA {app} RENAME TO {app}_real; ALTER SCHEMA {decoy} RENAME TO {app};"
    ))
    .await
    .unwrap();
    let got = try_sweep_detailed(&connect().await, &pool).await;
    assert_eq!(got, Ok((0, None)), "the sweep read the decoy");
    assert!(alkblobs_tests::pg::exists(&su, &pool, &k).await);
    // The view made to read something else: refused, nothing deleted.
    su.batch_execute(&format!(
        "DO $$ BEGIN EXECUTE format('CREATE OR REPLACE VIEW alkblobs.%I AS SELECT key FROM {app}.refs',
                                    'src_' || '{app}_real.refs'::regclass::oid); END $$"
    ))
    .await
    .unwrap();
    c.batch_execute(&format!("ALTER SCHEMA {app} RENAME TO {decoy}"))
        .await
        .unwrap();
    let got = try_sweep_detailed(&connect().await, &pool).await;
    assert!(!format!("{got:?}").contains("evil ran"), "{got:?}");
    assert_eq!(got, Ok((0, Some("liveness_table_invalid".into()))));
    // The next use re-creates a view bound to the table.
    let got = try_sweep_detailed(&connect().await, &pool).await;
    assert_eq!(got, Ok((0, None)));
    assert!(alkblobs_tests::pg::exists(&su, &pool, &k).await);
}

/// Rows that reached a table while its guard was off and that could not be
/// checked when it came back (the table failed validation at that moment)
/// make the next sweeps abort until they are gone; and registration, which
/// checks the rows already there, needs READ COMMITTED to see them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_that_could_not_be_checked_at_once_stop_the_sweep_until_fixed() {
    let c = connect().await;
    let pool = pool(&c, "recheck", "0 seconds", "60 seconds").await;
    let t = table_name(&pool, "live");
    c.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY, n int)"))
        .await
        .unwrap();
    try_register(&c, &pool, &t).await.unwrap();
    let absent = key(b"never put, recorded behind the guard's back");
    c.batch_execute(&format!(
        "ALTER TABLE {t} DISABLE TRIGGER alkblobs_liveness_guard;
         INSERT INTO {t} VALUES ('\\x{}'::bytea, 1);
         CREATE RULE {t}_r AS ON UPDATE TO {t} DO ALSO NOTHING;
         ALTER TABLE {t} ENABLE ALWAYS TRIGGER alkblobs_liveness_guard;
         DROP RULE {t}_r ON {t};",
        hex(&absent)
    ))
    .await
    .unwrap();
    assert_eq!(
        try_sweep_detailed(&c, &pool).await,
        Ok((0, Some("liveness_table_invalid".into())))
    );
    c.batch_execute(&format!("DELETE FROM {t}")).await.unwrap();
    assert_eq!(try_sweep_detailed(&c, &pool).await, Ok((0, None)));

    let t2 = table_name(&pool, "rr");
    c.batch_execute(&format!("CREATE TABLE {t2} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    let r = try_register(&c, &pool, &t2).await;
    c.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(r, Err("AB003".into()));
}

/// `alkblobs_registration.add_source` (granted to admins) locks the table before it
/// validates and reads it: an index with a user function created by a
/// transaction that held the table while the registration checked it is
/// seen, and the table refused, instead of planned as the extension.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_registration_racing_an_index_creation_sees_the_index() {
    let su = connect().await;
    let evil = login_role(&su, "racer", "alkblobs_admin").await;
    let e = connect_as(&evil).await;
    let pool = pool(&e, "reg-race", "0 seconds", "60 seconds").await;
    let t = table_name(&pool, "live");
    let f = table_name(&pool, "f");
    // (What registration grants alkblobs_owner: in the SQL-only flavour
    // also UPDATE, which its LOCK TABLE needs.)
    let grant = if alkblobs_tests::pg::sql_only() {
        "SELECT, UPDATE"
    } else {
        "SELECT"
    };
    e.batch_execute(&format!(
        "CREATE TABLE {t} (key bytea PRIMARY KEY);
         GRANT {grant} ON {t} TO alkblobs_owner;
         CREATE FUNCTION {f}() RETURNS bytea LANGUAGE plpgsql IMMUTABLE AS $x$
         BEGIN
             IF current_user = 'alkblobs_owner' THEN RAISE EXCEPTION 'evil ran as %', current_user; END IF;
             RETURN '\\x'::bytea;
         END $x$;"
    ))
    .await
    .unwrap();
    let holder = connect_as(&evil).await;
    holder
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE; CREATE INDEX ON {t} ((key || {f}()))"
        ))
        .await
        .unwrap();
    let reg = connect_as(&evil).await;
    let reg_pid = pid(&reg).await;
    let (p2, t2) = (pool.clone(), t.clone());
    let task = tokio::spawn(async move {
        reg.execute(
            "SELECT alkblobs_registration.add_source($1, $2::text::regclass, false)",
            &[&p2, &t2],
        )
        .await
        .map_err(|e| format!("{} {e:?}", sqlstate(&e)))
    });
    assert!(waits_on_lock(&su, reg_pid).await);
    holder.batch_execute("COMMIT").await.unwrap();
    let got = task.await.unwrap();
    assert!(!format!("{got:?}").contains("evil ran"), "{got:?}");
    assert!(matches!(&got, Err(s) if s.starts_with("42809")), "{got:?}");
}

/// Renaming the key column and adding a new one: the view the extension
/// reads through follows the column now called `key`, as the guard does,
/// so a row the guard let through is the row a sweep sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_extension_reads_the_column_the_guard_checks() {
    let c = connect().await;
    let pool = pool(&c, "key-rename", "0 seconds", "60 seconds").await;
    let t = table_name(&pool, "live");
    c.batch_execute(&format!("CREATE TABLE {t} (key bytea)"))
        .await
        .unwrap();
    try_register(&c, &pool, &t).await.unwrap();
    let old = garbage(&c, &pool, b"named by the old column").await;
    let new = garbage(&c, &pool, b"named by the new column").await;
    reference(&c, &t, &old).await.unwrap();
    c.batch_execute(&format!(
        "ALTER TABLE {t} RENAME key TO k2; ALTER TABLE {t} ADD key bytea"
    ))
    .await
    .unwrap();
    let pending: Option<String> = c
        .query_one(
            "SELECT l.pending FROM alkblobs.liveness l WHERE l.relid = $1::text::regclass",
            &[&t],
        )
        .await
        .unwrap()
        .get(0);
    // The library flavour's event trigger marks the table at once (the
    // SQL-only flavour has none; the rebinding below is what matters).
    if !alkblobs_tests::pg::sql_only() {
        assert_eq!(
            pending.as_deref(),
            Some("recheck"),
            "RENAME COLUMN went unnoticed"
        );
    }
    c.execute(&format!("INSERT INTO {t} (key) VALUES ($1)"), &[&new])
        .await
        .unwrap();
    // The sweep protects what the column called key names, and deletes
    // what only the renamed column names.
    assert_eq!(try_sweep_detailed(&c, &pool).await, Ok((1, None)));
    assert!(alkblobs_tests::pg::exists(&c, &pool, &new).await);
    assert!(!alkblobs_tests::pg::exists(&c, &pool, &old).await);
}
