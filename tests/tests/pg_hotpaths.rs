//! The engines' hot paths of extension 0.5.0 (issue 9): `alkblobs_get`,
//! `alkblobs_stat`, `alkblobs_put` and `alkblobs_put_many` check access
//! inline (alkblobs.may's rules, not a nested call), `alkblobs_put_many`
//! checks a batch in one Rust pass, and entries and pins carry no foreign
//! key to pools, which refuse deletion instead. Each test fails if the
//! shortcut lets through what the full check refused.

#![cfg(feature = "pg")]

use alkblobs_tests::pg::{connect, connect_as, grant_pool, key, login_role, pool_with, sqlstate};
use tokio_postgres::Client;

/// What each hot function answers the caller: Ok or the SQLSTATE.
struct Answers {
    get: Result<(), String>,
    stat: Result<(), String>,
    put: Result<(), String>,
    put_many: Result<(), String>,
}

async fn answers(c: &Client, pool: &str, value: &[u8]) -> Answers {
    let k = key(value);
    let ok = |r: Result<u64, tokio_postgres::Error>| r.map(|_| ()).map_err(|e| sqlstate(&e));
    let null: Option<&str> = None;
    Answers {
        get: ok(c.execute("SELECT alkblobs_get($1, $2)", &[&pool, &k]).await),
        stat: ok(c
            .execute("SELECT * FROM alkblobs_stat($1, $2)", &[&pool, &k])
            .await),
        put: ok(c
            .execute(
                "SELECT alkblobs_put($1, $2, $3, $4)",
                &[&pool, &k, &value, &null],
            )
            .await),
        put_many: ok(c
            .execute(
                "SELECT alkblobs_put_many($1, ARRAY[$2::bytea], ARRAY[$3::bytea], $4)",
                &[&pool, &k, &value, &null],
            )
            .await),
    }
}

/// Every kind of caller against every inlined check: no grant, each grant,
/// membership in the pool's owner, a pool that does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_access_checks_follow_the_pool_grants() {
    let su = connect().await;
    let pool = pool_with(&su, "hot-acl", "0 seconds", "60 seconds", "pg-lo", true).await;
    let denied = || Err::<(), String>("42501".into());
    let v = b"hot path value";

    // A writer role with no grant on this pool: nothing.
    let none = login_role(&su, "hot_none", "alkblobs_writer").await;
    let a = answers(&connect_as(&none).await, &pool, v).await;
    assert_eq!(
        (a.get, a.stat, a.put, a.put_many),
        (denied(), denied(), denied(), denied()),
        "no grant"
    );

    // Read (and sweep): reads only.
    for access in ["read", "sweep"] {
        let r = login_role(&su, &format!("hot_{access}"), "alkblobs_admin").await;
        grant_pool(&su, &pool, &r, access).await;
        let a = answers(&connect_as(&r).await, &pool, v).await;
        assert_eq!(
            (a.get, a.stat, a.put, a.put_many),
            (Ok(()), Ok(()), denied(), denied()),
            "{access} grant"
        );
    }

    // Write and admin: everything.
    for access in ["write", "admin"] {
        let r = login_role(&su, &format!("hot_{access}"), "alkblobs_writer").await;
        grant_pool(&su, &pool, &r, access).await;
        let a = answers(&connect_as(&r).await, &pool, v).await;
        assert_eq!(
            (a.get, a.stat, a.put, a.put_many),
            (Ok(()), Ok(()), Ok(()), Ok(())),
            "{access} grant"
        );
    }

    // A member of the role that created the pool: everything, no grant.
    let owner_pool = {
        let creator = login_role(&su, "hot_creator", "alkblobs_admin").await;
        let c = connect_as(&creator).await;
        let name = format!("{pool}-own");
        c.execute(
            "SELECT alkblobs_create_pool($1, single_instance => true)",
            &[&name],
        )
        .await
        .unwrap();
        let member = login_role(&su, "hot_member", &creator).await;
        let a = answers(&connect_as(&member).await, &name, v).await;
        assert_eq!(
            (a.get, a.stat, a.put, a.put_many),
            (Ok(()), Ok(()), Ok(()), Ok(())),
            "member of the pool's creator"
        );
        name
    };
    // ... and the no-grant role still nothing there.
    let a = answers(&connect_as(&none).await, &owner_pool, v).await;
    assert_eq!(a.get, denied(), "no grant on the creator's pool");

    // A pool that does not exist.
    let a = answers(&su, &format!("{pool}-absent"), v).await;
    let absent = || Err::<(), String>("42704".into());
    assert_eq!(
        (a.get, a.stat, a.put, a.put_many),
        (absent(), absent(), absent(), absent())
    );

    // A key that is not 32 bytes, past the access check.
    for sql in [
        "SELECT alkblobs_get($1, $2)",
        "SELECT * FROM alkblobs_stat($1, $2)",
    ] {
        let e = su
            .execute(sql, &[&pool, &vec![7u8; 31]])
            .await
            .expect_err(sql);
        assert_eq!(sqlstate(&e), "22023", "{sql}");
    }
}

fn message(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map(|d| d.message().to_owned())
        .unwrap_or_default()
}

async fn entries(c: &Client, pool: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM alkblobs_list($1, NULL, 100000)",
        &[&pool],
    )
    .await
    .unwrap()
    .get(0)
}

/// A batch with one bad pair anywhere stores nothing and names the pair
/// and what is wrong with it, with the SQLSTATE of that kind of error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_many_refuses_a_batch_with_one_bad_pair() {
    let c = connect().await;
    let pool = pool_with(&c, "hot-batch", "0 seconds", "60 seconds", "pg-lo", true).await;
    let vals: Vec<Vec<u8>> = (0..5)
        .map(|i| format!("batch value {i}").into_bytes())
        .collect();
    let keys: Vec<Vec<u8>> = vals.iter().map(|v| key(v)).collect();
    let null: Option<&str> = None;
    let call = |ks: Vec<Option<Vec<u8>>>, vs: Vec<Option<Vec<u8>>>| {
        let (c, pool) = (&c, pool.clone());
        async move {
            c.query_one(
                "SELECT alkblobs_put_many($1, $2, $3, $4)",
                &[&pool, &ks, &vs, &null],
            )
            .await
        }
    };
    let good_k = || keys.iter().cloned().map(Some).collect::<Vec<_>>();
    let good_v = || vals.iter().cloned().map(Some).collect::<Vec<_>>();

    // A NULL value at position 4.
    let mut vs = good_v();
    vs[3] = None;
    let e = call(good_k(), vs).await.unwrap_err();
    assert_eq!(sqlstate(&e), "22004");
    assert!(message(&e).contains("position 4"), "{e:?}");
    // A NULL key at position 1.
    let mut ks = good_k();
    ks[0] = None;
    assert_eq!(sqlstate(&call(ks, good_v()).await.unwrap_err()), "22004");
    // A 31-byte key at position 2.
    let mut ks = good_k();
    ks[1] = Some(vec![1u8; 31]);
    let e = call(ks, good_v()).await.unwrap_err();
    assert_eq!(sqlstate(&e), "22023");
    assert!(message(&e).contains("position 2"), "{e:?}");
    // The last value swapped for another: its hash does not match.
    let mut vs = good_v();
    vs[4] = Some(b"tampered".to_vec());
    let e = call(good_k(), vs).await.unwrap_err();
    assert_eq!(sqlstate(&e), "AB001");
    assert!(message(&e).contains("position 5"), "{e:?}");
    assert_eq!(
        entries(&c, &pool).await,
        0,
        "a refused batch stored something"
    );

    // The same batch, all good, with a repeat: stored once, created at its
    // first position only.
    let mut ks = good_k();
    let mut vs = good_v();
    ks.push(ks[2].clone());
    vs.push(vs[2].clone());
    let created: Vec<bool> = call(ks.clone(), vs.clone()).await.unwrap().get(0);
    assert_eq!(created, vec![true, true, true, true, true, false]);
    assert_eq!(entries(&c, &pool).await, 5);
    let again: Vec<bool> = call(ks, vs).await.unwrap().get(0);
    assert_eq!(again, vec![false; 6], "a re-put creates nothing");
}

/// Pools are never deleted (entries and pins have no foreign key to them,
/// so a deleted pool would orphan its content): DELETE and TRUNCATE of the
/// pools table fail with 0A000 even for a superuser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_refuse_delete_and_truncate() {
    let c = connect().await;
    let pool = pool_with(&c, "hot-del", "0 seconds", "60 seconds", "pg-lo", true).await;
    let v = b"kept by its pool";
    c.execute(
        "SELECT alkblobs_put($1, $2, $3, NULL)",
        &[&pool, &key(v), &v.as_slice()],
    )
    .await
    .unwrap();
    // In a transaction rolled back either way: were the guard missing, the
    // other tests' pools would come back.
    let mut c = c;
    for sql in [
        "DELETE FROM alkblobs.pools WHERE name = $1",
        "TRUNCATE alkblobs.pools CASCADE",
    ] {
        let t = c.transaction().await.unwrap();
        let r = if sql.starts_with("DELETE") {
            t.execute(sql, &[&pool]).await
        } else {
            t.execute(sql, &[]).await
        };
        t.rollback().await.unwrap();
        assert_eq!(sqlstate(&r.expect_err(sql)), "0A000", "{sql}");
    }
    assert_eq!(entries(&c, &pool).await, 1);
}

/// 0.7.0's fast path (a plain insert when every key is new, falling back
/// to `ON CONFLICT` on a unique violation) answers each position as the
/// set-based path does: a key repeated in the batch is created once, a
/// present key is not created, and nothing of the failed plain insert
/// stays behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_many_reports_repeated_and_present_keys_once() {
    let c = connect().await;
    let pool = pool_with(&c, "hot-dup", "0 seconds", "60 seconds", "pg-lo", true).await;
    let (a, b, d) = (b"dup a".to_vec(), b"dup b".to_vec(), b"dup d".to_vec());
    let put_many = |keys: Vec<Vec<u8>>, vals: Vec<Vec<u8>>| {
        let (c, pool) = (&c, pool.clone());
        async move {
            c.query_one(
                "SELECT alkblobs_put_many($1, $2, $3, NULL)",
                &[&pool, &keys, &vals],
            )
            .await
            .unwrap()
            .get::<_, Vec<bool>>(0)
        }
    };
    let count = || async {
        c.query_one(
            "SELECT count(*) FROM alkblobs.entries e JOIN alkblobs.pools p ON p.id = e.pool WHERE p.name = $1",
            &[&pool],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
    };
    assert_eq!(put_many(vec![key(&b)], vec![b.clone()]).await, [true]);
    // Repeated a, present b, new d.
    assert_eq!(
        put_many(
            vec![key(&a), key(&b), key(&a), key(&d)],
            vec![a.clone(), b.clone(), a.clone(), d.clone()]
        )
        .await,
        [true, false, false, true]
    );
    assert_eq!(count().await, 3);
    // All new, one of them repeated (in a session without the hint the
    // failed batch left, so the plain insert is tried and fails).
    c.batch_execute("RESET alkblobs_hint.put_many_skip")
        .await
        .unwrap();
    let (e, f) = (b"dup e".to_vec(), b"dup f".to_vec());
    assert_eq!(
        put_many(
            vec![key(&e), key(&e), key(&f)],
            vec![e.clone(), e.clone(), f.clone()]
        )
        .await,
        [true, false, true]
    );
    assert_eq!(count().await, 5);
    // All present.
    assert_eq!(
        put_many(vec![key(&a), key(&f)], vec![a.clone(), f.clone()]).await,
        [false, false]
    );
    assert_eq!(count().await, 5);
}

/// The pin upsert, written inline on every put path (one source:
/// `-- @source pin(…)` in 30-puts-and-pins.sql): a new pin lasts the pool's
/// pin_ttl from now, and a pin taken again — by a put of a new key, a put
/// of a present one, a batch, a large object's commit or alkblobs_pin —
/// never ends sooner than it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_put_path_pins_for_the_pools_ttl_and_never_shortens_a_pin() {
    let c = connect().await;
    let p = alkblobs_tests::pg::pool(&c, "pinttl", "60 seconds", "1 hour").await;
    // Seconds left on the caller's pin of `k`.
    let left = async |k: &[u8]| -> f64 {
        c.query_one(
            "SELECT extract(epoch FROM pn.expires_at - clock_timestamp())::float8 \
               FROM alkblobs.pins pn JOIN alkblobs.pools pl ON pl.id = pn.pool \
              WHERE pl.name = $1 AND pn.key = $2 AND pn.owner = 'o'",
            &[&p, &k],
        )
        .await
        .unwrap()
        .get(0)
    };
    let (one, many, lo) = (key(b"one"), key(b"many"), key(b"lo"));
    c.execute("SELECT alkblobs_put($1, $2, 'one', 'o')", &[&p, &one])
        .await
        .unwrap();
    c.execute(
        "SELECT alkblobs_put_many($1, ARRAY[$2::bytea], ARRAY['many'::bytea], 'o')",
        &[&p, &many],
    )
    .await
    .unwrap();
    let mut t = connect().await;
    let tx = t.transaction().await.unwrap();
    let o: u32 = tx
        .query_one("SELECT alkblobs_lo_create($1)", &[&p])
        .await
        .unwrap()
        .get(0);
    tx.execute("SELECT alkblobs_lo_write($1, 0, 'lo')", &[&o])
        .await
        .unwrap();
    tx.execute("SELECT alkblobs_lo_commit($1, $2, $3, 'o')", &[&p, &lo, &o])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    for k in [&one, &many, &lo] {
        let l = left(k).await;
        assert!(
            (3590.0..=3600.0).contains(&l),
            "a new pin lasts pin_ttl: {l} s left"
        );
    }
    // A shorter TTL from now on: taking each pin again, by every path,
    // leaves it as long as it was.
    c.execute(
        "SELECT alkblobs_alter_pool($1, pin_ttl => '10 seconds')",
        &[&p],
    )
    .await
    .unwrap();
    for sql in [
        "SELECT alkblobs_put($1, $2, 'one', 'o')",
        "SELECT alkblobs_pin($1, $2, 'o')",
    ] {
        c.execute(sql, &[&p, &one]).await.unwrap();
    }
    c.execute(
        "SELECT alkblobs_put_many($1, ARRAY[$2::bytea, $3], ARRAY['many'::bytea, 'one'], 'o')",
        &[&p, &many, &one],
    )
    .await
    .unwrap();
    c.execute("SELECT alkblobs_pin($1, $2, 'o')", &[&p, &lo])
        .await
        .unwrap();
    for k in [&one, &many, &lo] {
        let l = left(k).await;
        assert!(l > 3500.0, "a pin taken again ended sooner: {l} s left");
    }
    // And a new pin now lasts the new TTL.
    let fresh = key(b"fresh");
    c.execute("SELECT alkblobs_put($1, $2, 'fresh', 'o')", &[&p, &fresh])
        .await
        .unwrap();
    let l = left(&fresh).await;
    assert!(
        (0.0..=10.0).contains(&l),
        "a new pin lasts the new pin_ttl: {l} s left"
    );
}
