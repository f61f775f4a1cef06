//! The local tier under a fleet: file records, claims and tombstones, each
//! over real connections to the test server. docs/design.md §4 lists which
//! guard each test covers and the mutation runs against it.

#![cfg(feature = "pg")]

use alkblobs_tests::pg::{
    connect, garbage, key, pid, pool, publish_file, reference, register, sqlstate, table_name,
    try_register, try_sweep_detailed, waits_on_lock,
};
use tokio_postgres::Client;

async fn local_pool(c: &Client, tag: &str) -> String {
    let p = pool(c, tag, "0 seconds", "60 seconds").await;
    c.execute(
        "UPDATE alkblobs.pools SET large_tier = 'local' WHERE name = $1",
        &[&p],
    )
    .await
    .unwrap();
    p
}

/// A pool whose large tier is s3 as far as the database knows (only the
/// SQL is exercised: nothing reaches the bucket).
async fn s3_pool_sql(c: &Client, tag: &str) -> String {
    let p = pool(c, tag, "0 seconds", "60 seconds").await;
    c.execute(
        "UPDATE alkblobs.pools SET large_tier = 's3', large_location = 's3://alkblobs-sql-only/' || name WHERE name = $1",
        &[&p],
    )
    .await
    .unwrap();
    p
}

async fn claim_keys(c: &Client, pool: &str) -> Vec<Vec<u8>> {
    c.query("SELECT * FROM alkblobs_claim_local($1)", &[&pool])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, Vec<u8>>(0))
        .collect()
}

/// (e) The local tier: a file has no entry row and usually no staged row,
/// yet a liveness write for it must hold off a concurrent claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_local_liveness_write_holds_off_a_claim() {
    let obs = connect().await;
    let pool = pool(&obs, "guard-local", "0 seconds", "60 seconds").await;
    obs.execute(
        "UPDATE alkblobs.pools SET large_tier = 'local' WHERE name = $1",
        &[&pool],
    )
    .await
    .unwrap();
    let table = table_name(&pool, "live");
    obs.batch_execute(&format!("CREATE TABLE {table} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    register(&obs, &pool, &table).await;
    let k = key(b"a file someone just referenced");
    // The file was published (recorded, then its pin released).
    alkblobs_tests::pg::publish_file(&obs, &pool, &k, "node").await;
    obs.execute("SELECT alkblobs_unpin($1, $2, 'node')", &[&pool, &k])
        .await
        .unwrap();
    let w = connect().await;
    w.batch_execute("BEGIN").await.unwrap();
    w.execute(&format!("INSERT INTO {table} VALUES ($1)"), &[&k])
        .await
        .unwrap();
    obs.query_one("SELECT alkblobs_stage($1, ARRAY[$2::bytea])", &[&pool, &k])
        .await
        .unwrap();
    let claimed: Vec<Vec<u8>> = obs
        .query("SELECT * FROM alkblobs_claim_local($1)", &[&pool])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    w.batch_execute("COMMIT").await.unwrap();
    assert!(
        !claimed.contains(&k),
        "the claim deleted a file a committed liveness row names"
    );
}

/// In a local-tier pool a key that is neither an entry nor a recorded file
/// is not in the pool: a reference to a never-put key, to a kv entry the
/// executor deleted, or to a file a claim handed out fails with AB002; a
/// file recorded by `alkblobs_pin_new` can be referenced. `pin_new` is for
/// local-tier pools only.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_local_pool_refuses_references_to_content_it_does_not_hold() {
    let c = connect().await;
    let pool = local_pool(&c, "local-absent").await;
    let t = table_name(&pool, "live");
    c.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    try_register(&c, &pool, &t).await.unwrap();
    // Never put.
    assert_eq!(
        reference(&c, &t, &key(b"never put anywhere")).await,
        Err("AB002".into())
    );
    // A kv entry the executor deleted.
    let kv = garbage(&c, &pool, b"small and collected").await;
    assert_eq!(try_sweep_detailed(&c, &pool).await, Ok((1, None)));
    assert_eq!(reference(&c, &t, &kv).await, Err("AB002".into()));
    // A file recorded but not (yet) published: its content may never come.
    let file = key(b"a big file on shared media");
    c.execute("SELECT alkblobs_pin_new($1, $2, 'node-a')", &[&pool, &file])
        .await
        .unwrap();
    assert_eq!(reference(&c, &t, &file).await, Err("AB002".into()));
    // Published.
    publish_file(&c, &pool, &file, "node-a").await;
    reference(&c, &t, &file).await.unwrap();
    // A file the claim handed out (and whose deletion committed).
    let gone = key(b"a big file nobody needs");
    publish_file(&c, &pool, &gone, "node-a").await;
    c.execute("SELECT alkblobs_unpin($1, $2, 'node-a')", &[&pool, &gone])
        .await
        .unwrap();
    c.execute("SELECT alkblobs_unpin($1, $2, 'node-a')", &[&pool, &file])
        .await
        .unwrap();
    let s: (i64, Option<String>) = try_sweep_detailed(&c, &pool).await.unwrap();
    assert_eq!(s, (0, None), "files are the client's to delete");
    let claimed: Vec<Vec<u8>> = c
        .query("SELECT * FROM alkblobs_claim_local($1)", &[&pool])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(claimed, vec![gone.clone()], "the referenced file stays");
    assert_eq!(reference(&c, &t, &gone).await, Err("AB002".into()));
    let confirmed = c
        .query(
            "SELECT * FROM alkblobs_local_published($1, ARRAY[$2::bytea], 'node-a')",
            &[&pool, &gone],
        )
        .await
        .unwrap();
    assert!(confirmed.is_empty(), "a collected file was confirmed");
    // Its tombstone refuses a new record until the claimer confirms the
    // delete (55006), then the key can be published again.
    let e = c
        .execute("SELECT alkblobs_pin_new($1, $2, 'node-b')", &[&pool, &gone])
        .await
        .unwrap_err();
    assert_eq!(
        sqlstate(&e),
        "55006",
        "a tombstoned key was recorded afresh"
    );
    let removed: i64 = c
        .query_one(
            "SELECT alkblobs_local_deleted($1, ARRAY[$2::bytea])",
            &[&pool, &gone],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(removed, 1);
    // Published again: referencable again.
    publish_file(&c, &pool, &gone, "node-b").await;
    reference(&c, &t, &gone).await.unwrap();

    let lo_pool = alkblobs_tests::pg::pool(&c, "not-local", "0 seconds", "60 seconds").await;
    let e = c
        .execute("SELECT alkblobs_pin_new($1, $2, 'x')", &[&lo_pool, &file])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22023", "{e}");
}

/// A claim that is deciding a file holds its row: a liveness write for it
/// waits and then fails with AB002 (the claim committed the deletion), at
/// every isolation level (40001 at REPEATABLE READ and SERIALIZABLE).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_liveness_write_racing_a_claim_fails_at_every_isolation_level() {
    let obs = connect().await;
    for iso in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let pool = local_pool(&obs, "claim-race").await;
        let t = table_name(&pool, "live");
        obs.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY)"))
            .await
            .unwrap();
        try_register(&obs, &pool, &t).await.unwrap();
        let k = key(format!("racing a claim at {iso}").as_bytes());
        publish_file(&obs, &pool, &k, "n").await;
        obs.execute("SELECT alkblobs_unpin($1, $2, 'n')", &[&pool, &k])
            .await
            .unwrap();
        try_sweep_detailed(&obs, &pool).await.unwrap();
        let w = connect().await;
        // The writer's snapshot predates the claim.
        w.batch_execute(&format!(
            "BEGIN ISOLATION LEVEL {iso}; SELECT count(*) FROM {t}"
        ))
        .await
        .unwrap();
        let claimer = connect().await;
        claimer.batch_execute("BEGIN").await.unwrap();
        let claimed = claimer
            .query("SELECT * FROM alkblobs_claim_local($1)", &[&pool])
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1);
        let w_pid = pid(&w).await;
        let table = t.clone();
        let kk = k.clone();
        let write = tokio::spawn(async move {
            let r = reference(&w, &table, &kk).await;
            let c = w.batch_execute("COMMIT").await.map_err(|e| sqlstate(&e));
            (r, c)
        });
        assert!(waits_on_lock(&obs, w_pid).await, "{iso}: no wait");
        claimer.batch_execute("COMMIT").await.unwrap();
        let (r, _) = write.await.unwrap();
        let want = if iso == "READ COMMITTED" {
            "AB002"
        } else {
            "40001"
        };
        assert_eq!(r, Err(want.into()), "{iso}");
        let n: i64 = obs
            .query_one(&format!("SELECT count(*) FROM {t}"), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 0, "{iso}: a row names a file that was deleted");
    }
}

/// Explain on a local-tier pool tells a published file from one being
/// published (an earlier version failed with 42703 on any file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_knows_the_local_tiers_files() {
    let c = connect().await;
    let pool = local_pool(&c, "explain-files").await;
    let published = key(b"a published file");
    let pending = key(b"a file on its way");
    publish_file(&c, &pool, &published, "n").await;
    c.execute("SELECT alkblobs_pin_new($1, $2, 'n')", &[&pool, &pending])
        .await
        .unwrap();
    let entry = |k: Vec<u8>| {
        let c = &c;
        let pool = pool.clone();
        async move {
            let r = c
                .query_one(
                    "SELECT detail FROM alkblobs_explain($1, $2) WHERE aspect = 'entry'",
                    &[&pool, &k],
                )
                .await
                .unwrap();
            r.get::<_, String>(0)
        }
    };
    assert!(
        entry(published.clone())
            .await
            .starts_with("present: a published file")
    );
    assert!(
        entry(pending.clone())
            .await
            .starts_with("absent: a file is being published")
    );
}

/// Two claimers handed the same tombstone (the second claim re-hands
/// tombstones whose claimer looks dead): the first locks it, unlinks and
/// removes it; the key is published afresh; the second then locks nothing
/// and so unlinks nothing (0.5.0 review: without the lock-and-check phase
/// it would have unlinked the republished file). The claim and a pin_new
/// of a staged key with no record take their locks in the same order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_handed_tombstone_never_unlinks_a_republished_file() {
    let c = connect().await;
    let pool = local_pool(&c, "tomb-twice").await;
    let k = key(b"claimed by two");
    publish_file(&c, &pool, &k, "node-a").await;
    c.execute("SELECT alkblobs_unpin($1, $2, 'node-a')", &[&pool, &k])
        .await
        .unwrap();
    try_sweep_detailed(&c, &pool).await.unwrap();
    // A's claim commits the tombstone; B's claim is handed it again.
    let a = connect().await;
    let b = connect().await;
    assert_eq!(claim_keys(&a, &pool).await, vec![k.clone()]);
    assert_eq!(
        claim_keys(&b, &pool).await,
        vec![k.clone()],
        "a tombstone is handed out again"
    );
    // A: lock, "unlink", remove, commit.
    a.batch_execute("BEGIN").await.unwrap();
    let mine = a
        .query(
            "SELECT * FROM alkblobs_local_deleting($1, ARRAY[$2::bytea])",
            &[&pool, &k],
        )
        .await
        .unwrap();
    assert_eq!(mine.len(), 1);
    // B's phase 2 waits for A's.
    b.batch_execute("BEGIN").await.unwrap();
    let b_pid = pid(&b).await;
    let (p2, k2) = (pool.clone(), k.clone());
    let b_turn = tokio::spawn(async move {
        let r = b
            .query(
                "SELECT * FROM alkblobs_local_deleting($1, ARRAY[$2::bytea])",
                &[&p2, &k2],
            )
            .await
            .unwrap()
            .len();
        (b, r)
    });
    assert!(waits_on_lock(&c, b_pid).await, "B did not wait for A");
    a.query(
        "SELECT alkblobs_local_deleted($1, ARRAY[$2::bytea])",
        &[&pool, &k],
    )
    .await
    .unwrap();
    a.batch_execute("COMMIT").await.unwrap();
    let (b, b_may_unlink) = b_turn.await.unwrap();
    assert_eq!(b_may_unlink, 0, "B would unlink a file it no longer owns");
    b.batch_execute("COMMIT").await.unwrap();
    // The same, with the key published afresh before the late claimer's
    // phase 2: it must not take the live record for its tombstone.
    assert_eq!(claim_keys(&a, &pool).await, Vec::<Vec<u8>>::new());
    publish_file(&c, &pool, &k, "node-w").await;
    let late = c
        .query(
            "SELECT * FROM alkblobs_local_deleting($1, ARRAY[$2::bytea])",
            &[&pool, &k],
        )
        .await
        .unwrap();
    assert!(
        late.is_empty(),
        "a late claimer would unlink a republished file"
    );
    // Republished: referencable.
    let t = table_name(&pool, "tomb_refs");
    c.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    try_register(&c, &pool, &t).await.unwrap();
    reference(&c, &t, &k).await.unwrap();
}

/// A file is marked published only under the caller's own un-expired pin
/// (0.5.0 review: a holder that stalled past its TTL could otherwise mark
/// a record another node made after its own file was claimed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_published_needs_the_callers_own_pin() {
    let c = connect().await;
    let pool = local_pool(&c, "pub-own").await;
    let k = key(b"published under whose pin");
    c.execute("SELECT alkblobs_pin_new($1, $2, 'node-a')", &[&pool, &k])
        .await
        .unwrap();
    let mark = |owner: &'static str| {
        let (c, pool, k) = (&c, pool.clone(), k.clone());
        async move {
            c.query(
                "SELECT * FROM alkblobs_local_published($1, ARRAY[$2::bytea], $3)",
                &[&pool, &k, &owner],
            )
            .await
            .unwrap()
            .len()
        }
    };
    assert_eq!(
        mark("node-b").await,
        0,
        "published under someone else's pin"
    );
    c.execute("SELECT alkblobs_unpin($1, $2, 'node-a')", &[&pool, &k])
        .await
        .unwrap();
    assert_eq!(mark("node-a").await, 0, "published without a pin");
    c.execute("SELECT alkblobs_pin_new($1, $2, 'node-a')", &[&pool, &k])
        .await
        .unwrap();
    assert_eq!(mark("node-a").await, 1);
}

/// The 0.5.0 tombstone protocol at each isolation level a caller may run:
/// `pin_new` of a tombstoned key is refused (55006) at all three; phase 2
/// (`alkblobs_local_deleting`) runs only at READ COMMITTED (AB003
/// otherwise); and a writer whose snapshot predates the claim cannot mark
/// the claimed file published — at READ COMMITTED it finds the tombstone
/// and marks nothing, at REPEATABLE READ and SERIALIZABLE it gets 40001.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tombstones_hold_at_every_isolation_level() {
    let c = connect().await;
    for iso in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let pool = local_pool(&c, "tomb-iso").await;
        let k = key(format!("tombstone at {iso}").as_bytes());
        publish_file(&c, &pool, &k, "node-a").await;
        // A writer that will publish again, its snapshot taken now.
        let w = connect().await;
        w.batch_execute(&format!("BEGIN ISOLATION LEVEL {iso}; SELECT 1"))
            .await
            .unwrap();
        c.execute("SELECT alkblobs_unpin($1, $2, 'node-a')", &[&pool, &k])
            .await
            .unwrap();
        try_sweep_detailed(&c, &pool).await.unwrap();
        assert_eq!(claim_keys(&c, &pool).await, vec![k.clone()], "{iso}");
        let marked = w
            .query(
                "SELECT * FROM alkblobs_local_published($1, ARRAY[$2::bytea], 'node-a')",
                &[&pool, &k],
            )
            .await
            .map(|r| r.len())
            .map_err(|e| sqlstate(&e));
        let want = if iso == "READ COMMITTED" {
            Ok(0)
        } else {
            Err("40001".to_string())
        };
        assert_eq!(marked, want, "{iso}: a claimed file was marked published");
        let _ = w.batch_execute("ROLLBACK").await;
        // pin_new of the tombstoned key, in a transaction at this level.
        let p = connect().await;
        p.batch_execute(&format!("BEGIN ISOLATION LEVEL {iso}"))
            .await
            .unwrap();
        let e = p
            .execute("SELECT alkblobs_pin_new($1, $2, 'node-b')", &[&pool, &k])
            .await
            .unwrap_err();
        assert_eq!(
            sqlstate(&e),
            "55006",
            "{iso}: a tombstoned key was recorded"
        );
        let _ = p.batch_execute("ROLLBACK").await;
        // Phase 2 only at READ COMMITTED.
        let d = connect().await;
        d.batch_execute(&format!("BEGIN ISOLATION LEVEL {iso}"))
            .await
            .unwrap();
        let r = d
            .query(
                "SELECT * FROM alkblobs_local_deleting($1, ARRAY[$2::bytea])",
                &[&pool, &k],
            )
            .await
            .map(|r| r.len())
            .map_err(|e| sqlstate(&e));
        let want = if iso == "READ COMMITTED" {
            Ok(1)
        } else {
            Err("AB003".to_string())
        };
        assert_eq!(r, want, "{iso}");
        let _ = d.batch_execute("ROLLBACK").await;
    }
}

/// A file put again after a sweep staged it starts its delete window again:
/// `alkblobs_pin_new` takes the key out of the staged set, so a claim after
/// the old window (measured from a mark that saw the file unreferenced
/// before this put) cannot take it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_put_again_leaves_the_staged_set() {
    let c = connect().await;
    let pool = pool(&c, "restage", "1 hour", "60 seconds").await;
    c.execute(
        "UPDATE alkblobs.pools SET large_tier = 'local' WHERE name = $1",
        &[&pool],
    )
    .await
    .unwrap();
    let k = key(b"a file staged, then put again");
    publish_file(&c, &pool, &k, "node").await;
    c.execute("SELECT alkblobs_unpin($1, $2, 'node')", &[&pool, &k])
        .await
        .unwrap();
    c.query_one("SELECT alkblobs_stage($1, ARRAY[$2::bytea])", &[&pool, &k])
        .await
        .unwrap();
    assert_eq!(
        staged(&c, &pool, &k).await,
        1,
        "the sweep staged the unreferenced file"
    );
    publish_file(&c, &pool, &k, "node").await;
    assert_eq!(
        staged(&c, &pool, &k).await,
        0,
        "a file put again must leave the staged set (its window starts at the next mark)"
    );
}

async fn staged(c: &Client, pool: &str, k: &[u8]) -> i64 {
    c.query_one(
        "SELECT count(*) FROM alkblobs_staged WHERE pool = $1 AND key = encode($2, 'hex')",
        &[&pool, &k],
    )
    .await
    .unwrap()
    .get(0)
}

/// A writer whose snapshot predates a key's fence (on an s3 tier, a claim
/// that finished deleting the key fenced it) never records the key
/// at the fenced-off generation: at READ COMMITTED `alkblobs_pin_new` reads
/// the fence as it is now and returns it; at REPEATABLE READ and
/// SERIALIZABLE, where its snapshot cannot see the fence, it fails with
/// 40001 (retry), and the retry gets the fence. Fails when pin_new reads
/// the fence through its snapshot only (generation 0: the object name a
/// stopped claimer may still delete).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pin_new_gets_a_fence_its_snapshot_cannot_see_at_every_isolation_level() {
    let c = connect().await;
    for level in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let pool = s3_pool_sql(&c, "fence-iso").await;
        let k = key(format!("fenced at {level}").as_bytes());
        // The writer's transaction takes its snapshot first.
        let w = connect().await;
        w.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        w.query_one("SELECT count(*) FROM alkblobs.pools", &[])
            .await
            .unwrap();
        // Meanwhile: published, released, claimed, handed out again (its
        // first claimer looked dead), deleted (the fence).
        publish_file(&c, &pool, &k, "node-a").await;
        c.execute("SELECT alkblobs_unpin($1, $2, 'node-a')", &[&pool, &k])
            .await
            .unwrap();
        try_sweep_detailed(&c, &pool).await.unwrap();
        assert_eq!(claim_keys(&c, &pool).await, vec![k.clone()]);
        assert_eq!(
            claim_keys(&c, &pool).await,
            vec![k.clone()],
            "handed out again"
        );
        c.batch_execute("BEGIN").await.unwrap();
        c.query(
            "SELECT * FROM alkblobs_local_deleting_generations($1, ARRAY[$2::bytea])",
            &[&pool, &k],
        )
        .await
        .unwrap();
        c.query(
            "SELECT alkblobs_local_deleted($1, ARRAY[$2::bytea])",
            &[&pool, &k],
        )
        .await
        .unwrap();
        c.batch_execute("COMMIT").await.unwrap();
        let r = w
            .query_one("SELECT alkblobs_pin_new($1, $2, 'node-b')", &[&pool, &k])
            .await;
        match (level, r) {
            ("READ COMMITTED", Ok(row)) => {
                assert_eq!(row.get::<_, i64>(0), 1, "{level}: the fenced generation");
                w.batch_execute("COMMIT").await.unwrap();
            }
            (_, Err(e)) if level != "READ COMMITTED" => {
                assert_eq!(sqlstate(&e), "40001", "{level}: {e}");
                w.batch_execute("ROLLBACK").await.unwrap();
                let again: i64 = w
                    .query_one("SELECT alkblobs_pin_new($1, $2, 'node-b')", &[&pool, &k])
                    .await
                    .unwrap()
                    .get(0);
                assert_eq!(again, 1, "{level}: the retry gets the fence");
            }
            (_, r) => panic!(
                "{level}: pin_new returned {:?}, not the fence",
                r.map(|row| row.get::<_, i64>(0))
            ),
        }
    }
}
