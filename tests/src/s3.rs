//! The test S3 server's coordinates: `scripts/s3-server.sh start` prints
//! them and `scripts/test.sh` puts them in the environment. Every test
//! works under a prefix of its own in the one bucket, so tests run in
//! parallel and a rerun never meets an earlier run's objects.

use std::sync::atomic::{AtomicU64, Ordering};

use alkblobs::backend::s3::{S3Location, S3Options};

/// The test bucket (`ALKBLOBS_S3_BUCKET`). Panics without one: an s3 test
/// never skips.
pub fn bucket() -> String {
    std::env::var("ALKBLOBS_S3_BUCKET").expect(
        "ALKBLOBS_S3_BUCKET is not set: start the test S3 server with \
         `env $(scripts/s3-server.sh start) cargo test …` (scripts/test.sh does)",
    )
}

/// A fresh prefix in the test bucket, named after `tag`.
pub fn location(tag: &str) -> S3Location {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let prefix = format!(
        "t/{tag}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    S3Location::new(&bucket(), &prefix).expect("a valid test location")
}

/// Options for a fresh prefix: the smallest part S3 allows (5 MiB), so
/// the suites' 8 MiB values take the multipart path.
pub fn options(tag: &str) -> S3Options {
    S3Options::new(location(tag)).part_size(5 << 20)
}

/// The test server's control script (`ALKBLOBS_S3_SERVER`), for the fault
/// tests that kill and restart it.
pub fn server_script() -> String {
    std::env::var("ALKBLOBS_S3_SERVER").expect("ALKBLOBS_S3_SERVER is not set")
}

/// A fresh s3 pool of the test database (`alkblobs_tests::pg`): window 0,
/// pin TTL `ttl`, at a fresh location; fleet unless `single_instance`.
#[cfg(feature = "pg")]
pub async fn pool(tag: &str, ttl: &str, single_instance: bool) -> (String, S3Location) {
    let c = crate::pg::connect().await;
    crate::pg::ensure_extension(&c).await;
    let name = crate::pg::unique(tag);
    let loc = location(tag);
    c.execute(
        "SELECT alkblobs_create_pool($1, '0 seconds', $2::text::interval, 's3', single_instance => $3, large_location => $4)",
        &[&name, &ttl, &single_instance, &loc.to_string()],
    )
    .await
    .expect("create an s3 pool");
    (name, loc)
}

/// What the test proxy (`slow_proxy`) does to what it relays: a service
/// (or a link to it) that is slow or answers late in one precise way.
#[derive(Clone)]
pub enum Slow {
    /// Holds back, for the delay, every chunk a client sends that carries
    /// the needle (e.g. `partNumber=`: a slow link for multipart parts
    /// only, while a marker's touch or a sweep's listing passes).
    Sends(&'static [u8], std::time::Duration),
    /// While the flag is set, holds the answer to every GET whose request
    /// carries the needle until the flag is cleared (a service answering
    /// late); counts the answers it held.
    Answers(
        &'static [u8],
        std::sync::Arc<std::sync::atomic::AtomicBool>,
        std::sync::Arc<std::sync::atomic::AtomicU64>,
    ),
    /// The first delete (a `DELETE`, or a bulk `POST ?delete` as
    /// `object_store` sends) whose request carries the needle is kept, never
    /// sent, and answered 503 (the connection then closed), so the client
    /// retries it; the kept bytes go to the slot, for `replay`: an attempt
    /// a proxy or load balancer still runs after the client gave up on it.
    KeepFirstDelete(
        &'static [u8],
        std::sync::Arc<std::sync::Mutex<Option<Vec<u8>>>>,
    ),
}

/// Sends `request` (raw HTTP/1.1 bytes kept by `Slow::KeepFirstDelete`)
/// to `target` as it was, and returns the status line of the answer.
pub fn replay(target: std::net::SocketAddr, request: &[u8]) -> String {
    use std::io::{BufRead, Write};
    let mut s = std::net::TcpStream::connect(target).expect("connect to replay");
    s.write_all(request).expect("replay the request");
    let mut line = String::new();
    std::io::BufReader::new(s)
        .read_line(&mut line)
        .expect("the replayed request's answer");
    line.trim_end().to_owned()
}

/// A TCP proxy to `target` (in threads) that slows what `slow` names.
pub fn slow_proxy(target: std::net::SocketAddr, slow: Slow) -> std::net::SocketAddr {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering::SeqCst;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            let Ok(server) = std::net::TcpStream::connect(target) else {
                continue;
            };
            // The next answer on this connection is to be held.
            let pending = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (mut back_to, mut back_from) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (back_slow, back_pending) = (slow.clone(), pending.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = match back_from.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if let Slow::Answers(_, hold, held) = &back_slow
                        && back_pending.swap(false, SeqCst)
                    {
                        held.fetch_add(1, SeqCst);
                        while hold.load(SeqCst) {
                            std::thread::sleep(std::time::Duration::from_millis(20));
                        }
                    }
                    if back_to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = back_to.shutdown(std::net::Shutdown::Both);
            });
            let slow = slow.clone();
            std::thread::spawn(move || {
                let (mut from, mut to) = (client, server);
                let mut buf = vec![0u8; 64 << 10];
                let carries =
                    |b: &[u8], needle: &[u8]| b.windows(needle.len()).any(|w| w == needle);
                loop {
                    let n = match from.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    match &slow {
                        Slow::Sends(needle, delay) if carries(&buf[..n], needle) => {
                            std::thread::sleep(*delay)
                        }
                        Slow::Answers(needle, hold, _)
                            if hold.load(SeqCst)
                                && buf[..n].starts_with(b"GET ")
                                && carries(&buf[..n], needle) =>
                        {
                            pending.store(true, SeqCst)
                        }
                        Slow::KeepFirstDelete(needle, slot)
                            if (buf[..n].starts_with(b"DELETE ")
                                || (buf[..n].starts_with(b"POST ")
                                    && carries(&buf[..n], b"?delete")))
                                && slot.lock().unwrap().is_none() =>
                        {
                            // The whole request: its headers, then as many
                            // bytes of body as they announce (a bulk
                            // DeleteObjects names the keys in its body).
                            let mut req = buf[..n].to_vec();
                            loop {
                                if let Some(end) = req.windows(4).position(|w| w == b"\r\n\r\n") {
                                    let head =
                                        String::from_utf8_lossy(&req[..end]).to_ascii_lowercase();
                                    let len = head
                                        .lines()
                                        .find_map(|l| l.strip_prefix("content-length:"))
                                        .and_then(|v| v.trim().parse::<usize>().ok())
                                        .unwrap_or(0);
                                    if req.len() >= end + 4 + len {
                                        break;
                                    }
                                }
                                match from.read(&mut buf) {
                                    Ok(0) | Err(_) => break,
                                    Ok(m) => req.extend_from_slice(&buf[..m]),
                                }
                            }
                            if !carries(&req, needle) {
                                if to.write_all(&req).is_err() {
                                    break;
                                }
                                continue;
                            }
                            *slot.lock().unwrap() = Some(req);
                            let _ = from.write_all(
                                b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                            );
                            let _ = from.shutdown(std::net::Shutdown::Both);
                            break;
                        }
                        _ => {}
                    }
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = to.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    addr
}

/// The test S3 server's address (`AWS_ENDPOINT_URL`), for a proxy to it.
pub fn s3_server_addr() -> std::net::SocketAddr {
    let endpoint =
        std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL (scripts/test.sh sets it)");
    endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap()
}
