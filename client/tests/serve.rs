//! `alkblobs serve` with `curl` as the real client: ranges, HEAD,
//! conditional requests, bad keys, path tricks, oversized bodies, slow
//! clients, tokens, TLS and a graceful SIGTERM. Every answer is a 4xx or a
//! correct one: never a 5xx, a hang or a panic.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_alkblobs");

/// A running `alkblobs serve` and its address.
struct Served {
    child: Child,
    url: String,
    stderr: PathBuf,
}

impl Served {
    fn start(dir: &Path, extra: &[&str]) -> Served {
        let stderr = dir.join(format!("serve-{}.log", rand_tag()));
        let mut child = Command::new(BIN)
            .args(["serve", "--create", "--listen", "127.0.0.1:0"])
            .args(extra)
            .env("ALKBLOBS_DATA_DIR", dir.join("data"))
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("start alkblobs serve");
        let mut line = Vec::new();
        let mut out = child.stdout.take().unwrap();
        let mut b = [0u8; 1];
        while out.read(&mut b).unwrap() == 1 && b[0] != b'\n' {
            line.push(b[0]);
        }
        let url = String::from_utf8(line).unwrap();
        assert!(
            url.starts_with("http"),
            "serve printed {url:?}: {}",
            std::fs::read_to_string(&stderr).unwrap_or_default()
        );
        Served { child, url, stderr }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// SIGTERM, then the exit status and the log.
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        unsafe_kill(self.child.id(), 15);
        let status = wait_timeout(&mut self.child, Duration::from_secs(20))
            .expect("serve exits after SIGTERM");
        let log = self.log();
        (status, log)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rand_tag() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn unsafe_kill(pid: u32, sig: i32) {
    let status = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn wait_timeout(child: &mut Child, d: Duration) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// `curl -s` with `args`, the status code appended to stdout after a
/// newline; (status, body).
fn curl(args: &[&str]) -> (u16, Vec<u8>) {
    let o: Output = Command::new("curl")
        .args(["-sS", "--max-time", "30", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("run curl");
    let out = o.stdout.clone();
    let nl = out.iter().rposition(|b| *b == b'\n').expect("status line");
    let code: u16 = String::from_utf8_lossy(&out[nl + 1..])
        .trim()
        .parse()
        .unwrap_or(0);
    if code == 0 {
        // curl could not reach the server: say why.
        eprintln!("curl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
    (code, out[..nl].to_vec())
}

/// A self-signed certificate for 127.0.0.1 in `d` (cert.pem, key.pem).
fn self_signed_cert(d: &Path) {
    let ok = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(d.join("key.pem"))
        .arg("-out")
        .arg(d.join("cert.pem"))
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

fn json(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
}

fn blob(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2654435761) >> 9) as u8 ^ seed)
        .collect()
}

fn b3(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// Serving a data directory that holds no store (a mistyped --data-dir)
/// fails like every other command that reads one (exit 3) and creates
/// nothing; `--create` makes it, for a new node's first start.
#[test]
fn serve_refuses_a_directory_with_no_store_unless_told_to_create_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("mistyped");
    let log = tmp.path().join("refused.log");
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("ALKBLOBS_DATA_DIR", &data)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(20));
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let err = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(3),
        "serve did not refuse: {err}"
    );
    assert!(err.contains("no store at"), "{err}");
    assert!(!data.exists(), "serve made {}", data.display());
    let s = Served::start(tmp.path(), &[]);
    let key = b3(b"x");
    let (code, body) = curl(&[
        "-X",
        "PUT",
        "--data-binary",
        "x",
        &format!("{}/blobs/{key}", s.url),
    ]);
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&body));
    s.stop();
    assert!(tmp.path().join("data").exists());
}

#[test]
fn curl_puts_gets_ranges_and_conditionals_and_never_sees_a_5xx() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let s = Served::start(d, &["--max-body", "2000000"]);
    let big = blob(1_500_000, 1);
    std::fs::write(d.join("big"), &big).unwrap();
    let key = b3(&big);
    let at = |p: &str| format!("{}{p}", s.url);
    let at_file = |name: &str| format!("@{}", d.join(name).display());

    // A verified PUT, then the same bytes again (200, existed), then bytes
    // that are not the key (422, nothing stored).
    let (c, body) = curl(&[
        "-X",
        "PUT",
        "--data-binary",
        &at_file("big"),
        &at(&format!("/blobs/{key}")),
    ]);
    assert_eq!(c, 201, "{}", String::from_utf8_lossy(&body));
    let put = json(&body);
    assert_eq!(put["key"], key);
    assert_eq!(put["size"], 1_500_000);
    assert!(put["pin"]["expires_at"].as_str().unwrap().ends_with('Z'));
    let pin = put["pin"]["id"].as_str().unwrap().to_owned();
    let (c, _) = curl(&[
        "-X",
        "PUT",
        "--data-binary",
        &at_file("big"),
        &at(&format!("/blobs/{key}")),
    ]);
    assert_eq!(c, 200, "a second put of present content");
    std::fs::write(d.join("small"), b"not the key").unwrap();
    let (c, b) = curl(&[
        "-X",
        "PUT",
        "--data-binary",
        &at_file("small"),
        &at(&format!("/blobs/{key}")),
    ]);
    assert_eq!(
        (c, json(&b)["error"]["code"].as_str().unwrap()),
        (422, "hash_mismatch")
    );
    // A large body that is not the key (the streamed path): 422, and
    // nothing stored under either key.
    let wrong = blob(1_200_000, 7);
    std::fs::write(d.join("wrong"), &wrong).unwrap();
    let (c, b) = curl(&[
        "-X",
        "PUT",
        "--data-binary",
        &at_file("wrong"),
        &at(&format!("/blobs/{key}")),
    ]);
    assert_eq!(
        (c, json(&b)["error"]["code"].as_str().unwrap()),
        (422, "hash_mismatch")
    );
    let stored = curl(&[&at(&format!("/blobs/{}", b3(&wrong)))]).0;
    assert_eq!(stored, 404, "nothing of it stored");
    let (c, b) = curl(&[
        "-X",
        "POST",
        "--data-binary",
        &at_file("small"),
        &at("/blobs"),
    ]);
    assert_eq!(c, 201);
    assert_eq!(json(&b)["key"], b3(b"not the key"));
    // The client releases its pin once the key is recorded; twice is 404.
    assert_eq!(curl(&["-X", "DELETE", &at(&format!("/pins/{pin}"))]).0, 204);
    assert_eq!(curl(&["-X", "DELETE", &at(&format!("/pins/{pin}"))]).0, 404);

    // Whole, single, suffix, open-ended, clamped and unsatisfiable ranges.
    let url = at(&format!("/blobs/{key}"));
    let (c, b) = curl(&[&url]);
    assert_eq!(c, 200);
    assert!(b == big);
    for (range, want) in [
        ("0-0", &big[..1]),
        ("1000-1999", &big[1000..2000]),
        ("-100", &big[big.len() - 100..]),
        ("1499990-", &big[1_499_990..]),
        ("1400000-9999999", &big[1_400_000..]),
    ] {
        let (c, b) = curl(&["-r", range, &url]);
        assert_eq!(c, 206, "{range}");
        assert!(b == want, "{range}: {} bytes", b.len());
    }
    for range in ["1500000-", "2000000-2000001"] {
        let (c, b) = curl(&["-r", range, &url]);
        assert_eq!(c, 416, "{range}");
        assert_eq!(json(&b)["error"]["code"], "range_not_satisfiable");
    }
    let (c, b) = curl(&["-H", "Range: bytes=0-1,5-6", &url]);
    assert_eq!(
        (c, b.len()),
        (200, big.len()),
        "multiple ranges: the whole blob"
    );
    let (c, b) = curl(&["-H", "Range: bytes=9-3", &url]);
    assert_eq!(
        (c, b.len()),
        (200, big.len()),
        "an invalid range is ignored"
    );

    // HEAD and conditional requests on the strong ETag.
    let o = Command::new("curl").args(["-sI", &url]).output().unwrap();
    let head = String::from_utf8_lossy(&o.stdout).to_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-length: 1500000"), "{head}");
    assert!(head.contains(&format!("etag: \"{key}\"")), "{head}");
    assert!(head.contains("accept-ranges: bytes"), "{head}");
    let tag = format!("\"{key}\"");
    assert_eq!(curl(&["-H", &format!("If-None-Match: {tag}"), &url]).0, 304);
    assert_eq!(curl(&["-H", "If-None-Match: \"other\"", &url]).0, 200);
    assert_eq!(curl(&["-H", "If-Match: \"other\"", &url]).0, 412);
    assert_eq!(
        curl(&["-H", &format!("If-Match: {tag}"), "-r", "0-9", &url]).0,
        206
    );
    let (c, b) = curl(&["-H", "If-Range: \"stale\"", "-r", "0-9", &url]);
    assert_eq!(
        (c, b.len()),
        (200, big.len()),
        "If-Range of another entity: all of it"
    );
    let (c, b) = curl(&["-H", &format!("If-Range: {tag}"), "-r", "0-9", &url]);
    assert_eq!((c, b.len()), (206, 10));

    // Bad keys and path tricks: 4xx, never a file outside the store.
    for path in [
        "/blobs/zzz",
        &format!("/blobs/{}", key.to_uppercase()),
        "/blobs/..%2f..%2fetc%2fpasswd",
        "/blobs/%00",
        &format!("/blobs/{key}0"),
    ] {
        let (c, b) = curl(&[&at(path)]);
        assert_eq!(c, 400, "{path}: {}", String::from_utf8_lossy(&b));
    }
    for path in [
        "/blobs/../../etc/passwd",
        "/etc/passwd",
        "/",
        "/blobs/a/b/c",
    ] {
        let (c, _) = curl(&["--path-as-is", &at(path)]);
        assert!((400..500).contains(&c), "{path}: {c}");
    }
    let absent = "0".repeat(64);
    let (c, b) = curl(&[&at(&format!("/blobs/{absent}"))]);
    assert_eq!(
        (c, json(&b)["error"]["code"].as_str().unwrap()),
        (404, "not_found")
    );
    assert_eq!(curl(&["-X", "PATCH", &url]).0, 405);

    // An outboard is stored only if it is the blob's (422 otherwise), and
    // a forwarded request needs a token even from loopback.
    let groups = 1_500_000u64.div_ceil(16_384);
    std::fs::write(d.join("zeros"), vec![0u8; 64 * (groups as usize - 1)]).unwrap();
    let ob_url = at(&format!("/blobs/{key}/outboard"));
    let (c, b) = curl(&["-X", "PUT", "--data-binary", &at_file("zeros"), &ob_url]);
    assert_eq!(
        (c, json(&b)["error"]["code"].as_str().unwrap()),
        (422, "bad_outboard")
    );
    let (c, good) = curl(&[&ob_url]);
    assert_eq!((c, good.len() as u64), (200, 64 * (groups - 1)));
    std::fs::write(d.join("good-ob"), &good).unwrap();
    assert_eq!(
        curl(&["-X", "PUT", "--data-binary", &at_file("good-ob"), &ob_url]).0,
        204
    );
    let (c, b) = curl(&["-H", "X-Forwarded-For: 203.0.113.9", &url]);
    assert_eq!(
        (c, json(&b)["error"]["code"].as_str().unwrap()),
        (403, "loopback_only")
    );

    // Oversized bodies: declared (Content-Length) or streamed (chunked).
    std::fs::write(d.join("huge"), blob(2_100_000, 2)).unwrap();
    let (c, b) = curl(&[
        "-X",
        "POST",
        "--data-binary",
        &at_file("huge"),
        &at("/blobs"),
    ]);
    assert_eq!(
        (c, json(&b)["error"]["code"].as_str().unwrap()),
        (413, "body_too_large")
    );
    let (c, b) = curl(&[
        "-X",
        "POST",
        "-H",
        "Transfer-Encoding: chunked",
        "--data-binary",
        &at_file("huge"),
        &at("/blobs"),
    ]);
    assert_eq!(
        (c, json(&b)["error"]["code"].as_str().unwrap()),
        (413, "body_too_large"),
        "chunked"
    );
    let (c, _) = curl(&[&at(&format!("/blobs/{}", b3(&blob(2_100_000, 2))))]);
    assert_eq!(c, 404, "nothing of an oversized body was stored");

    let log = s.log();
    assert!(!log.contains("panicked"), "{log}");
    assert!(log.contains("alkblobs::access"), "an access log: {log}");
    assert!(log.contains("loopback clients only"), "{log}");
    let (status, log) = s.stop();
    assert!(status.success(), "{status}: {log}");
}

/// `GET /blobs/{key}/bao`: the verified-streaming encoding of a range,
/// which `alkblobs::bao::decode` checks against the key — for ranges of
/// every form, a kv-tier blob, a blob whose outboard file is gone (the
/// server computes one), and never for bad bytes: a blob damaged on disk
/// cuts the response short and the client's decode fails.
#[test]
fn curl_fetches_bao_encodings_that_decode_to_the_range() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let s = Served::start(d, &[]);
    let big = blob(1_500_000, 3);
    let small = b"a small blob, in the kv tier".to_vec();
    for (name, bytes) in [("big", &big), ("small", &small)] {
        std::fs::write(d.join(name), bytes).unwrap();
        let (c, _) = curl(&[
            "-X",
            "POST",
            "--data-binary",
            &format!("@{}", d.join(name).display()),
            &format!("{}/blobs", s.url),
        ]);
        assert_eq!(c, 201);
    }
    let headers = d.join("headers");
    let fetch = |bytes: &[u8], q: &str| -> (u16, Vec<u8>, String) {
        let url = format!("{}/blobs/{}/bao{q}", s.url, b3(bytes));
        let (c, body) = curl(&["-D", headers.to_str().unwrap(), &url]);
        (
            c,
            body,
            std::fs::read_to_string(&headers)
                .unwrap_or_default()
                .to_lowercase(),
        )
    };
    let decode = |bytes: &[u8], r: std::ops::Range<u64>, enc: &[u8]| {
        let key: alkblobs::Key = b3(bytes).parse().unwrap();
        alkblobs::bao::decode(&key, bytes.len() as u64, r, enc)
    };
    let n = big.len() as u64;
    for (q, r) in [
        ("?range=100000-299999", 100_000..300_000),
        ("?range=0-0", 0..1),
        ("?range=1499000-", 1_499_000..n),
        ("?range=-5000", n - 5000..n),
        ("?range=1400000-9999999", 1_400_000..n),
        ("", 0..n),
    ] {
        let (c, enc, h) = fetch(&big, q);
        assert_eq!(c, 200, "{q}: {}", String::from_utf8_lossy(&enc));
        assert!(h.contains("content-type: application/x-bao"), "{h}");
        assert!(h.contains(&format!("alkblobs-size: {n}")), "{h}");
        let said = format!("alkblobs-range: bytes {}-{}/{n}", r.start, r.end - 1);
        assert!(h.contains(&said), "{q}: {h}");
        let got = decode(&big, r.clone(), &enc).unwrap();
        assert!(
            got[..] == big[r.start as usize..r.end as usize],
            "{q}: other bytes"
        );
        // The encoding is the range and its proof, not much more: the
        // pairs of a 1.5 MB blob are 6 KiB.
        assert!(
            (enc.len() as u64) < (r.end - r.start) + 3 * 16384 + 8192,
            "{q}: {}",
            enc.len()
        );
    }
    let (c, enc, _) = fetch(&small, "?range=2-9");
    assert_eq!(c, 200);
    assert_eq!(&decode(&small, 2..10, &enc).unwrap()[..], &small[2..10]);
    // Refusals, each a 4xx with its code.
    for (bytes, q, code, err) in [
        (&big, "?range=1500000-", 416, "range_not_satisfiable"),
        (&big, "?range=oops", 400, "bad_range"),
        (&big, "?range=9-3", 400, "bad_range"),
        (&b"absent".to_vec(), "", 404, "not_found"),
    ] {
        let (c, b, _) = fetch(bytes, q);
        assert_eq!(
            (c, json(&b)["error"]["code"].as_str().unwrap()),
            (code, err),
            "{q}"
        );
    }
    // The outboard file gone: the server computes one.
    let k = b3(&big);
    let blob_file = d.join("data/large/blobs").join(&k[..2]).join(&k);
    let ob_file = blob_file.with_extension("obao");
    let ob = std::fs::read(&ob_file).expect("the local engine keeps the outboard beside the blob");
    std::fs::remove_file(&ob_file).unwrap();
    let (c, enc, _) = fetch(&big, "?range=700000-700999");
    assert_eq!(c, 200);
    assert_eq!(
        &decode(&big, 700_000..701_000, &enc).unwrap()[..],
        &big[700_000..701_000]
    );
    // A byte of the blob flipped on disk (its outboard back): the stream
    // is cut before the bad group (how much of what came before arrives
    // depends on when the connection is aborted), and what came cannot be
    // decoded as the whole.
    std::fs::write(&ob_file, &ob).unwrap();
    let mut bad = std::fs::read(&blob_file).unwrap();
    bad[1_000_000] ^= 1;
    std::fs::write(&blob_file, &bad).unwrap();
    let (c, enc, _) = fetch(&big, "");
    assert_eq!(c, 200, "the answer had begun");
    assert!(
        enc.len() < 1_000_000,
        "sent past the bad group: {}",
        enc.len()
    );
    let e = decode(&big, 0..n, &enc).unwrap_err();
    assert_eq!(e.kind(), alkblobs::ErrorKind::Corrupt, "{e}");
    // Without the outboard, a computed one does not match the key: the
    // answer is refused whole.
    std::fs::remove_file(&ob_file).unwrap();
    let (c, b, _) = fetch(&big, "?range=0-9");
    assert_eq!(
        (c, json(&b)["error"]["code"].as_str().unwrap()),
        (500, "corrupt")
    );
    // An outboard of several windows (a 20 MiB blob's: 80 KiB), whole
    // and by a range across a window's edge.
    let huge = blob(20 << 20, 5);
    std::fs::write(d.join("huge"), &huge).unwrap();
    let hk = b3(&huge);
    let (c, _) = curl(&[
        "-X",
        "PUT",
        "--data-binary",
        &format!("@{}", d.join("huge").display()),
        &format!("{}/blobs/{hk}", s.url),
    ]);
    assert_eq!(c, 201);
    let (_, ob) = alkblobs::outboard::of(&huge);
    let (c, got) = curl(&[&format!("{}/blobs/{hk}/outboard", s.url)]);
    assert_eq!(c, 200);
    assert!(
        got == ob,
        "the whole outboard, {} of {} bytes",
        got.len(),
        ob.len()
    );
    let (c, got) = curl(&[
        "-r",
        "65000-66000",
        &format!("{}/blobs/{hk}/outboard", s.url),
    ]);
    assert_eq!(c, 206);
    assert!(
        got[..] == ob[65000..66001],
        "a range across a window's edge"
    );
    let (_, log) = s.stop();
    assert!(!log.contains("panicked"), "{log}");
}

/// The pins held for clients are bounded: a put past `--max-held-pins`
/// is refused before its body is read (503 `pins_full`, `Retry-After`,
/// nothing stored), and a released pin makes room.
#[test]
fn held_pins_are_bounded_and_a_release_makes_room() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let s = Served::start(d, &["--max-held-pins", "2"]);
    let post = |body: &str| {
        std::fs::write(d.join("body"), body).unwrap();
        let (c, b) = curl(&[
            "-D",
            d.join("h").to_str().unwrap(),
            "--data-binary",
            &format!("@{}", d.join("body").display()),
            &format!("{}/blobs", s.url),
        ]);
        let h = std::fs::read_to_string(d.join("h")).unwrap().to_lowercase();
        (c, json(&b), h)
    };
    let (c1, first, _) = post("first");
    let (c2, _, _) = post("second");
    assert_eq!((c1, c2), (201, 201));
    let (c, refused, h) = post("third");
    assert_eq!(
        (c, refused["error"]["code"].as_str().unwrap()),
        (503, "pins_full")
    );
    assert!(h.contains("retry-after: 60"), "{h}");
    let (c, _) = curl(&[&format!("{}/blobs/{}", s.url, b3(b"third"))]);
    assert_eq!(c, 404, "the refused put stored nothing");
    let release = first["pin"]["release"].as_str().unwrap();
    let (c, _) = curl(&["-X", "DELETE", &format!("{}{release}", s.url)]);
    assert_eq!(c, 204);
    assert_eq!(post("third").0, 201, "a release made room");
}

#[test]
fn slow_clients_are_cut_off_with_a_4xx_and_others_are_still_served() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let s = Served::start(d, &["--idle-timeout", "1s"]);
    let addr = s.url.trim_start_matches("http://").to_owned();
    // Headers that never finish.
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    slow.write_all(b"GET /blobs/").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    let _ = slow.read_to_end(&mut got);
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "the slow header was cut off"
    );
    let text = String::from_utf8_lossy(&got);
    assert!(got.is_empty() || text.starts_with("HTTP/1.1 408"), "{text}");
    // A body that stops halfway: 408, nothing stored.
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    slow.write_all(b"POST /blobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
        .unwrap();
    slow.write_all(&[7u8; 5000]).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut got = vec![0u8; 4096];
    let n = slow.read(&mut got).unwrap_or(0);
    let text = String::from_utf8_lossy(&got[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("body_timeout"), "{text}");
    // Meanwhile and after, others are served.
    let (c, _) = curl(&[
        "-X",
        "POST",
        "--data-binary",
        "hello",
        &format!("{}/blobs", s.url),
    ]);
    assert_eq!(c, 201);
    let (status, log) = s.stop();
    assert!(status.success());
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn tokens_grant_read_or_write_and_tls_serves_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(
        d.join("tokens"),
        "# who may do what\nreader-token-0123456789 read\nwriter-token-0123456789 write\n",
    )
    .unwrap();
    self_signed_cert(d);
    let tokens = d.join("tokens").display().to_string();
    let (cert, key) = (
        d.join("cert.pem").display().to_string(),
        d.join("key.pem").display().to_string(),
    );
    let s = Served::start(
        d,
        &[
            "--token-file",
            &tokens,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ],
    );
    assert!(s.url.starts_with("https://"), "{}", s.url);
    let tls = ["--cacert", cert.as_str()];
    let at = format!("{}/blobs", s.url);
    let bearer = |t: &str| format!("Authorization: Bearer {t}");
    let put = |t: Option<&str>| {
        let mut a: Vec<String> = tls.iter().map(|s| s.to_string()).collect();
        if let Some(t) = t {
            a.extend(["-H".into(), bearer(t)]);
        }
        a.extend([
            "-X".into(),
            "POST".into(),
            "--data-binary".into(),
            "over tls".into(),
            at.clone(),
        ]);
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        curl(&refs)
    };
    let (c, b) = put(None);
    assert_eq!(
        (c, json(&b)["error"]["code"].as_str().unwrap()),
        (401, "unauthorized")
    );
    assert_eq!(put(Some("wrong-token-0123456789")).0, 401);
    let (c, b) = put(Some("reader-token-0123456789"));
    assert_eq!(
        (c, json(&b)["error"]["code"].as_str().unwrap()),
        (403, "forbidden")
    );
    let (c, b) = put(Some("writer-token-0123456789"));
    assert_eq!(c, 201, "{}", String::from_utf8_lossy(&b));
    let url = format!("{at}/{}", b3(b"over tls"));
    let o = Command::new("curl")
        .args([
            "-sI",
            "--cacert",
            &cert,
            "-H",
            &bearer("reader-token-0123456789"),
            &url,
        ])
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&o.stdout).to_lowercase();
    assert!(
        head.contains("cache-control: private"),
        "a token's reads are not for shared caches: {head}"
    );
    let (c, b) = curl(&[
        "--cacert",
        &cert,
        "-H",
        &bearer("reader-token-0123456789"),
        &url,
    ]);
    assert_eq!((c, b.as_slice()), (200, &b"over tls"[..]));
    assert_eq!(
        curl(&["--cacert", &cert, &url]).0,
        401,
        "reads need a token too"
    );
    // Plain HTTP to the TLS port is not served.
    let (c, _) = curl(&[&url.replace("https://", "http://")]);
    assert!(c == 0 || (400..500).contains(&c), "{c}");
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn a_non_loopback_client_without_tokens_is_refused() {
    // The server binds every address; a client reaching it through this
    // machine's non-loopback address is refused (403), loopback served.
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let host = Command::new("hostname").arg("-I").output().unwrap();
    let ip = String::from_utf8_lossy(&host.stdout)
        .split_whitespace()
        .find(|a| !a.starts_with("127.") && !a.contains(':'))
        .map(str::to_owned)
        .expect("a non-loopback IPv4 address on this machine");
    let mut child = Command::new(BIN)
        .args(["serve", "--create", "--listen", "0.0.0.0:0"])
        .env("ALKBLOBS_DATA_DIR", d.join("data"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = child.stdout.take().unwrap();
    let mut b = [0u8; 1];
    while out.read(&mut b).unwrap() == 1 && b[0] != b'\n' {
        line.push(b[0] as char);
    }
    let port = line.rsplit(':').next().unwrap().to_owned();
    let (c, b) = curl(&[&format!("http://{ip}:{port}/blobs/{}", "0".repeat(64))]);
    assert_eq!(
        (c, json(&b)["error"]["code"].as_str().unwrap()),
        (403, "loopback_only")
    );
    let (c, _) = curl(&[&format!("http://127.0.0.1:{port}/blobs/{}", "0".repeat(64))]);
    assert_eq!(c, 404, "loopback is served");
    let _ = child.kill();
    let _ = child.wait();
}

/// Reads what `s` sends until the server closes it or `limit` passes;
/// (bytes, whether the server closed it within the limit).
fn drain(s: &mut std::net::TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let until = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (got, false);
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return (got, false);
            }
            // Reset by the server: closed.
            Err(_) => return (got, true),
        }
    }
}

/// A hostile client over raw sockets: connections that send nothing, half
/// an HTTP/2 preface or a whole one (h2c is not served: the preface is a
/// malformed HTTP/1 request), or that finish nothing of a TLS handshake,
/// are cut off after the idle cut-off; past `--max-connections` the
/// server accepts nobody until one closes, then serves again.
#[test]
fn silent_and_h2c_connections_are_cut_off_and_their_number_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let s = Served::start(d, &["--idle-timeout", "2s", "--max-connections", "4"]);
    let addr = s.url.trim_start_matches("http://").to_owned();
    let mut held: Vec<std::net::TcpStream> = (0..4)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    held[1].write_all(b"GET /blobs HTTP/1.1\r\nHo").unwrap();
    // The fifth waits in the backlog: not served while the four are open.
    let (c, _) = curl(&["--max-time", "1", &format!("{}/blobs", s.url)]);
    assert_eq!(c, 0, "served past --max-connections");
    for (i, h) in held.iter_mut().enumerate() {
        let (got, closed) = drain(h, Duration::from_secs(15));
        assert!(closed, "connection {i} was not cut off");
        let text = String::from_utf8_lossy(&got);
        assert!(
            got.is_empty() || text.starts_with("HTTP/1.1 4") || text.starts_with("HTTP/1.1 5"),
            "connection {i}: {text}"
        );
    }
    let (c, _) = curl(&[&format!("{}/blobs", s.url)]);
    assert_eq!(c, 200, "served again once the silent ones were cut");
    // HTTP/2 cleartext: half a preface waits for the rest no longer than
    // any other request line; a whole one is refused and closed at once.
    for (name, bytes) in [
        ("half a preface", &b"PRI * HTTP/2.0\r\n"[..]),
        ("a preface", &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..]),
    ] {
        let mut h = std::net::TcpStream::connect(&addr).unwrap();
        h.write_all(bytes).unwrap();
        let (got, closed) = drain(&mut h, Duration::from_secs(15));
        let text = String::from_utf8_lossy(&got);
        assert!(closed, "{name}: not cut off");
        assert!(!text.contains("HTTP/2"), "{name}: answered as h2c: {text}");
    }
    let (status, log) = s.stop();
    assert!(status.success() && !log.contains("panicked"), "{log}");

    // Over TLS: a client that connects and sends nothing, or a TLS
    // ClientHello and then nothing more, is cut off too.
    self_signed_cert(d);
    let (cert, key) = (
        d.join("cert.pem").display().to_string(),
        d.join("key.pem").display().to_string(),
    );
    let s = Served::start(
        d,
        &[
            "--idle-timeout",
            "2s",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ],
    );
    let addr = s.url.trim_start_matches("https://").to_owned();
    let mut silent = std::net::TcpStream::connect(&addr).unwrap();
    // A ClientHello's first bytes (a TLS record header and part of it).
    let mut partial = std::net::TcpStream::connect(&addr).unwrap();
    partial
        .write_all(&[
            0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
        ])
        .unwrap();
    for (name, c) in [("silent", &mut silent), ("partial hello", &mut partial)] {
        let (_, closed) = drain(c, Duration::from_secs(15));
        assert!(closed, "a {name} TLS client was not cut off");
    }
    let (status, log) = s.stop();
    assert!(status.success() && !log.contains("panicked"), "{log}");
}

/// `--max-concurrency` is one limit for the whole server, and an upload
/// trickled under the minimum rate ends (408) instead of holding its slot
/// for ever: two trickling uploads hold both slots of a server for a
/// while — a GET waits too — and once they are cut off every method is
/// served again.
#[test]
fn trickling_uploads_end_and_the_concurrency_limit_is_the_servers() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let s = Served::start(d, &["--idle-timeout", "3s", "--max-concurrency", "2"]);
    let addr = s.url.trim_start_matches("http://").to_owned();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickles: Vec<_> = (0..2)
        .map(|_| {
            let addr = addr.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut c = std::net::TcpStream::connect(&addr).unwrap();
                c.write_all(b"POST /blobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
                    .unwrap();
                // A byte every half second, for up to 60 s: only the
                // minimum rate ends it (each byte beats the idle cut-off).
                let mut cut = false;
                for _ in 0..120 {
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    if c.write_all(b"x").is_err() {
                        cut = true;
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
                let (got, _) = drain(&mut c, Duration::from_secs(5));
                let answer = String::from_utf8_lossy(&got).into_owned();
                // Cut off while it was still trickling: its writes failed.
                assert!(cut, "the trickle was never cut off: {answer}");
                answer
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // Both slots are taken: a GET waits (a per-route limit served it).
    let (c, _) = curl(&["--max-time", "1", &format!("{}/blobs", s.url)]);
    assert_eq!(
        c, 0,
        "a GET was served while the server's two slots were taken"
    );
    for t in trickles {
        let answer = t.join().unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 408") && answer.contains("body_timeout"),
            "{answer}"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (c, _) = curl(&[
        "-X",
        "POST",
        "--data-binary",
        "after the trickles",
        &format!("{}/blobs", s.url),
    ]);
    assert_eq!(c, 201);
    let (status, log) = s.stop();
    assert!(status.success() && !log.contains("panicked"), "{log}");
}

/// A client that stops reading a GET is cut off once the server's writes
/// have made no progress for the idle cut-off (its buffers full).
#[test]
fn a_client_that_stops_reading_is_cut_off() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let s = Served::start(d, &["--idle-timeout", "1s"]);
    let big = blob(48 << 20, 3);
    std::fs::write(d.join("big"), &big).unwrap();
    let at = format!("{}/blobs/{}", s.url, b3(&big));
    let (c, _) = curl(&[
        "-X",
        "PUT",
        "--data-binary",
        &format!("@{}", d.join("big").display()),
        &at,
    ]);
    assert_eq!(c, 201);
    let addr = s.url.trim_start_matches("http://").to_owned();
    let mut c = std::net::TcpStream::connect(&addr).unwrap();
    c.write_all(format!("GET /blobs/{} HTTP/1.1\r\nHost: x\r\n\r\n", b3(&big)).as_bytes())
        .unwrap();
    // Read nothing for a while: the server's writes stall.
    std::thread::sleep(Duration::from_secs(6));
    let (got, closed) = drain(&mut c, Duration::from_secs(15));
    assert!(closed, "the connection was not cut off");
    assert!(
        got.len() < big.len(),
        "the whole blob was sent: {}",
        got.len()
    );
    // Others are served.
    let (c, b) = curl(&["-r", "0-9", &at]);
    assert_eq!((c, b.as_slice()), (206, &big[..10]));
    let (status, log) = s.stop();
    assert!(status.success() && !log.contains("panicked"), "{log}");
}

/// A client that reads a response, but slower than `--min-download-rate`,
/// is cut off once the server has waited on it for the idle cut-off in
/// all, though the server's writes make progress more often than that
/// (the idle cut-off alone never ends it); one that reads faster than the
/// minimum gets the whole blob.
#[test]
fn a_client_reading_slower_than_the_minimum_download_rate_is_cut_off() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    // 4 MiB/s at least, waits of 3 s at most.
    let s = Served::start(
        d,
        &["--idle-timeout", "3s", "--min-download-rate", "4194304"],
    );
    let addr = s.url.trim_start_matches("http://").to_owned();
    let big = blob(48 << 20, 4);
    let f = d.join("big");
    std::fs::write(&f, &big).unwrap();
    let at = format!("{}/blobs/{}", s.url, b3(&big));
    let (c, _) = curl(&[
        "-X",
        "PUT",
        "--data-binary",
        &format!("@{}", f.display()),
        &at,
    ]);
    assert_eq!(c, 201);
    // About 1 MiB/s (64 KiB every 60 ms): a quarter of the minimum. The
    // socket buffers hold several MiB, so the cut shows once they are
    // read; the whole blob would take 48 s.
    let mut c = std::net::TcpStream::connect(&addr).unwrap();
    c.write_all(format!("GET /blobs/{} HTTP/1.1\r\nHost: x\r\n\r\n", b3(&big)).as_bytes())
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let until = Instant::now() + Duration::from_secs(40);
    let (mut got, mut closed) = (0usize, false);
    let mut buf = vec![0u8; 64 << 10];
    while Instant::now() < until {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => {
                closed = true;
                break;
            }
            Ok(n) => got += n,
        }
        std::thread::sleep(Duration::from_millis(60));
    }
    assert!(
        closed,
        "a reader at a quarter of the minimum rate was not cut off in 40 s ({got} bytes read)"
    );
    assert!(got < big.len(), "the whole blob was sent");
    // 12 MiB/s, three times the minimum: the whole blob.
    let out = Command::new("curl")
        .args(["-sS", "--limit-rate", "12M", "-o"])
        .arg(d.join("back"))
        .args(["-w", "%{http_code}", &at])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    assert!(
        std::fs::read(d.join("back")).unwrap() == big,
        "a reader above the minimum rate got less than the blob"
    );
    let (status, log) = s.stop();
    assert!(status.success() && !log.contains("panicked"), "{log}");
}

/// One client address holds at most `--max-connections-per-client`
/// connections: its further ones are closed as they come, so it cannot
/// fill `--max-connections`, and another address is still served.
#[test]
fn one_client_address_cannot_hold_every_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let s = Served::start(
        d,
        &[
            "--idle-timeout",
            "20s",
            "--max-connections",
            "4",
            "--max-connections-per-client",
            "2",
        ],
    );
    let addr = s.url.trim_start_matches("http://").to_owned();
    let _held: Vec<std::net::TcpStream> = (0..2)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..3 {
        let mut more = std::net::TcpStream::connect(&addr).unwrap();
        let _ = more.write_all(b"GET /blobs HTTP/1.1\r\nHost: x\r\n\r\n");
        let (got, closed) = drain(&mut more, Duration::from_secs(5));
        assert!(
            closed && got.is_empty(),
            "connection {} of one address was served: {}",
            i + 3,
            String::from_utf8_lossy(&got)
        );
    }
    // Another address (127.0.0.2, loopback too) is served beside them.
    let (c, _) = curl(&[
        "--interface",
        "127.0.0.2",
        "--max-time",
        "5",
        &format!("{}/blobs", s.url),
    ]);
    assert_eq!(c, 200, "another client was not served");
    let (status, log) = s.stop();
    assert!(status.success() && !log.contains("panicked"), "{log}");
}

/// What HTTP/1.1 leaves ambiguous is refused with a reason, and what it
/// allows is accepted: a lower-case `bearer` scheme, a HEAD answered 304
/// without a length of 0, two Host headers (400), a transfer coding other
/// than chunked (501), a method a route does not serve (405 with a code).
#[test]
fn ambiguous_requests_are_refused_with_reasons() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(d.join("tokens"), "writer-token-0123456789 write\n").unwrap();
    let tokens = d.join("tokens").display().to_string();
    let s = Served::start(d, &["--token-file", &tokens]);
    let (c, b) = curl(&[
        "-H",
        "Authorization: bearer writer-token-0123456789",
        "-X",
        "POST",
        "--data-binary",
        "lower-case scheme",
        &format!("{}/blobs", s.url),
    ]);
    assert_eq!(c, 201, "{}", String::from_utf8_lossy(&b));
    let key = b3(b"lower-case scheme");
    let o = Command::new("curl")
        .args([
            "-sI",
            "-H",
            "Authorization: Bearer writer-token-0123456789",
            "-H",
            &format!("If-None-Match: \"{key}\""),
            &format!("{}/blobs/{key}", s.url),
        ])
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&o.stdout).to_lowercase();
    assert!(head.starts_with("http/1.1 304"), "{head}");
    assert!(!head.contains("content-length: 0"), "{head}");
    let addr = s.url.trim_start_matches("http://").to_owned();
    let raw = |req: &str| -> String {
        let mut c = std::net::TcpStream::connect(&addr).unwrap();
        c.write_all(req.as_bytes()).unwrap();
        let (got, _) = drain(&mut c, Duration::from_secs(10));
        String::from_utf8_lossy(&got).into_owned()
    };
    let auth = "Authorization: Bearer writer-token-0123456789\r\n";
    let two_hosts = raw(&format!(
        "GET /blobs HTTP/1.1\r\nHost: a\r\nHost: b\r\n{auth}Connection: close\r\n\r\n"
    ));
    assert!(two_hosts.starts_with("HTTP/1.1 400"), "{two_hosts}");
    let gzip = raw(&format!(
        "POST /blobs HTTP/1.1\r\nHost: a\r\n{auth}Transfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    ));
    assert!(gzip.starts_with("HTTP/1.1 501"), "{gzip}");
    assert!(gzip.contains("unsupported_transfer_coding"), "{gzip}");
    // Chunked twice: hyper decodes one layer, the body would be stored
    // still chunk-encoded.
    let twice = raw(&format!(
        "POST /blobs HTTP/1.1\r\nHost: a\r\n{auth}Transfer-Encoding: chunked, chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    ));
    assert!(
        twice.starts_with("HTTP/1.1 501") || twice.starts_with("HTTP/1.1 400"),
        "{twice}"
    );
    let (c, b) = curl(&[
        "-X",
        "DELETE",
        "-H",
        "Authorization: Bearer writer-token-0123456789",
        &format!("{}/blobs", s.url),
    ]);
    assert_eq!(c, 405);
    assert_eq!(json(&b)["error"]["code"], "method_not_allowed");
    let (status, log) = s.stop();
    assert!(status.success() && !log.contains("panicked"), "{log}");
}
