//! `ls --json` stays valid JSON whatever deletes race with the listing: one
//! process lists (plain and `--long`) while another sweeps the same keys.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

const BIN: &str = env!("CARGO_BIN_EXE_alkblobs");

fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("ALKBLOBS_DATA_DIR", dir.join("data"))
        .current_dir(dir)
        .output()
        .expect("run alkblobs")
}

fn ok(dir: &Path, args: &[&str]) {
    let o = run(dir, args);
    assert!(
        o.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn ls_json_parses_while_another_process_deletes() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_owned();
    // Small keys (kv, deleted in one transaction) and large ones (files,
    // deleted one by one): listings see the pool shrink mid-way.
    let mut files = Vec::new();
    for i in 0..120u32 {
        let name = format!("s{i}");
        std::fs::write(d.join(&name), format!("small {i}")).unwrap();
        files.push(name);
    }
    for i in 0..40u32 {
        let name = format!("l{i}");
        std::fs::write(d.join(&name), vec![i as u8; 70_000]).unwrap();
        files.push(name);
    }
    let mut put = vec!["put", "-q"];
    put.extend(files.iter().map(String::as_str));
    ok(&d, &put);

    let stop = Arc::new(AtomicBool::new(false));
    let lister = {
        let (d, stop) = (d.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut listings = 0u32;
            while !stop.load(Ordering::Relaxed) {
                for long in [false, true] {
                    let args: &[&str] = if long {
                        &["ls", "--long", "--json"]
                    } else {
                        &["ls", "--json"]
                    };
                    let o = run(&d, args);
                    let out = String::from_utf8_lossy(&o.stdout);
                    assert!(
                        o.status.success(),
                        "{args:?}: {}",
                        String::from_utf8_lossy(&o.stderr)
                    );
                    let v: serde_json::Value = serde_json::from_str(&out)
                        .unwrap_or_else(|e| panic!("{args:?} printed invalid JSON ({e}):\n{out}"));
                    for item in v.as_array().expect("an array") {
                        let key = if long { &item["key"] } else { item };
                        assert_eq!(key.as_str().map(str::len), Some(64), "{item}");
                        if long {
                            assert!(item["size"].is_u64() && item["tier"].is_string(), "{item}");
                        }
                    }
                    listings += 1;
                }
            }
            listings
        })
    };
    for _ in 0..12 {
        // Sweep everything away, then put it back.
        let gc = Command::new(BIN)
            .args(["gc", "--window", "0s", "-q", "--wait"])
            .env("ALKBLOBS_DATA_DIR", d.join("data"))
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(gc.success());
        ok(&d, &put);
        if lister.is_finished() {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let listings = lister.join().expect("every listing parsed");
    assert!(listings > 0);
}
