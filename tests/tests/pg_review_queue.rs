//! The review queue ('queue' pools, the default since 0.8.0): every event
//! that can leave a key unprotected queues it in its own transaction, a
//! sweep reviews only the queue, and events that cannot be told key by key
//! ask for an audit (the full mark). Each event has a test here that fails
//! when its enqueue is removed (scripts/mutations/50-review-queue.py), and
//! the queue's row locks are raced from two connections. Against the test
//! server scripts/test.sh starts; never skipped.

#![cfg(feature = "pg")]

use std::time::Duration;

use alkblobs_tests::pg::{
    audit_missed, connect, ensure_extension, exists, garbage, key, pid, put, reference, register,
    table_name, unique, unpin, waits_on_lock,
};
use tokio_postgres::Client;

/// A fleet 'queue' pool (window 0, so a review's staging is executed by the
/// same sweep call; pin TTL `ttl`) with no scheduled audit: whatever it
/// collects, its queue found.
async fn qpool(c: &Client, tag: &str, ttl: &str) -> String {
    ensure_extension(c).await;
    let name = unique(tag);
    c.execute(
        "SELECT alkblobs_create_pool($1, '0 seconds', $2::text::interval, collector => 'queue', audit_every => '0')",
        &[&name, &ttl],
    )
    .await
    .expect("create a queue pool");
    name
}

/// A pool with a registered liveness table `<pool>_refs (key bytea)`.
async fn qpool_with_table(c: &Client, tag: &str) -> (String, String) {
    let pool = qpool(c, tag, "60 seconds").await;
    let table = table_name(&pool, "refs");
    c.batch_execute(&format!("CREATE TABLE {table} (key bytea)"))
        .await
        .unwrap();
    register(c, &pool, &table).await;
    (pool, table)
}

/// A 'mark' pool (pin TTL `ttl`) with a registered table `<pool>_refs`
/// whose three rows, naming one key, were deleted: three liveness
/// deletions waiting to be routed. (pool, table)
async fn mark_pool_with_3_deletions(c: &Client, tag: &str, ttl: &str) -> (String, String) {
    let pool = unique(tag);
    c.execute(
        "SELECT alkblobs_create_pool($1, '0 seconds', $2::text::interval, collector => 'mark')",
        &[&pool, &ttl],
    )
    .await
    .unwrap();
    let table = table_name(&pool, "refs");
    c.batch_execute(&format!("CREATE TABLE {table} (key bytea)"))
        .await
        .unwrap();
    register(c, &pool, &table).await;
    let k = garbage(c, &pool, tag.as_bytes()).await;
    for _ in 0..3 {
        reference(c, &table, &k).await.unwrap();
    }
    c.execute(&format!("DELETE FROM {table}"), &[])
        .await
        .unwrap();
    (pool, table)
}

/// Liveness deletions of `table` waiting to be routed.
async fn appended(c: &Client, table: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM alkblobs.released WHERE relid = $1::text::regclass",
        &[&table],
    )
    .await
    .unwrap()
    .get(0)
}

/// `pool`'s sweep call with max_keys 2 over `table`'s three deletions
/// routes two, no more, and says its batch was full (reviewed = max_keys:
/// its caller calls again); one is left.
async fn routes_two_of_three(c: &Client, pool: &str, table: &str) {
    assert_eq!(appended(c, table).await, 3);
    let r = c
        .query_one(
            "SELECT aborted, reviewed FROM alkblobs_sweep($1, max_keys => 2)",
            &[&pool],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, Option<String>>(0), None);
    assert_eq!(
        r.get::<_, i64>(1),
        2,
        "the routing batch was not full, or went past max_keys"
    );
    assert_eq!(
        appended(c, table).await,
        1,
        "the routing batch went past max_keys"
    );
}

/// Planner settings under which a `DELETE … WHERE … IN (SELECT … LIMIT n
/// …)` becomes a nested-loop semi-join rescanning its subquery per row
/// (what once took a batch past its bound), for this connection.
async fn force_rescanning_plan(c: &Client) {
    c.batch_execute(
        "SET enable_hashjoin = off; SET enable_mergejoin = off; SET enable_material = off;
         SET enable_sort = off; SET enable_hashagg = off;",
    )
    .await
    .unwrap();
}

/// One sweep call: (reviewed, staged, deleted, audit, missed).
async fn sweep(c: &Client, pool: &str) -> (i64, i64, i64, Option<String>, Option<i64>) {
    let r = c
        .query_one(
            "SELECT reviewed, staged, deleted, audit, missed, aborted FROM alkblobs_sweep($1)",
            &[&pool],
        )
        .await
        .expect("alkblobs_sweep");
    let aborted: Option<String> = r.get(5);
    assert_eq!(aborted, None, "the sweep aborted");
    (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))
}

/// Whether `k` has a row in `pool`'s review queue, once the liveness
/// deletions appended so far are routed (as every sweep call does first).
async fn queued(c: &Client, pool: &str, k: &[u8]) -> bool {
    c.execute(
        "SELECT alkblobs.route_released(p.id, 1000000) FROM alkblobs.pools p WHERE p.name = $1",
        &[&pool],
    )
    .await
    .unwrap();
    c.query_one(
        "SELECT EXISTS (SELECT 1 FROM alkblobs.review_queue q JOIN alkblobs.pools p ON p.id = q.pool
                         WHERE p.name = $1 AND q.key = $2)",
        &[&pool, &k],
    )
    .await
    .unwrap()
    .get(0)
}

/// The reason of the audit `pool` has pending or under way, if any.
async fn audit_pending(c: &Client, pool: &str) -> Option<String> {
    c.query_one(
        "SELECT audit_pending FROM alkblobs_pools WHERE pool = $1",
        &[&pool],
    )
    .await
    .unwrap()
    .get(0)
}

/// Releasing a pin — one, several, or every pin of an owner — queues the
/// key, and the next sweep collects it; while any pin holds it, a review
/// keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_pins_queue_their_keys() {
    let c = connect().await;
    let pool = qpool(&c, "q-unpin", "60 seconds").await;
    let (a, b, d) = (
        b"q-unpin a".as_slice(),
        b"q-unpin b".as_slice(),
        b"q-unpin d".as_slice(),
    );
    for v in [a, b, d] {
        put(&c, &pool, v, "o").await;
    }
    // Pinned: nothing to review yet, nothing collected.
    let (_, staged, deleted, ..) = sweep(&c, &pool).await;
    assert_eq!((staged, deleted), (0, 0));
    assert!(
        !queued(&c, &pool, &key(a)).await,
        "a key queued while pinned"
    );
    unpin(&c, &pool, a, "o").await;
    c.execute(
        "SELECT alkblobs_unpin_many($1, 'o', ARRAY[$2::bytea])",
        &[&pool, &key(b)],
    )
    .await
    .unwrap();
    for v in [a, b] {
        assert!(
            queued(&c, &pool, &key(v)).await,
            "a released pin did not queue its key"
        );
    }
    let (reviewed, _, deleted, ..) = sweep(&c, &pool).await;
    assert_eq!((reviewed, deleted), (2, 2));
    assert!(!exists(&c, &pool, &key(a)).await && !exists(&c, &pool, &key(b)).await);
    assert!(exists(&c, &pool, &key(d)).await);
    c.execute("SELECT alkblobs_unpin_all($1, 'o')", &[&pool])
        .await
        .unwrap();
    assert!(queued(&c, &pool, &key(d)).await);
    let (_, _, deleted, ..) = sweep(&c, &pool).await;
    assert_eq!(deleted, 1);
}

/// A pin that expires is reaped by the next sweep, which queues its key and
/// reviews it in the same call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_pin_is_reaped_queued_and_collected() {
    let c = connect().await;
    let pool = qpool(&c, "q-expire", "1 second").await;
    put(&c, &pool, b"q-expire", "o").await;
    assert_eq!(sweep(&c, &pool).await.2, 0, "collected while pinned");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let r = c
        .query_one(
            "SELECT pins_reaped, reviewed, deleted FROM alkblobs_sweep($1)",
            &[&pool],
        )
        .await
        .unwrap();
    let got: (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
    assert_eq!(got, (1, 1, 1), "(pins reaped, reviewed, deleted)");
}

/// A liveness row deleted queues its key (the guard's DELETE branch), on a
/// plain table and on a partition of a registered partitioned one; a key
/// another row still names is reviewed and kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_liveness_row_queues_its_key() {
    let c = connect().await;
    let (pool, table) = qpool_with_table(&c, "q-delrow").await;
    let parts = table_name(&pool, "parts");
    c.batch_execute(&format!(
        "CREATE TABLE {parts} (key bytea, n int) PARTITION BY RANGE (n);
         CREATE TABLE {parts}_a PARTITION OF {parts} FOR VALUES FROM (0) TO (10);"
    ))
    .await
    .unwrap();
    register(&c, &pool, &parts).await;
    let (a, b, both) = (
        garbage(&c, &pool, b"q-delrow a").await,
        garbage(&c, &pool, b"q-delrow b").await,
        garbage(&c, &pool, b"q-delrow both").await,
    );
    reference(&c, &table, &a).await.unwrap();
    reference(&c, &table, &both).await.unwrap();
    c.execute(
        &format!("INSERT INTO {parts} VALUES ($1, 1), ($2, 2)"),
        &[&b, &both],
    )
    .await
    .unwrap();
    let (_, staged, deleted, ..) = sweep(&c, &pool).await;
    assert_eq!((staged, deleted), (0, 0), "referenced keys were staged");
    c.execute(&format!("DELETE FROM {table}"), &[])
        .await
        .unwrap();
    c.execute(&format!("DELETE FROM {parts}_a WHERE n = 1"), &[])
        .await
        .unwrap();
    for k in [&a, &b, &both] {
        assert!(
            queued(&c, &pool, k).await,
            "a deleted row did not queue its key"
        );
    }
    let (reviewed, _, deleted, ..) = sweep(&c, &pool).await;
    assert_eq!((reviewed, deleted), (3, 2));
    assert!(!exists(&c, &pool, &a).await && !exists(&c, &pool, &b).await);
    assert!(
        exists(&c, &pool, &both).await,
        "a key a partition still names was collected"
    );
}

/// A liveness row deleted is appended with its table only (no lookup in
/// the writer's path) and routed by the next sweep call of a pool its
/// table feeds, which reviews it in the same call and collects the key.
/// A 'mark' pool's sweep routes its own tables' deletions away, and any
/// sweep drops those of a table that feeds no pool any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_deletions_are_routed_by_any_sweep_and_collected() {
    let c = connect().await;
    let (pool, table) = qpool_with_table(&c, "q-route").await;
    let k = garbage(&c, &pool, b"q-route").await;
    reference(&c, &table, &k).await.unwrap();
    // Its pin's release queued it; this review finds it referenced.
    let (reviewed, _, deleted, ..) = sweep(&c, &pool).await;
    assert_eq!((reviewed, deleted), (1, 0));
    c.execute(&format!("DELETE FROM {table}"), &[])
        .await
        .unwrap();
    assert_eq!(appended(&c, &table).await, 1);
    let (reviewed, _, deleted, ..) = sweep(&c, &pool).await;
    assert_eq!(
        (reviewed, deleted),
        (1, 1),
        "the sweep did not route and review the deletion"
    );
    assert_eq!(appended(&c, &table).await, 0);
    assert!(!exists(&c, &pool, &k).await);

    // A table of a 'mark' pool: its own sweep empties it.
    let (other, mtable) = mark_pool_with_3_deletions(&c, "q-route-mark", "60 seconds").await;
    routes_two_of_three(&c, &other, &mtable).await;
    let r = c
        .query_one("SELECT aborted FROM alkblobs_sweep($1)", &[&other])
        .await
        .unwrap();
    assert_eq!(r.get::<_, Option<String>>(0), None);
    assert_eq!(
        appended(&c, &mtable).await,
        0,
        "a mark pool's table's deletion was kept"
    );

    // A table unregistered after a deletion: any sweep drops the row.
    let (gone_pool, gone) = qpool_with_table(&c, "q-route-gone").await;
    let g = garbage(&c, &gone_pool, b"q-route gone").await;
    reference(&c, &gone, &g).await.unwrap();
    c.execute(&format!("DELETE FROM {gone}"), &[])
        .await
        .unwrap();
    c.execute(
        "SELECT alkblobs_unregister_liveness($1, $2::text::regclass)",
        &[&gone_pool, &gone],
    )
    .await
    .unwrap();
    assert_eq!(appended(&c, &gone).await, 1);
    sweep(&c, &pool).await;
    assert_eq!(
        appended(&c, &gone).await,
        0,
        "an unregistered table's deletion was kept"
    );
}

/// A sweep's batches hold their bound (max_keys) whatever plan the server
/// picks. Planner settings that make a `DELETE … WHERE … IN (SELECT … LIMIT
/// n FOR UPDATE SKIP LOCKED)` a semi-join rescanning its subquery per row
/// made it delete past n (a rescan passes over the rows the statement has
/// deleted, now locked by this command, and takes the next ones): CI saw
/// it once, on statistics concurrent tests left. Here the plan is forced,
/// for the liveness routing and the reaping of expired pins and of
/// abandoned uploads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_hold_their_bound_under_a_rescanning_plan() {
    let c = connect().await;
    ensure_extension(&c).await;
    force_rescanning_plan(&c).await;
    // Liveness deletions of a 'mark' pool's table: routed (dropped) two
    // by two.
    let (pool, table) = mark_pool_with_3_deletions(&c, "q-bound", "1 second").await;
    routes_two_of_three(&c, &pool, &table).await;

    // Three expired pins: reaped two by two.
    for v in [b"q-bound a".as_slice(), b"q-bound b", b"q-bound c"] {
        put(&c, &pool, v, "o").await;
    }
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let reaped = async || -> i64 {
        c.query_one(
            "SELECT pins_reaped FROM alkblobs_sweep($1, max_keys => 2)",
            &[&pool],
        )
        .await
        .unwrap()
        .get(0)
    };
    assert_eq!(reaped().await, 2, "the pin reaping went past max_keys");
    assert_eq!(reaped().await, 1);

    // Three abandoned uploads (each started in autocommit, so over when it
    // returns): reaped two by two.
    for _ in 0..3 {
        c.query_one("SELECT alkblobs_lo_create($1)", &[&pool])
            .await
            .unwrap();
    }
    let reaped_uploads = async || -> i64 {
        c.query_one(
            "SELECT uploads_reaped FROM alkblobs_sweep($1, max_unlinks => 2)",
            &[&pool],
        )
        .await
        .unwrap()
        .get(0)
    };
    assert_eq!(
        reaped_uploads().await,
        2,
        "the upload reaping went past max_unlinks"
    );
    assert_eq!(reaped_uploads().await, 1);
}

/// The bounded routing pick (forced onto the rescanning plan) racing a
/// writer's liveness delete at every isolation level, from two
/// connections: the writer's appended row, uncommitted, is neither routed
/// nor waited for (the sweep passes it, SKIP LOCKED does not even see it);
/// the batch holds its bound; the writer commits without a serialization
/// failure; later sweeps route the rest and collect both keys, and nothing
/// is collected while the writer's transaction still names its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_routing_races_liveness_deletes_at_every_isolation_level() {
    let c = connect().await;
    ensure_extension(&c).await;
    force_rescanning_plan(&c).await;
    for level in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let (pool, table) = qpool_with_table(&c, "q-bound-iso").await;
        let k = garbage(&c, &pool, format!("q-bound-iso {level}").as_bytes()).await;
        let held = garbage(&c, &pool, format!("q-bound-iso held {level}").as_bytes()).await;
        for _ in 0..3 {
            reference(&c, &table, &k).await.unwrap();
        }
        reference(&c, &table, &held).await.unwrap();
        // The pins' releases queued both keys: reviewed, kept (named).
        let (_, _, deleted, ..) = sweep(&c, &pool).await;
        assert_eq!(deleted, 0, "{level}");
        c.execute(&format!("DELETE FROM {table} WHERE key = $1"), &[&k])
            .await
            .unwrap();
        assert_eq!(appended(&c, &table).await, 3);
        // The writer deletes `held`'s row in an open transaction.
        let w = connect().await;
        w.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        w.execute(&format!("DELETE FROM {table} WHERE key = $1"), &[&held])
            .await
            .unwrap_or_else(|e| panic!("{level}: liveness delete: {e:?}"));
        let r = c
            .query_one(
                "SELECT aborted, reviewed, deleted FROM alkblobs_sweep($1, max_keys => 2)",
                &[&pool],
            )
            .await
            .unwrap();
        assert_eq!(r.get::<_, Option<String>>(0), None, "{level}");
        assert_eq!(appended(&c, &table).await, 1, "{level}: the batch's bound");
        assert!(
            exists(&c, &pool, &held).await,
            "{level}: collected while named"
        );
        w.batch_execute("COMMIT")
            .await
            .unwrap_or_else(|e| panic!("{level}: commit: {e:?}"));
        for _ in 0..3 {
            sweep(&c, &pool).await;
        }
        assert_eq!(appended(&c, &table).await, 0, "{level}: left unrouted");
        assert!(!exists(&c, &pool, &k).await, "{level}: k was not collected");
        assert!(
            !exists(&c, &pool, &held).await,
            "{level}: the writer's released key was not collected"
        );
    }
}

/// Liveness deletions left unrouted past the pool's warn_after (no sweep
/// has run) make health warn, until a sweep routes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrouted_deletions_make_health_warn() {
    let c = connect().await;
    let (pool, table) = qpool_with_table(&c, "q-unrouted").await;
    let k = garbage(&c, &pool, b"q-unrouted").await;
    reference(&c, &table, &k).await.unwrap();
    sweep(&c, &pool).await;
    c.execute(
        "SELECT alkblobs_alter_pool($1, warn_after => '1 second')",
        &[&pool],
    )
    .await
    .unwrap();
    c.execute(&format!("DELETE FROM {table}"), &[])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let reasons = async |c: &Client| -> String {
        c.query_one(
            "SELECT array_to_string(reasons, '; ') FROM alkblobs_health WHERE pool = $1",
            &[&pool],
        )
        .await
        .unwrap()
        .get(0)
    };
    let r = reasons(&c).await;
    assert!(
        r.contains("1 liveness deletions waiting to be routed"),
        "{r}"
    );
    sweep(&c, &pool).await;
    let r = reasons(&c).await;
    assert!(!r.contains("waiting to be routed"), "{r}");
}

/// A liveness row moved to another key queues the key it left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_liveness_row_moved_to_another_key_queues_the_old_one() {
    let c = connect().await;
    let (pool, table) = qpool_with_table(&c, "q-move").await;
    let a = garbage(&c, &pool, b"q-move a").await;
    put(&c, &pool, b"q-move b", "o").await;
    let b = key(b"q-move b");
    reference(&c, &table, &a).await.unwrap();
    assert_eq!(sweep(&c, &pool).await.2, 0);
    c.execute(&format!("UPDATE {table} SET key = $1"), &[&b])
        .await
        .unwrap();
    assert!(
        queued(&c, &pool, &a).await,
        "the key a row left was not queued"
    );
    unpin(&c, &pool, b"q-move b", "o").await;
    let (_, _, deleted, ..) = sweep(&c, &pool).await;
    assert_eq!(deleted, 1);
    assert!(!exists(&c, &pool, &a).await && exists(&c, &pool, &b).await);
}

/// An entry that reaches the table without a pin (loaded by hand: every
/// put pins, and its pin's release queues it) is queued by nothing; the
/// next audit finds it, counts it as missed, and collects it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_loaded_by_hand_is_found_by_the_audit() {
    let c = connect().await;
    let pool = qpool(&c, "q-bare", "60 seconds").await;
    let v = b"q-bare entry".as_slice();
    c.execute(
        "INSERT INTO alkblobs.entries (pool, key, size, tier, value)
         SELECT p.id, $2, length($3::bytea), 'kv', $3::bytea FROM alkblobs.pools p WHERE p.name = $1",
        &[&pool, &key(v), &v],
    )
    .await
    .unwrap();
    assert_eq!(
        sweep(&c, &pool).await.0,
        0,
        "an entry loaded by hand was queued"
    );
    assert_eq!(audit_missed(&c, &pool).await, 1);
    assert!(
        !exists(&c, &pool, &key(v)).await,
        "the audit did not collect it"
    );
}

/// Events that cannot be told key by key — a registered table truncated,
/// unregistered, dropped, or its guard turned off and on — ask for an
/// audit, which the next sweep runs and which collects what they freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_without_keys_ask_for_an_audit() {
    let c = connect().await;
    for (tag, why) in [
        ("truncate", "was truncated"),
        ("unregister", "was unregistered"),
        ("drop", "was dropped"),
        ("guard", "changed"),
    ] {
        let (pool, table) = qpool_with_table(&c, &format!("q-audit-{tag}")).await;
        let keys = [
            garbage(&c, &pool, format!("{tag} 1").as_bytes()).await,
            garbage(&c, &pool, format!("{tag} 2").as_bytes()).await,
        ];
        for k in &keys {
            reference(&c, &table, k).await.unwrap();
        }
        assert_eq!(
            sweep(&c, &pool).await.2,
            0,
            "{tag}: referenced keys collected"
        );
        let act = match tag {
            "truncate" => format!("TRUNCATE {table}"),
            "unregister" => format!("SELECT alkblobs_unregister_liveness('{pool}', '{table}')"),
            "drop" => format!("DROP TABLE {table} CASCADE"),
            _ => format!(
                "ALTER TABLE {table} DISABLE TRIGGER alkblobs_liveness_guard; DELETE FROM {table};
                 ALTER TABLE {table} ENABLE ALWAYS TRIGGER alkblobs_liveness_guard"
            ),
        };
        c.batch_execute(&act).await.unwrap();
        // (A drop in the SQL-only flavour, and a guard's change, are seen
        // by the next sweep, which asks for the audit and starts it.)
        if tag == "truncate" || tag == "unregister" {
            let pending = audit_pending(&c, &pool).await.unwrap_or_default();
            assert!(pending.contains(why), "{tag}: audit pending: {pending:?}");
        }
        let (_, staged, deleted, audit, missed) = sweep(&c, &pool).await;
        let audit = audit.unwrap_or_default();
        assert!(
            audit.contains(why),
            "{tag}: the sweep ran no audit for it: {audit:?}"
        );
        assert_eq!((staged, deleted), (2, 2), "{tag}");
        assert_eq!(
            missed, None,
            "{tag}: an event's audit counts nothing as missed"
        );
        assert!(
            audit_pending(&c, &pool).await.is_none(),
            "{tag}: the audit is not done"
        );
        for k in &keys {
            assert!(!exists(&c, &pool, k).await, "{tag}: a freed key was kept");
        }
    }
}

/// A pool that switches from the full-mark collector to the queue starts
/// with an audit (its queue is empty), and one that leaves it drops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_switched_to_the_queue_is_audited() {
    let c = connect().await;
    ensure_extension(&c).await;
    let pool = unique("q-switch");
    c.execute(
        "SELECT alkblobs_create_pool($1, '0 seconds', '60 seconds', collector => 'mark')",
        &[&pool],
    )
    .await
    .unwrap();
    put(&c, &pool, b"q-switch", "o").await;
    assert!(
        !queued(&c, &pool, &key(b"q-switch")).await,
        "a mark pool queued a key"
    );
    unpin(&c, &pool, b"q-switch", "o").await;
    c.execute(
        "SELECT alkblobs_alter_pool($1, collector => 'queue', audit_every => '0')",
        &[&pool],
    )
    .await
    .unwrap();
    let (_, _, deleted, audit, _) = sweep(&c, &pool).await;
    assert!(audit.unwrap_or_default().contains("collector changed"));
    assert_eq!(deleted, 1);
    garbage(&c, &pool, b"q-switch 2").await;
    c.execute(
        "SELECT alkblobs_alter_pool($1, collector => 'mark')",
        &[&pool],
    )
    .await
    .unwrap();
    assert!(
        !queued(&c, &pool, &key(b"q-switch 2")).await,
        "a mark pool kept its queue"
    );
}

/// audit_every schedules audits: one runs once that long has passed since
/// the last (or the pool's creation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audits_run_every_audit_every() {
    let c = connect().await;
    let pool = qpool(&c, "q-every", "60 seconds").await;
    c.execute(
        "SELECT alkblobs_alter_pool($1, audit_every => '1 second')",
        &[&pool],
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(sweep(&c, &pool).await.3.as_deref(), Some("scheduled"));
    assert_eq!(
        sweep(&c, &pool).await.3,
        None,
        "an audit right after the last"
    );
}

/// An event whose queue row is lost (here: deleted by hand) leaks its key
/// until an audit, which collects it, counts it as missed, and makes
/// health warn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_audit_finds_and_reports_what_the_queue_missed() {
    let c = connect().await;
    let pool = qpool(&c, "q-missed", "60 seconds").await;
    let k = garbage(&c, &pool, b"q-missed").await;
    c.execute(
        "DELETE FROM alkblobs.review_queue q USING alkblobs.pools p WHERE p.id = q.pool AND p.name = $1",
        &[&pool],
    )
    .await
    .unwrap();
    assert_eq!(sweep(&c, &pool).await.2, 0);
    assert!(exists(&c, &pool, &k).await);
    assert_eq!(audit_missed(&c, &pool).await, 1);
    assert!(!exists(&c, &pool, &k).await, "the audit did not collect it");
    let r = c
        .query_one(
            "SELECT status, array_to_string(reasons, '; ') FROM alkblobs_health WHERE pool = $1",
            &[&pool],
        )
        .await
        .unwrap();
    let (status, reasons): (String, String) = (r.get(0), r.get(1));
    assert_eq!(status, "warn", "{reasons}");
    assert!(reasons.contains("review queue missed"), "{reasons}");
}

/// A key two events queued is reviewed (and staged) once: its rows go
/// together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_queued_twice_is_reviewed_once() {
    let c = connect().await;
    let pool = qpool(&c, "q-twice", "60 seconds").await;
    put(&c, &pool, b"q-twice", "o1").await;
    put(&c, &pool, b"q-twice", "o2").await;
    sweep(&c, &pool).await;
    unpin(&c, &pool, b"q-twice", "o1").await;
    unpin(&c, &pool, b"q-twice", "o2").await;
    let (reviewed, staged, deleted, ..) = sweep(&c, &pool).await;
    assert_eq!(
        (reviewed, staged, deleted),
        (2, 1, 1),
        "(rows, staged, deleted)"
    );
    assert_eq!(sweep(&c, &pool).await.0, 0, "a row was left");
}

/// Reviews are bounded (the keys of max_keys rows a call, oldest first,
/// with their other rows) and a dry run reviews without consuming the
/// queue or staging anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviews_are_bounded_and_a_dry_run_consumes_nothing() {
    let c = connect().await;
    let pool = qpool(&c, "q-bounded", "60 seconds").await;
    // Each: a row for its released pin.
    for i in 0..25 {
        garbage(&c, &pool, format!("q-bounded {i}").as_bytes()).await;
    }
    let dry: (i64, i64, i64) = {
        let r = c
            .query_one(
                "SELECT reviewed, staged, deleted FROM alkblobs_sweep($1, dry_run => true)",
                &[&pool],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(dry, (25, 25, 0), "dry run (rows reviewed, staged, deleted)");
    let mut seen = Vec::new();
    for _ in 0..4 {
        let r = c
            .query_one(
                "SELECT reviewed, deleted FROM alkblobs_sweep($1, max_keys => 10)",
                &[&pool],
            )
            .await
            .unwrap();
        seen.push((r.get::<_, i64>(0), r.get::<_, i64>(1)));
    }
    assert_eq!(seen, vec![(10, 10), (10, 10), (5, 5), (0, 0)]);
}

/// An event that commits while a review of its key runs is never lost.
/// The review reads the rows of its keys, checks, then deletes exactly
/// the rows it read: here it is held between its check and its delete
/// (its staging of another key waits for a transaction that staged that
/// key by hand), and meanwhile the pin that protected the first key is
/// released and its event's row committed. That row must survive the
/// review, and the next sweep collect the key. Then: an open event (its row
/// not committed) is invisible to a review, which neither waits for it nor
/// loses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_racing_a_review_is_never_lost() {
    let c = connect().await;
    let (pool, table) = qpool_with_table(&c, "q-race").await;
    let k = garbage(&c, &pool, b"q-race k").await;
    // k is held by a pin whose release is the racing event (a liveness
    // deletion would be appended to alkblobs.released, which the review
    // does not delete from: the pin release goes to the queue directly).
    c.query_one("SELECT alkblobs_pin($1, $2, 'node-x')", &[&pool, &k])
        .await
        .unwrap();
    let j = garbage(&c, &pool, b"q-race j").await;
    // A transaction staging j by hand: the review's staging of j waits on it.
    let holder = connect().await;
    holder
        .batch_execute(&format!(
            "BEGIN;
             WITH m AS (INSERT INTO alkblobs.marks (pool, delete_window)
                        SELECT p.id, '0' FROM alkblobs.pools p WHERE p.name = '{pool}' RETURNING id, pool)
             INSERT INTO alkblobs.staged (pool, key, tier, mark)
             SELECT m.pool, '\\x{}'::bytea, 'kv', m.id FROM m;",
            alkblobs_tests::pg::hex(&j)
        ))
        .await
        .unwrap();
    let sweeper = connect().await;
    let spid = pid(&sweeper).await;
    let sweeping = {
        let pool = pool.clone();
        tokio::spawn(async move { sweep(&sweeper, &pool).await })
    };
    let mut waited = false;
    for _ in 0..200 {
        if waits_on_lock(&c, spid).await {
            waited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(waited, "the review did not reach its staging of j");
    // The review has read k's rows and found k protected. Now k's pin goes.
    c.query_one("SELECT alkblobs_unpin($1, $2, 'node-x')", &[&pool, &k])
        .await
        .unwrap();
    holder.batch_execute("ROLLBACK").await.unwrap();
    let (_, _, deleted, ..) = sweeping.await.unwrap();
    assert_eq!(deleted, 1, "j was not collected");
    assert!(
        queued(&c, &pool, &k).await,
        "the event was lost to the review"
    );
    let (_, _, deleted, ..) = sweep(&c, &pool).await;
    assert_eq!(deleted, 1, "k was not collected");
    assert!(!exists(&c, &pool, &k).await);

    // An open event: invisible, never waited for, not lost.
    let k2 = garbage(&c, &pool, b"q-race 2").await;
    reference(&c, &table, &k2).await.unwrap();
    assert_eq!(sweep(&c, &pool).await.2, 0);
    let event = connect().await;
    event
        .batch_execute(&format!("BEGIN; DELETE FROM {table}"))
        .await
        .unwrap();
    let sweeping = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let c = connect().await;
            sweep(&c, &pool).await
        })
    };
    let done = tokio::time::timeout(Duration::from_secs(5), sweeping).await;
    let (reviewed, _, deleted, ..) = done
        .expect("the sweep waited for an event's open transaction")
        .unwrap();
    assert_eq!(
        (reviewed, deleted),
        (0, 0),
        "a review saw an uncommitted event"
    );
    event.batch_execute("COMMIT").await.unwrap();
    let (reviewed, _, deleted, ..) = sweep(&c, &pool).await;
    assert_eq!(
        (reviewed, deleted),
        (1, 1),
        "the committed event's key was not collected"
    );
}

/// A pool created without a collector takes the database's (or session's)
/// `alkblobs.default_collector`, else 'queue'; a bad collector or audit
/// period is a clear 22023.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_collector_defaults_to_the_queue_or_the_databases_setting() {
    let c = connect().await;
    ensure_extension(&c).await;
    let collector = |pool: String| {
        let c = &c;
        async move {
            c.query_one(
                "SELECT collector FROM alkblobs_pools WHERE pool = $1",
                &[&pool],
            )
            .await
            .unwrap()
            .get::<_, String>(0)
        }
    };
    c.batch_execute("RESET alkblobs.default_collector")
        .await
        .unwrap();
    // (scripts/test.sh's second pass sets the database's default to
    // 'mark'; a session RESET goes back to it, so set it here instead.)
    c.batch_execute("SET alkblobs.default_collector = ''")
        .await
        .unwrap();
    let a = unique("q-default");
    c.execute("SELECT alkblobs_create_pool($1)", &[&a])
        .await
        .unwrap();
    assert_eq!(collector(a).await, "queue");
    c.batch_execute("SET alkblobs.default_collector = 'mark'")
        .await
        .unwrap();
    let b = unique("q-default");
    c.execute("SELECT alkblobs_create_pool($1)", &[&b])
        .await
        .unwrap();
    assert_eq!(collector(b).await, "mark");
    for (sql, what) in [
        (
            "SELECT alkblobs_create_pool($1, collector => 'sweep')",
            "collector",
        ),
        (
            "SELECT alkblobs_create_pool($1, audit_every => '1 month')",
            "audit_every",
        ),
        (
            "SELECT alkblobs_create_pool($1, audit_every => '-1 day')",
            "audit_every",
        ),
    ] {
        let e = c
            .execute(sql, &[&unique("q-bad")])
            .await
            .expect_err("a bad setting was accepted");
        assert_eq!(alkblobs_tests::pg::sqlstate(&e), "22023", "{what}");
        assert!(
            e.to_string().contains(what) || format!("{e:?}").contains(what),
            "{e:?}"
        );
    }
    c.batch_execute("RESET alkblobs.default_collector")
        .await
        .unwrap();
}

/// A key that is both an entry and a file (the threshold changed between
/// two puts) is staged as its entry; once the entry is deleted its file
/// record is queued and reviewed by the next sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_both_entry_and_file_has_its_file_reviewed_after_its_entry() {
    let c = connect().await;
    ensure_extension(&c).await;
    let pool = unique("q-both");
    c.execute(
        "SELECT alkblobs_create_pool($1, '0 seconds', '60 seconds', 'local', collector => 'queue', audit_every => '0')",
        &[&pool],
    )
    .await
    .unwrap();
    let v = b"q-both".as_slice();
    put(&c, &pool, v, "o").await;
    alkblobs_tests::pg::publish_file(&c, &pool, &key(v), "o").await;
    c.execute("SELECT alkblobs_unpin_all($1, 'o')", &[&pool])
        .await
        .unwrap();
    let (_, staged, deleted, ..) = sweep(&c, &pool).await;
    assert_eq!((staged, deleted), (1, 1), "the entry first");
    assert!(
        queued(&c, &pool, &key(v)).await,
        "the file was not queued once its entry went"
    );
    let (_, staged, ..) = sweep(&c, &pool).await;
    assert_eq!(staged, 1, "the file was not staged for its claim");
}

/// A forward-reference table altered (here its guard turned off while a
/// row went, then on again) asks for an audit too: its rows are never
/// checked, but a row deleted unguarded names a key nothing queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_reference_table_altered_asks_for_an_audit() {
    let c = connect().await;
    let pool = qpool(&c, "q-fwd", "60 seconds").await;
    let table = table_name(&pool, "fwd");
    c.batch_execute(&format!("CREATE TABLE {table} (key bytea)"))
        .await
        .unwrap();
    c.execute(
        "SELECT alkblobs_register_liveness($1, $2::text::regclass, forward_references => true)",
        &[&pool, &table],
    )
    .await
    .unwrap();
    let k = garbage(&c, &pool, b"q-fwd").await;
    reference(&c, &table, &k).await.unwrap();
    assert_eq!(sweep(&c, &pool).await.2, 0);
    c.batch_execute(&format!(
        "ALTER TABLE {table} DISABLE TRIGGER alkblobs_liveness_guard; DELETE FROM {table};
         ALTER TABLE {table} ENABLE ALWAYS TRIGGER alkblobs_liveness_guard"
    ))
    .await
    .unwrap();
    let (_, _, deleted, audit, _) = sweep(&c, &pool).await;
    assert!(
        audit.is_some(),
        "no audit for an altered forward-reference table"
    );
    assert_eq!(deleted, 1, "the key its unguarded delete freed was kept");
}

/// A pool takes the 'queue' collector only when every registered table has
/// guards that see deletions (55000 otherwise, naming the table).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_with_an_old_guard_cannot_take_the_queue() {
    let c = connect().await;
    ensure_extension(&c).await;
    let pool = unique("q-oldguard");
    c.execute(
        "SELECT alkblobs_create_pool($1, '0 seconds', '60 seconds', collector => 'mark')",
        &[&pool],
    )
    .await
    .unwrap();
    let table = table_name(&pool, "refs");
    c.batch_execute(&format!("CREATE TABLE {table} (key bytea)"))
        .await
        .unwrap();
    register(&c, &pool, &table).await;
    // The guard as 0.7.0 installed it: INSERT OR UPDATE only.
    c.batch_execute(&format!(
        "DROP TRIGGER alkblobs_liveness_guard ON {table};
         CREATE TRIGGER alkblobs_liveness_guard AFTER INSERT OR UPDATE ON {table}
             FOR EACH ROW EXECUTE FUNCTION alkblobs_registration.liveness_guard();
         ALTER TABLE {table} ENABLE ALWAYS TRIGGER alkblobs_liveness_guard;"
    ))
    .await
    .unwrap();
    let e = c
        .execute(
            "SELECT alkblobs_alter_pool($1, collector => 'queue')",
            &[&pool],
        )
        .await
        .expect_err("a pool with an old guard took the queue");
    assert_eq!(alkblobs_tests::pg::sqlstate(&e), "55000");
    assert!(format!("{e:?}").contains(&table), "{e:?}");
    register(&c, &pool, &table).await;
    c.execute(
        "SELECT alkblobs_alter_pool($1, collector => 'queue')",
        &[&pool],
    )
    .await
    .expect("registered again, it takes the queue");
}

/// The queue's events at every isolation level, each racing a review of
/// the same key from another connection: an unpin and a liveness delete in
/// an open REPEATABLE READ or SERIALIZABLE transaction whose key a sweep
/// reviews (and whose old queue rows it deletes), and another event queues
/// after their snapshot, before they commit. The
/// events commit without a serialization failure (rows are appended, never
/// updated), nothing is collected while they are open, and the next sweep
/// collects the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_at_every_isolation_level_race_a_review_without_failing() {
    let c = connect().await;
    for level in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let (pool, table) = qpool_with_table(&c, "q-iso").await;
        let v = format!("q-iso {level}");
        let k = key(v.as_bytes());
        put(&c, &pool, v.as_bytes(), "o").await;
        put(&c, &pool, v.as_bytes(), "o2").await;
        put(&c, &pool, v.as_bytes(), "o3").await;
        reference(&c, &table, &k).await.unwrap();
        // A committed row for k (o2's pin released): the review deletes it.
        unpin(&c, &pool, v.as_bytes(), "o2").await;
        assert!(queued(&c, &pool, &k).await);
        let w = connect().await;
        w.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        // The snapshot is taken, then the review runs and commits.
        w.query_one("SELECT count(*) FROM alkblobs_pins", &[])
            .await
            .unwrap();
        let (reviewed, _, deleted, ..) = sweep(&c, &pool).await;
        assert_eq!(
            (reviewed, deleted),
            (1, 0),
            "{level}: k is pinned and named"
        );
        // And another event's row for k commits after w's snapshot (a queue
        // keeping one row per key, upserted, failed w's events here with
        // 40001: pg_randomized found it).
        unpin(&c, &pool, v.as_bytes(), "o3").await;
        w.execute("SELECT alkblobs_unpin($1, $2, 'o')", &[&pool, &k])
            .await
            .unwrap_or_else(|e| panic!("{level}: unpin: {e:?}"));
        w.execute(&format!("DELETE FROM {table}"), &[])
            .await
            .unwrap_or_else(|e| panic!("{level}: liveness delete: {e:?}"));
        // Open: nothing of it is seen, nothing collected.
        assert_eq!(sweep(&c, &pool).await.2, 0, "{level}");
        w.batch_execute("COMMIT")
            .await
            .unwrap_or_else(|e| panic!("{level}: commit: {e:?}"));
        let (_, _, deleted, ..) = sweep(&c, &pool).await;
        assert_eq!(
            deleted, 1,
            "{level}: the released, unnamed key was not collected"
        );
    }
}
