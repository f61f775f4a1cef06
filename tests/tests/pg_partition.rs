//! A partition, not a pause: a fleet instance in its own network namespace
//! (`ip netns`, a veth pair, addresses on this machine only) is cut off
//! from PostgreSQL — the link it reaches the database through taken down —
//! for longer than its pin TTL, while it holds pins and while a large put
//! of it is between its pin and its publish (its upload to the S3 server,
//! which it still reaches, runs on). Another instance sweeps meanwhile.
//! When the cut heals the instance must not publish under its expired pin
//! (the put fails), its next liveness write naming a key that was
//! collected fails (AB002), and nothing protected is lost. Needs root
//! (network namespaces), the test cluster and the test S3 server that
//! scripts/test.sh starts; never skipped.

#![cfg(all(feature = "pg", feature = "s3"))]

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use alkblobs::backend::s3::S3Options;
use alkblobs::store::fleet::{FleetLarge, FleetOptions};
use alkblobs::{Key, Store, SweepOptions};
use alkblobs_tests::pg::{all_named_keys_present, connect, exists, register, table_name, url};
use alkblobs_tests::proc::Helper;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HELPER: &str = env!("CARGO_BIN_EXE_alkblobs-test-helper");

/// Runs `cmd args`, panicking with its output if it fails.
fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace joined to this one by two veth pairs, each a /30:
/// one the instance reaches the database through (`db`, cut by taking
/// the host's end down), one it reaches the S3 server through (`s3`).
/// Removed on drop.
struct Netns {
    name: String,
    db_if: String,
    db: String,
    s3: String,
}

impl Netns {
    fn create() -> Netns {
        let id = std::process::id();
        let name = format!("alkp{id}");
        run("ip", &["netns", "add", &name]);
        let mut ns = Netns {
            name: name.clone(),
            db_if: String::new(),
            db: String::new(),
            s3: String::new(),
        };
        for (i, tag) in ["d", "s"].into_iter().enumerate() {
            let (host_if, ns_if) = (
                format!("alk{tag}h{}", id % 100_000),
                format!("alk{tag}n{}", id % 100_000),
            );
            let net = format!("10.{}.{}", 231 + i, id % 250);
            let (host, inside) = (format!("{net}.1"), format!("{net}.2/30"));
            run(
                "ip",
                &[
                    "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
                ],
            );
            run("ip", &["link", "set", &ns_if, "netns", &name]);
            run(
                "ip",
                &["addr", "add", &format!("{host}/30"), "dev", &host_if],
            );
            run("ip", &["link", "set", &host_if, "up"]);
            for args in [
                ["addr", "add", inside.as_str(), "dev", ns_if.as_str()].as_slice(),
                ["link", "set", ns_if.as_str(), "up"].as_slice(),
            ] {
                let mut a: Vec<&str> = vec!["netns", "exec", &name, "ip"];
                a.extend_from_slice(args);
                run("ip", &a);
            }
            if tag == "d" {
                (ns.db_if, ns.db) = (host_if, host);
            } else {
                ns.s3 = host;
            }
        }
        run(
            "ip",
            &["netns", "exec", &name, "ip", "link", "set", "lo", "up"],
        );
        ns
    }

    /// Cuts the namespace off from the database: the host's end of its
    /// link goes down, and every packet on it is lost.
    fn cut(&self) {
        run("ip", &["link", "set", &self.db_if, "down"]);
    }

    /// Heals the cut.
    fn heal(&self) {
        run("ip", &["link", "set", &self.db_if, "up"]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // (The veth pairs go with the namespace.)
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Relays every connection to `listen` to `to`; the bytes from clients, all
/// connections together, at most `rate` bytes a second when given (an
/// upload that takes long enough for a partition to strike in its middle).
async fn relay(
    listen: SocketAddr,
    to: SocketAddr,
    rate: Option<u64>,
) -> tokio::task::JoinHandle<()> {
    let l = tokio::net::TcpListener::bind(listen)
        .await
        .unwrap_or_else(|e| panic!("bind {listen}: {e}"));
    let turn = std::sync::Arc::new(tokio::sync::Mutex::new(()));
    tokio::spawn(async move {
        while let Ok((client, _)) = l.accept().await {
            let turn = turn.clone();
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(to).await else {
                    return;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let up = async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let _turn = match rate {
                            Some(_) => Some(turn.lock().await),
                            None => None,
                        };
                        if sw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        if let Some(rate) = rate {
                            tokio::time::sleep(Duration::from_secs_f64(n as f64 / rate as f64))
                                .await;
                        }
                    }
                    let _ = sw.shutdown().await;
                };
                let down = async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    let _ = cw.shutdown().await;
                };
                tokio::join!(up, down);
            });
        }
    })
}

/// The host and port of a `postgresql://…@HOST:PORT/…` or `http://HOST:PORT` URL.
fn addr_of(u: &str) -> SocketAddr {
    let rest = u.split("://").nth(1).expect("a URL");
    let rest = rest.rsplit('@').next().unwrap();
    let hostport = rest.split('/').next().unwrap();
    hostport
        .parse()
        .unwrap_or_else(|e| panic!("{hostport}: {e}"))
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_instance_neither_publishes_nor_references_what_was_collected() {
    let c = connect().await;
    // Pin TTL 2 s, window 0: the sweeps during the cut may act at once.
    let (pool, loc) = alkblobs_tests::s3::pool("partition", "2 seconds", false).await;
    let table = table_name(&pool, "refs");
    c.batch_execute(&format!("CREATE TABLE {table} (key bytea NOT NULL)"))
        .await
        .unwrap();
    register(&c, &pool, &table).await;

    let ns = Netns::create();
    let pg = addr_of(&url());
    let s3_endpoint =
        std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL (the test S3 server)");
    let s3 = addr_of(&s3_endpoint);
    let pg_relay: SocketAddr = format!("{}:{}", ns.db, pg.port()).parse().unwrap();
    let s3_relay: SocketAddr = format!("{}:{}", ns.s3, s3.port()).parse().unwrap();
    let _relays = (
        relay(pg_relay, pg, None).await,
        // 2 MB/s up: the 16 MiB put uploads for about 8 s.
        relay(s3_relay, s3, Some(2_000_000)).await,
    );
    let inner_url = url().replacen(&pg.to_string(), &pg_relay.to_string(), 1);
    let endpoint = format!("AWS_ENDPOINT_URL=http://{s3_relay}");
    let mut h = Helper::spawn(
        "ip",
        &[
            "netns",
            "exec",
            &ns.name,
            "env",
            &endpoint,
            HELPER,
            "fleet-partitioned",
            &inner_url,
            &pool,
            &loc.to_string(),
            &table,
            "16",
        ],
    );
    let held: Vec<Key> = blocking(|| h.line())
        .and_then(|l| l.strip_prefix("held ").map(str::to_owned))
        .expect("the instance's held keys")
        .split(' ')
        .map(|k| k.parse().unwrap())
        .collect();
    let big: Key = blocking(|| h.line())
        .and_then(|l| l.strip_prefix("putting ").map(str::to_owned))
        .expect("the big put's key")
        .parse()
        .unwrap();
    // Its pin and record are committed (alkblobs_pin_new) and its upload
    // has begun: cut it off from the database.
    let recorded = Instant::now();
    loop {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM alkblobs.files f JOIN alkblobs.pools p ON p.id = f.pool
                  WHERE p.name = $1 AND f.key = $2",
                &[&pool, &big.as_bytes().to_vec()],
            )
            .await
            .unwrap()
            .get(0);
        if n == 1 {
            break;
        }
        assert!(
            recorded.elapsed() < Duration::from_secs(30),
            "the big put never pinned its key"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ns.cut();
    // Past the pin TTL, sweeps run (the SQL calls: they reap, review and
    // execute database rows; a file's claim is a client's, later): the
    // cut instance's pins are reaped, and the small keys they alone
    // protected are collected. The big put's record, its pin gone, is
    // staged for a claim; its upload still runs.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut swept = 0;
    while exists(&c, &pool, held[2].as_bytes()).await || exists(&c, &pool, held[3].as_bytes()).await
    {
        let r = c
            .query_one("SELECT aborted FROM alkblobs_sweep($1)", &[&pool])
            .await
            .unwrap();
        assert_eq!(r.get::<_, Option<String>>(0), None);
        swept += 1;
        assert!(
            swept < 50,
            "the sweeps did not collect what the lapsed pins protected"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pins: i64 = c
        .query_one(
            "SELECT count(*) FROM alkblobs_pins WHERE pool = $1 AND key = $2",
            &[&pool, &big.to_string()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        pins, 0,
        "the cut instance's pin on the big put was not reaped"
    );
    // What rows protect stays.
    for k in &held[..2] {
        assert!(
            exists(&c, &pool, k.as_bytes()).await,
            "a referenced key was collected"
        );
    }
    ns.heal();
    // The upload finishes and the publish reaches the database: refused,
    // its pin having lapsed.
    let put = blocking(|| h.line()).expect("the big put's outcome");
    assert!(
        put.starts_with("put error"),
        "published under an expired pin: {put}"
    );
    let published: i64 = c
        .query_one(
            "SELECT count(*) FROM alkblobs.files f JOIN alkblobs.pools p ON p.id = f.pool
              WHERE p.name = $1 AND f.key = $2 AND f.published",
            &[&pool, &big.as_bytes().to_vec()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(published, 0, "the big put's record is published");
    // A liveness write naming a key collected during the cut: AB002.
    blocking(|| {
        use std::io::Write;
        writeln!(h.child.stdin.as_mut().unwrap(), "write {}", held[2]).unwrap();
    });
    let wrote = blocking(|| h.line()).expect("the liveness write's outcome");
    assert_eq!(wrote, "liveness AB002", "a row now names collected content");
    assert!(all_named_keys_present(&c, &pool, &table).await);
    // Another instance's sweep claims the unpublished record and deletes
    // the object its upload left.
    let sweeper = Store::open_fleet(
        FleetOptions::new(
            url(),
            &pool,
            FleetLarge::S3(S3Options::new(loc.clone()).part_size(5 << 20)),
        )
        .threshold(1024),
    )
    .await
    .unwrap();
    let mut swept = 0;
    loop {
        sweeper.sweep(SweepOptions::new()).await.unwrap();
        let left: i64 = c
            .query_one(
                "SELECT count(*) FROM alkblobs.files f JOIN alkblobs.pools p ON p.id = f.pool
                  WHERE p.name = $1 AND f.key = $2",
                &[&pool, &big.as_bytes().to_vec()],
            )
            .await
            .unwrap()
            .get(0);
        if left == 0 && sweeper.get(&big).await.unwrap().is_none() {
            break;
        }
        swept += 1;
        assert!(
            swept < 50,
            "the big put's record or object was never collected"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    h.kill();
}
