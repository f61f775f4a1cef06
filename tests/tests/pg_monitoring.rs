//! The monitoring configuration in `docs/monitoring/` through the real
//! exporter: Debian's `prometheus-sql-exporter` (installed by the test
//! script) runs `docs/monitoring/prometheus-sql-exporter.yml` — the file an
//! operator copies, with only its connection URLs pointed at the test
//! database — as a read-only monitoring role, and the test scrapes its
//! `/metrics` over HTTP. Every query of the file must run without error,
//! and every value it declares must come out for the test's pools with the
//! value the views hold.

#![cfg(feature = "pg")]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::Duration;

use alkblobs_tests::pg::{connect, garbage, grant_pool, login_role, put, url};

const EXPORTER: &str = "/usr/bin/prometheus-sql-exporter";
const CONFIG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../docs/monitoring/prometheus-sql-exporter.yml"
);

/// (query name, label columns, value columns) of every query in the file.
fn declared() -> Vec<(String, Vec<String>, Vec<String>)> {
    let text = std::fs::read_to_string(CONFIG).unwrap();
    let docs = yaml_rust2::YamlLoader::load_from_str(&text).expect("the config is YAML");
    let strings = |y: &yaml_rust2::Yaml| -> Vec<String> {
        y.as_vec()
            .expect("a list")
            .iter()
            .map(|s| s.as_str().expect("a string").to_owned())
            .collect()
    };
    let mut out = Vec::new();
    for job in docs[0]["jobs"].as_vec().expect("jobs") {
        for q in job["queries"].as_vec().expect("queries") {
            out.push((
                q["name"].as_str().expect("name").to_owned(),
                strings(&q["labels"]),
                strings(&q["values"]),
            ));
        }
    }
    out
}

/// One sample of the exposition format: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

fn parse(body: &str) -> Vec<Sample> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (head, value) = l.rsplit_once(' ').unwrap();
            let (name, labels) = match head.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (head, ""),
            };
            let mut map = BTreeMap::new();
            // Label values here hold no `",` (pool names, outcomes).
            for pair in labels.split("\",").filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once("=\"").unwrap();
                map.insert(k.to_owned(), v.trim_end_matches('"').to_owned());
            }
            (name.to_owned(), map, value.parse().unwrap())
        })
        .collect()
}

fn scrape(port: u16) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())
}

struct Kill(std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitoring_config_runs_in_the_real_exporter_and_exports_every_value() {
    assert!(
        std::path::Path::new(EXPORTER).exists(),
        "{EXPORTER} is missing: scripts/test.sh installs Debian's prometheus-sql-exporter"
    );
    let c = connect().await;
    let monitor = login_role(&c, "monitor", "alkblobs_reader").await;
    // A healthy pool that was swept, with a pin, garbage collected, and
    // an expired pin piling up; a pool that was never swept and is past
    // its critical_after.
    let swept = alkblobs_tests::pg::pool(&c, "mon", "0s", "60s").await;
    put(&c, &swept, b"monitored", "o").await;
    garbage(&c, &swept, b"monitored garbage").await;
    c.batch_execute(&format!("CALL alkblobs_sweep_all('{swept}')"))
        .await
        .unwrap();
    // A verify of it that found one key missing (what a node records).
    c.execute(
        "SELECT alkblobs_verify_finished($1, now(), true, 1, 9, 1, 0, 0)",
        &[&swept],
    )
    .await
    .unwrap();
    let late = alkblobs_tests::pg::pool(&c, "monlate", "0s", "60s").await;
    c.execute(
        "SELECT alkblobs_alter_pool($1, warn_after => '1 second', critical_after => '1 second')",
        &[&late],
    )
    .await
    .unwrap();
    for p in [&swept, &late] {
        grant_pool(&c, p, &monitor, "read").await;
    }
    let hidden = alkblobs_tests::pg::pool(&c, "monhidden", "0s", "60s").await;
    put(&c, &hidden, b"not the monitor's", "o").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // The operator's file, its connection URLs pointed at the test
    // database as the monitoring role; nothing else changed.
    let text = std::fs::read_to_string(CONFIG).unwrap();
    // (The exporter's driver takes `postgres://` only.)
    let target = url().replacen("postgresql://", "postgres://", 1).replacen(
        "postgres@",
        &format!("{monitor}@"),
        1,
    ) + "?sslmode=disable";
    let config = text.replace(
        "postgres://alkblobs_monitor@localhost:5432/app?sslmode=disable",
        &target,
    );
    assert_ne!(
        config, text,
        "the file's connection URLs are where the test expects"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("exporter.yml");
    std::fs::write(&path, config).unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let _exporter = Kill(
        std::process::Command::new(EXPORTER)
            .arg("-config.file")
            .arg(&path)
            .arg("-web.listen-address")
            .arg(format!("127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start the exporter"),
    );
    let queries = declared();
    assert!(queries.len() >= 6, "{queries:?}");
    // Both jobs run at start; wait until every query has reported.
    let mut samples = Vec::new();
    for _ in 0..200 {
        if let Some(body) = scrape(port) {
            samples = parse(&body);
            let reported = queries.iter().all(|(q, _, _)| {
                samples.iter().any(|(n, l, _)| {
                    n == "sql_exporter_last_scrape_failed" && l.get("query") == Some(q)
                })
            });
            if reported {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let get = |metric: &str, pool: &str, col: &str| -> Option<f64> {
        samples
            .iter()
            .find(|(n, l, _)| {
                n == &format!("sql_{metric}")
                    && l.get("pool").map(String::as_str) == Some(pool)
                    && l.get("col").map(String::as_str) == Some(col)
            })
            .map(|s| s.2)
    };
    for (q, labels, values) in &queries {
        let failed = samples
            .iter()
            .find(|(n, l, _)| n == "sql_exporter_last_scrape_failed" && l.get("query") == Some(q))
            .unwrap_or_else(|| panic!("query {q} never reported"));
        assert_eq!(failed.2, 0.0, "query {q} failed in the exporter");
        for v in values {
            let s = samples
                .iter()
                .find(|(n, l, _)| {
                    n == &format!("sql_{q}")
                        && l.get("pool") == Some(&swept)
                        && l.get("col") == Some(v)
                })
                .unwrap_or_else(|| panic!("no sample of {q} col={v} for pool {swept}"));
            for label in labels {
                assert!(
                    s.1.contains_key(label),
                    "{q}: label {label} missing: {:?}",
                    s.1
                );
            }
        }
    }
    // The values are the views'. (The swept pool is critical: its last
    // verify found content missing.)
    assert_eq!(get("alkblobs_pool_status", &swept, "status"), Some(2.0));
    assert_eq!(
        get("alkblobs_pool_verify", &swept, "verify_missing"),
        Some(1.0)
    );
    assert_eq!(
        get("alkblobs_pool_verify", &late, "verify_missing"),
        None,
        "a pool never verified has no verify sample"
    );
    assert_eq!(get("alkblobs_pool_status", &late, "status"), Some(2.0));
    assert_eq!(
        get("alkblobs_pool_entries", &swept, "kv_entries"),
        Some(1.0)
    );
    assert_eq!(get("alkblobs_pool_entries", &swept, "pins"), Some(1.0));
    assert_eq!(
        get("alkblobs_pool_bytes", &swept, "kv_bytes"),
        Some(b"monitored".len() as f64)
    );
    assert_eq!(
        get("alkblobs_sweep_work_last_hour", &swept, "deleted"),
        Some(1.0)
    );
    let last: f64 = c
        .query_one(
            "SELECT extract(epoch FROM last_sweep)::float8 FROM alkblobs_health WHERE pool = $1",
            &[&swept],
        )
        .await
        .unwrap()
        .get(0);
    let exported = get(
        "alkblobs_pool_last_sweep_timestamp_seconds",
        &swept,
        "last_sweep",
    )
    .unwrap();
    assert!((exported - last).abs() < 0.001, "{exported} vs {last}");
    assert_eq!(
        get(
            "alkblobs_pool_last_sweep_timestamp_seconds",
            &late,
            "last_sweep"
        ),
        None,
        "a pool never swept has no last-sweep sample"
    );
    // The monitoring role sees only pools it was granted.
    assert!(
        samples
            .iter()
            .filter_map(|(_, l, _)| l.get("pool"))
            .all(|p| p == &swept || p == &late),
        "only the granted pools are exported (not {hidden})"
    );
}
