//! The conformance suites over the PostgreSQL engines and single-instance
//! PostgreSQL stores (issue 9), against the server the test script starts
//! (`ALKBLOBS_PG_URL`; without it the tests fail, they never skip). Every
//! case gets a pool of its own.

#![cfg(feature = "pg")]

use alkblobs::backend::postgres::{PgLoBackend, PgOptions, PgPool, PostgresBackend};
use alkblobs::conformance::backend::Caps;
use alkblobs::conformance::store::Config;
use alkblobs::store::postgres::{PgLarge, PostgresOptions};
use alkblobs::{Error, Store, arbiter_suite, backend_suite, large_backend_suite, store_suite};
use alkblobs_tests::pg::{connect, url};

/// Where the engines connect: `ALKBLOBS_PG_STORE_URL` (e.g. a
/// transaction-mode pgbouncer in front of the server) or the server itself.
/// Pools are created and inspected directly on the server either way.
fn store_url() -> String {
    std::env::var("ALKBLOBS_PG_STORE_URL").unwrap_or_else(|_| url())
}

const KV: Caps = Caps {
    max_value: 65_537,
    list_keys: 100_000,
};
// Each large-object put is a transaction of a few round trips.
const LARGE: Caps = Caps {
    max_value: 8 << 20,
    list_keys: 2_000,
};
const MIB: usize = 1 << 20;
const TIERED: Config = Config {
    kv_only: false,
    big: 100 * MIB,
    list_keys: 20_000,
};
const KV_ONLY: Config = Config {
    kv_only: true,
    big: 0,
    list_keys: 20_000,
};

/// A fresh single-instance pool whose large tier is `large`.
async fn single_pool(tag: &str, large: &str) -> String {
    let c = connect().await;
    alkblobs_tests::pg::pool_with(&c, tag, "0 seconds", "60 seconds", large, true).await
}

async fn engines(tag: &str, large: &str) -> PgPool {
    let pool = single_pool(tag, large).await;
    PgPool::connect(&PgOptions::new(store_url(), pool))
        .await
        .expect("connect")
        .0
}

backend_suite!(postgres_kv, KV, async {
    (PostgresBackend::new(engines("eng-kv", "pg-lo").await), ())
});

large_backend_suite!(pg_lo, LARGE, async {
    (PgLoBackend::new(engines("eng-lo", "pg-lo").await), ())
});

store_suite!(single_pg_lo, TIERED, async {
    let pool = single_pool("st-lo", "pg-lo").await;
    (
        Store::open_postgres(PostgresOptions::new(store_url(), pool))
            .await
            .unwrap(),
        (),
    )
});

store_suite!(single_kv_only, KV_ONLY, async {
    let pool = single_pool("st-none", "none").await;
    (
        Store::open_postgres(PostgresOptions::new(store_url(), pool))
            .await
            .unwrap(),
        (),
    )
});

store_suite!(single_local, TIERED, async {
    let pool = single_pool("st-local", "local").await;
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open_postgres(
        PostgresOptions::new(store_url(), pool).large(PgLarge::Local(dir.path().join("large"))),
    )
    .await
    .unwrap();
    (s, dir)
});

/// The preset refuses what it must: a fleet pool (an in-process arbiter
/// must not sweep a pool other instances use), a large tier other than the
/// pool's, a pool that does not exist, a database without the extension.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_preset_refuses_what_would_be_unsafe_or_wrong() {
    let c = connect().await;
    let fleet = alkblobs_tests::pg::pool(&c, "fleet", "0 seconds", "60 seconds").await;
    let e = Store::open_postgres(PostgresOptions::new(url(), &fleet))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Config(ref m) if m.contains("fleet pool")),
        "{e}"
    );
    let lo = single_pool("wrong-large", "pg-lo").await;
    let e = Store::open_postgres(PostgresOptions::new(url(), &lo).large(PgLarge::None))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Config(ref m) if m.contains("not none")),
        "{e}"
    );
    let e = Store::open_postgres(PostgresOptions::new(url(), "no-such-pool"))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::NoPool { ref pool, .. } if pool == "no-such-pool"),
        "{e}"
    );
    assert_eq!(e.kind(), alkblobs::ErrorKind::NotFound);
    let db = format!("alkblobs_noext_{}", std::process::id());
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {db}"))
        .await
        .unwrap();
    c.batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    let base = url().rsplit_once('/').map(|(b, _)| b.to_owned()).unwrap();
    let e = Store::open_postgres(PostgresOptions::new(format!("{base}/{db}"), "p"))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Config(ref m) if m.contains("CREATE EXTENSION alkblobs")),
        "{e}"
    );
    c.batch_execute(&format!("DROP DATABASE {db}"))
        .await
        .unwrap();
}

arbiter_suite!(single_pg_lo_arbiter, async {
    let pool = single_pool("arb-lo", "pg-lo").await;
    (
        Store::open_postgres(PostgresOptions::new(store_url(), pool).threshold(1024))
            .await
            .unwrap(),
        (),
    )
});

arbiter_suite!(single_kv_only_arbiter, async {
    let pool = single_pool("arb-none", "none").await;
    (
        Store::open_postgres(PostgresOptions::new(store_url(), pool))
            .await
            .unwrap(),
        (),
    )
});

/// A single-instance pool's staged rows are durable: a store reopened
/// after a sweep staged candidates (its process gone) sees them and
/// deletes them when due; and the extension's own sweep refuses the pool,
/// since only the owning instance knows its pins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_rows_survive_a_restart_and_the_extension_keeps_out() {
    let c = connect().await;
    let pool =
        alkblobs_tests::pg::pool_with(&c, "durable", "2 seconds", "60 seconds", "pg-lo", true)
            .await;
    let store = Store::open_postgres(PostgresOptions::new(url(), &pool).threshold(1024))
        .await
        .unwrap();
    let small = store.put(b"small and dead".to_vec()).await.unwrap();
    let big = store.put(vec![7u8; 5000]).await.unwrap();
    drop((small.pin, big.pin));
    let report = store.sweep(alkblobs::SweepOptions::new()).await.unwrap();
    assert_eq!(report.staged, 2, "{report:?}");
    store.close().await.unwrap();
    drop(store);

    let row = c
        .query_one("SELECT aborted FROM alkblobs_sweep($1)", &[&pool])
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, Option<String>>(0).as_deref(),
        Some("single_instance_pool")
    );
    // Pin rows would protect nothing in a pool its instance sweeps: refused.
    let e = c
        .query_one(
            "SELECT alkblobs_pin($1, $2, 'someone')",
            &[&pool, &alkblobs_tests::pg::key(b"x")],
        )
        .await
        .unwrap_err();
    assert_eq!(alkblobs_tests::pg::sqlstate(&e), "22023", "{e}");

    let store = Store::open_postgres(PostgresOptions::new(url(), &pool).threshold(1024))
        .await
        .unwrap();
    let staged = store.staged(None, 100).await.unwrap();
    assert_eq!(staged.len(), 2, "staged rows lost with the process");
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let report = store.sweep(alkblobs::SweepOptions::new()).await.unwrap();
    assert_eq!(report.deleted, 2, "{report:?}");
    assert!(!store.has(&small.key).await.unwrap());
    assert!(!store.has(&big.key).await.unwrap());
}

/// Large objects that are neither an entry nor an upload.
async fn orphan_objects(c: &tokio_postgres::Client) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pg_largeobject_metadata m
          WHERE NOT EXISTS (SELECT 1 FROM alkblobs.entries e WHERE e.loid = m.oid)
            AND NOT EXISTS (SELECT 1 FROM alkblobs.uploads u WHERE u.loid = m.oid)",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Terminates every server connection of `app` (an application_name).
async fn kill_app(c: &tokio_postgres::Client, app: &str) {
    c.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
        &[&app],
    )
    .await
    .unwrap();
}

/// Connections dropped under a store (the server terminates them, as a
/// restart or a network fault would): an operation in flight fails with a
/// retryable error and leaves nothing torn; the pool reconnects and the
/// store carries on with everything it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_connections_fail_retryably_and_the_pool_reconnects() {
    let c = connect().await;
    let pool = single_pool("drop-conn", "pg-lo").await;
    let app = format!("alkb_drop_{}", std::process::id());
    let sep = if url().contains('?') { '&' } else { '?' };
    let store_url = format!("{}{sep}application_name={app}", url());
    let store = Store::open_postgres(PostgresOptions::new(&store_url, &pool).threshold(1024))
        .await
        .unwrap();
    let kept = store.put(vec![1u8; 4096]).await.unwrap();
    store.add_roots(&[kept.key]).await.unwrap();
    // (Counted before and after: a committed large object is always an
    // entry or an upload, so another test cannot change this count.)
    let orphans_before = orphan_objects(&c).await;
    // A big streaming put, its connection killed while it writes.
    let big: Vec<u8> = (0..64u32 << 20).map(|i| (i % 251) as u8).collect();
    let big_key = alkblobs::Key::of(&big);
    let writer = {
        let store = store.clone();
        let big = big.clone();
        tokio::spawn(async move { store.put_reader(std::io::Cursor::new(big)).await })
    };
    // Wait until the upload is in progress, then cut it off.
    let mut seen = false;
    for _ in 0..500 {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE '%alkblobs_lo_write%'",
                &[&app],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            seen = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(seen, "the upload never started");
    kill_app(&c, &app).await;
    let err = writer
        .await
        .unwrap()
        .expect_err("a put whose connection died succeeded");
    assert!(err.is_retryable(), "not retryable: {err}");
    assert!(
        !store.has(&big_key).await.unwrap(),
        "a torn entry is visible"
    );
    // Idle pooled connections killed too: the store reconnects.
    kill_app(&c, &app).await;
    let mut ok = None;
    for _ in 0..5 {
        match store.get(&kept.key).await {
            Ok(v) => {
                ok = v;
                break;
            }
            Err(e) => assert!(e.is_retryable(), "not retryable: {e}"),
        }
    }
    assert_eq!(ok.as_deref(), Some(&[1u8; 4096][..]), "lost the kept blob");
    let again = store.put_reader(std::io::Cursor::new(big)).await.unwrap();
    assert_eq!(again.key, big_key);
    assert!(store.has(&big_key).await.unwrap());
    // No large object was left behind by the killed upload.
    assert_eq!(
        orphan_objects(&c).await,
        orphans_before,
        "the killed upload left a large object"
    );
}

/// TLS with libpq's sslmode meanings: `verify-full` against the CA that
/// signed the server's certificate works (by name and by address, both in
/// the certificate) and really encrypts; a CA that did not sign it is
/// refused with a configuration error naming sslmode; `require` encrypts
/// without verifying; `disable` does not encrypt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_follows_sslmode() {
    let c = connect().await;
    let pool = single_pool("tls", "pg-lo").await;
    let ca = std::env::var("ALKBLOBS_PG_CA").unwrap_or_else(|_| {
        format!(
            "/tmp/alkblobs-pg-{}/tls/ca.crt",
            std::env::var("ALKBLOBS_PG_PORT").unwrap_or_else(|_| "54329".into())
        )
    });
    let other = ca.replace("ca.crt", "other-ca.crt");
    let base = url();
    let by_name = base.replacen("127.0.0.1", "localhost", 1);
    let app = format!("alkb_tls_{}", std::process::id());
    let encrypted = |app: String| {
        let c = &c;
        async move {
            let rows = c
                .query(
                    "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a ON a.pid = s.pid
                      WHERE a.application_name = $1",
                    &[&app],
                )
                .await
                .unwrap();
            assert!(!rows.is_empty(), "no connection of {app}");
            rows.iter().all(|r| r.get::<_, bool>(0))
        }
    };
    for (i, (u, mode)) in [
        (&by_name, format!("sslmode=verify-full&sslrootcert={ca}")),
        (&base, format!("sslmode=verify-full&sslrootcert={ca}")),
        (&base, "sslmode=require".to_string()),
    ]
    .into_iter()
    .enumerate()
    {
        let a = format!("{app}_{i}");
        let store = Store::open_postgres(PostgresOptions::new(
            format!("{u}?{mode}&application_name={a}"),
            &pool,
        ))
        .await
        .unwrap_or_else(|e| panic!("{mode}: {e}"));
        let put = store.put(b"over TLS".to_vec()).await.unwrap();
        assert!(store.has(&put.key).await.unwrap());
        assert!(encrypted(a.clone()).await, "{mode}: not encrypted");
        store.close().await.unwrap();
    }
    let a = format!("{app}_plain");
    let store = Store::open_postgres(PostgresOptions::new(
        format!("{base}?sslmode=disable&application_name={a}"),
        &pool,
    ))
    .await
    .unwrap();
    assert!(!encrypted(a).await, "sslmode=disable encrypted");
    store.close().await.unwrap();
    let e = Store::open_postgres(PostgresOptions::new(
        format!("{by_name}?sslmode=verify-full&sslrootcert={other}"),
        &pool,
    ))
    .await
    .unwrap_err();
    assert!(
        matches!(e, Error::Config(ref m) if m.contains("sslmode")),
        "{e}"
    );
}

/// A role that may not use the extension is told which role to grant; one
/// that may use it but not this pool is told the pool is not there for it
/// (and how to get access).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_privileges_is_told_what_to_grant() {
    let c = connect().await;
    let pool = single_pool("privs", "pg-lo").await;
    let nobody = alkblobs_tests::pg::login_role(&c, "nobody", "pg_read_all_stats").await;
    let as_role = |role: &str| url().replacen("postgres@", &format!("{role}@"), 1);
    let e = Store::open_postgres(PostgresOptions::new(as_role(&nobody), &pool))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Config(ref m) if m.contains("GRANT alkblobs_writer")),
        "{e}"
    );
    let writer = alkblobs_tests::pg::login_role(&c, "writer", "alkblobs_writer").await;
    let e = Store::open_postgres(PostgresOptions::new(as_role(&writer), &pool))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NoPool { .. }), "{e}");
    assert!(e.to_string().contains("alkblobs_grant_pool"), "{e}");
}

/// A process SIGKILLed in the middle of its puts (kv rows and streamed
/// large objects) leaves no torn entry and no orphaned large object, and
/// every put that returned survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_writer_processes_leave_nothing_torn() {
    let c = connect().await;
    let pool = single_pool("killed", "pg-lo").await;
    let orphans_before = orphan_objects(&c).await;
    let mut returned = std::collections::HashSet::new();
    for round in 0..3u64 {
        let mut h = alkblobs_tests::proc::Helper::spawn(
            env!("CARGO_BIN_EXE_alkblobs-test-helper"),
            &["pg-crash-puts", &store_url(), &pool],
        );
        for _ in 0..(3 + round * 2) {
            let line = h.line().expect("helper died early");
            returned.insert(line.parse::<alkblobs::Key>().unwrap());
        }
        // Kill it at an arbitrary point (often inside the 6 MB upload).
        std::thread::sleep(std::time::Duration::from_millis(20 + 30 * round));
        h.kill();
        let store = Store::open_postgres(PostgresOptions::new(store_url(), &pool).threshold(1024))
            .await
            .unwrap();
        let report = store.verify().await.unwrap();
        assert!(
            report.corrupt.is_empty(),
            "round {round}: torn {:?}",
            report.corrupt
        );
        assert!(
            report.missing.is_empty(),
            "round {round}: verify says lost: {:?}",
            report.missing
        );
        assert!(
            report.checked >= returned.len() as u64,
            "round {round}: {report:?}"
        );
        for k in &returned {
            assert!(
                store.has(k).await.unwrap(),
                "round {round}: a returned put was lost: {k}"
            );
        }
        store.close().await.unwrap();
    }
    // The killed uploads' transactions rolled back with their connections.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        orphan_objects(&c).await,
        orphans_before,
        "a killed upload left a large object"
    );
}

/// A streaming `pg-lo` read spans two connections (the second imports the
/// first's snapshot and reads every other window): the object deleted and
/// its large object unlinked after the read began does not tear the read,
/// whichever connection reads a window. With a pool of one connection the
/// read goes on alone and returns the same bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_read_keeps_one_snapshot_across_its_connections() {
    use alkblobs::backend::LargeBackend;
    use tokio::io::AsyncReadExt;
    let c = connect().await;
    let big: Vec<u8> = (0..48u32 << 20).map(|i| (i % 253) as u8).collect();
    let key = alkblobs::Key::of(&big);
    for max in [4usize, 1] {
        let pool = single_pool("lo-snap", "pg-lo").await;
        let pg = PgPool::connect(&PgOptions::new(store_url(), &pool).max_connections(max))
            .await
            .unwrap()
            .0;
        let lo = PgLoBackend::new(pg);
        let mut w = lo.begin_write().await.unwrap();
        for chunk in big.chunks(MIB) {
            w.write(bytes::Bytes::copy_from_slice(chunk)).await.unwrap();
        }
        w.commit(&key, alkblobs::outboard::of(&big).1.into())
            .await
            .unwrap();
        let mut r = lo.open_read(&key).await.unwrap().expect("just put");
        let mut got = vec![0u8; MIB];
        r.read_exact(&mut got).await.unwrap();
        // Deleted (entry and large object) and committed, mid-read.
        let gone: i64 = c
            .query_one(
                "SELECT count(*) FROM alkblobs_delete($1, ARRAY[$2::bytea])",
                &[&pool, &key.as_bytes().as_slice()],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(gone, 1);
        r.read_to_end(&mut got).await.unwrap();
        assert_eq!(
            got.len(),
            big.len(),
            "pool of {max}: the read was cut short"
        );
        assert!(got == big, "pool of {max}: the read returned other bytes");
        assert!(
            lo.open_read(&key).await.unwrap().is_none(),
            "a new read sees the deletion"
        );
    }
}
