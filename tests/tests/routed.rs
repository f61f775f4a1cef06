//! The `routed` large engine against a real `alkblobs serve` (in process,
//! on loopback): the engine and store conformance cases that do not
//! delete (deletion is the storage node's), and a lying storage node —
//! a flipped byte, a truncated body, another blob's bytes, a wrong
//! outboard, a cut transfer — caught by the client at the right offset,
//! in its verified streams (`/bao`) as in its raw ranges.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use alkblobs::backend::local::{LocalBackend, LocalOptions};
use alkblobs::backend::mem::MemBackend;
use alkblobs::backend::routed::{RoutedBackend, RoutedOptions};
use alkblobs::backend::{Backend, LargeBackend};
use alkblobs::conformance::backend::Caps;
use alkblobs::serve::{ServeOptions, Server};
use alkblobs::{Error, Key, Store};
use alkblobs_tests::data;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tokio::io::AsyncReadExt;

const CAPS: Caps = Caps {
    max_value: 8 << 20,
    list_keys: 3_000,
};

/// A storage node: a store over a local large tier, served on loopback.
async fn node() -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::builder()
        .kv(MemBackend::new())
        .large(
            LocalBackend::open(dir.path(), LocalOptions::default())
                .await
                .unwrap(),
        )
        .build()
        .unwrap();
    let server = alkblobs::serve::start(store, ServeOptions::new("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    (server, dir)
}

async fn routed_to(addr: SocketAddr) -> RoutedBackend {
    RoutedBackend::open(RoutedOptions::new(format!("http://{addr}")))
        .await
        .unwrap()
}

alkblobs::backend_suite!(@cases CAPS, async {
    let (server, dir) = node().await;
    (routed_to(server.addr()).await, (server, dir))
}, dyn alkblobs::backend::Backend;
    round_trips, put_is_immutable, missing_keys, ranges_at_edges,
    list_is_sorted_and_complete, big_listing, concurrent_puts_of_one_key,
    usage_matches_contents);
alkblobs::backend_suite!(@cases CAPS, async {
    let (server, dir) = node().await;
    (routed_to(server.addr()).await, (server, dir))
}, dyn alkblobs::backend::LargeBackend;
    streaming_writes, streaming_reads, large_missing_keys, large_ranges_at_edges);

/// A kv-only store whose large tier is routed to a node: the store cases
/// that do not collect.
mod store_over_routed {
    use super::*;
    use alkblobs::conformance::store::Config;
    const CFG: Config = Config {
        kv_only: false,
        big: 20 << 20,
        list_keys: 2_000,
    };
    alkblobs::store_suite!(@cases CFG, async {
        let (server, dir) = node().await;
        let s = Store::builder()
            .kv(MemBackend::new())
            .large(routed_to(server.addr()).await)
            .single_instance()
            .build()
            .unwrap();
        (s, (server, dir))
    }; round_trips_at_the_edges, dedup, stat_and_missing, ranges_in_both_tiers,
        streaming_puts, verified_reads, put_verified_refuses_mismatch, batched_puts,
        list_is_a_union_without_duplicates, verified_ranges);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_is_refused_and_outboards_come_from_the_node() {
    let (server, _dir) = node().await;
    let e = routed_to(server.addr()).await;
    let v = data(3, 300_000);
    let (key, ob) = alkblobs::outboard::of(&v);
    e.put(&key, Bytes::from(v.clone())).await.unwrap();
    assert!(matches!(e.delete(&key).await, Err(Error::ReadOnly { .. })));
    assert!(e.has(&key).await.unwrap(), "nothing deleted");
    // The node computed the outboard at the put.
    let got = e
        .read_outboard(&key, 0, ob.len() as u64)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, ob);
    assert!(e.put_outboard(&key, Bytes::from(ob.clone())).await.unwrap());
    assert!(
        !e.put_outboard(&Key::of(b"absent"), Bytes::from(ob))
            .await
            .unwrap()
    );
    // A put of bytes under another key stores nothing there.
    match e.put(&Key::of(b"claimed"), Bytes::from(v)).await {
        Err(Error::HashMismatch { .. }) => {}
        other => panic!("a mismatched put: {other:?}"),
    }
    assert!(!e.has(&Key::of(b"claimed")).await.unwrap());
}

/// What the lying node does to what it sends.
#[derive(Debug, Clone, Default)]
enum Lie {
    #[default]
    None,
    Flip(u64),
    Truncate(usize),
    Other(Bytes),
    Outboard(Bytes),
    /// Another blob's bytes with its own outboard: consistent, wrong key.
    OtherWithOutboard(Bytes, Bytes),
    /// Fails this many requests with a dropped connection, then serves.
    Cut(usize),
    /// Sends this many bytes more than asked for.
    Longer(usize),
    /// Claims a size far beyond what it holds.
    Huge,
}

#[derive(Clone)]
struct Liar {
    key: Key,
    blob: Bytes,
    outboard: Bytes,
    lie: Arc<Mutex<Lie>>,
    /// Requests per route: "bao", "blob", "outboard".
    hits: Arc<Mutex<std::collections::HashMap<&'static str, usize>>>,
}

impl Liar {
    fn hit(&self, route: &'static str) {
        *self.hits.lock().unwrap().entry(route).or_default() += 1;
    }

    fn take_hits(&self) -> std::collections::HashMap<&'static str, usize> {
        std::mem::take(&mut *self.hits.lock().unwrap())
    }
}

/// `GET /blobs/{key}/bao?range=A-B`, lying as told: the stream is built
/// from the bytes and outboard it lies with, by bao-tree's encoder (which
/// checks nothing), then cut, lengthened or sent under a claimed size.
async fn liar_bao(
    State(l): State<Liar>,
    Path(key): Path<String>,
    uri: axum::http::Uri,
) -> Response {
    use bao_tree::io::outboard::PostOrderOutboard;
    l.hit("bao");
    if key != l.key.to_string() {
        return (
            StatusCode::NOT_FOUND,
            r#"{"error":{"code":"not_found","message":"no such blob"}}"#,
        )
            .into_response();
    }
    let lie = l.lie.lock().unwrap().clone();
    if let Lie::Cut(n) = lie
        && n > 0
    {
        *l.lie.lock().unwrap() = Lie::Cut(n - 1);
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let real = l.blob.len() as u64;
    let (a, b) = uri
        .query()
        .and_then(|q| q.strip_prefix("range="))
        .and_then(|r| r.split_once('-'))
        .map(|(a, b)| (a.parse::<u64>().unwrap(), b.parse::<u64>().unwrap()))
        .unwrap();
    let range = a..(b + 1).min(real);
    let mut data = match &lie {
        Lie::Other(o) | Lie::OtherWithOutboard(o, _) => o.to_vec(),
        _ => l.blob.to_vec(),
    };
    if let Lie::Flip(at) = lie {
        data[at as usize] ^= 1;
    }
    let ob = match &lie {
        Lie::Outboard(o) | Lie::OtherWithOutboard(_, o) => o.to_vec(),
        _ => l.outboard.to_vec(),
    };
    let outboard = PostOrderOutboard {
        root: bao_tree::blake3::Hash::from_bytes(*l.key.as_bytes()),
        tree: alkblobs::outboard::tree(real),
        data: ob,
    };
    let mut body = Vec::new();
    bao_tree::io::sync::encode_ranges(
        data,
        outboard,
        &alkblobs::bao::chunk_ranges(real, range),
        &mut body,
    )
    .unwrap();
    match lie {
        Lie::Truncate(n) => body.truncate(body.len().saturating_sub(n)),
        Lie::Longer(n) => body.extend(std::iter::repeat_n(7u8, n)),
        _ => {}
    }
    let size = match lie {
        Lie::Huge => 1u64 << 62,
        _ => real,
    };
    (StatusCode::OK, [("alkblobs-size", size.to_string())], body).into_response()
}

fn part(headers: &HeaderMap, len: u64) -> (u64, u64) {
    let r = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.split_once('-'))
        .map(|(a, b)| (a.parse::<u64>().unwrap(), b.parse::<u64>().unwrap()));
    match r {
        Some((a, b)) => (a, b.min(len - 1) + 1),
        None => (0, len),
    }
}

async fn liar_blob(
    State(l): State<Liar>,
    Path(key): Path<String>,
    method: axum::http::Method,
    headers: HeaderMap,
) -> Response {
    l.hit("blob");
    if key != l.key.to_string() {
        return StatusCode::NOT_FOUND.into_response();
    }
    let lie = l.lie.lock().unwrap().clone();
    let size = match lie {
        Lie::Huge => 1 << 62,
        _ => l.blob.len() as u64,
    };
    if method == axum::http::Method::HEAD {
        return ([(header::CONTENT_LENGTH, size.to_string())], StatusCode::OK).into_response();
    }
    if let Lie::Cut(n) = lie
        && n > 0
    {
        *l.lie.lock().unwrap() = Lie::Cut(n - 1);
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let (a, b) = part(&headers, size);
    let b = b.min(l.blob.len() as u64);
    let mut body = match &lie {
        Lie::Other(o) | Lie::OtherWithOutboard(o, _) => o.slice(a as usize..b as usize).to_vec(),
        _ => l.blob.slice(a as usize..b as usize).to_vec(),
    };
    match lie {
        Lie::Flip(at) if (a..b).contains(&at) => body[(at - a) as usize] ^= 1,
        Lie::Truncate(n) => body.truncate(body.len().saturating_sub(n)),
        Lie::Longer(n) => body.extend(std::iter::repeat_n(7u8, n)),
        _ => {}
    }
    (
        StatusCode::PARTIAL_CONTENT,
        [(header::CONTENT_RANGE, format!("bytes {a}-{}/{size}", b - 1))],
        body,
    )
        .into_response()
}

async fn liar_outboard(State(l): State<Liar>, headers: HeaderMap) -> Response {
    l.hit("outboard");
    let ob = match l.lie.lock().unwrap().clone() {
        Lie::Outboard(o) | Lie::OtherWithOutboard(_, o) => o,
        _ => l.outboard.clone(),
    };
    let (a, b) = part(&headers, ob.len() as u64);
    (
        StatusCode::PARTIAL_CONTENT,
        ob.slice(a as usize..b as usize),
    )
        .into_response()
}

async fn liar(blob: Vec<u8>) -> (Liar, SocketAddr) {
    let (key, outboard) = alkblobs::outboard::of(&blob);
    let l = Liar {
        key,
        blob: Bytes::from(blob),
        outboard: Bytes::from(outboard),
        lie: Arc::default(),
        hits: Arc::default(),
    };
    let app = axum::Router::new()
        .route("/blobs", axum::routing::get(|| async { "[]" }))
        .route("/blobs/{key}", axum::routing::get(liar_blob))
        .route("/blobs/{key}/outboard", axum::routing::get(liar_outboard))
        .route("/blobs/{key}/bao", axum::routing::get(liar_bao))
        .with_state(l.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (l, addr)
}

fn corrupt_at(r: alkblobs::Result<Option<Bytes>>) -> u64 {
    match r {
        Err(Error::CorruptAt { offset, .. }) => offset,
        other => panic!("expected CorruptAt, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_node_is_caught_at_the_right_offset() {
    const GROUP: u64 = 16 * 1024;
    let blob = data(9, 2_000_000);
    let (l, addr) = liar(blob.clone()).await;
    let e = routed_to(addr).await;
    let key = l.key;
    let set = |lie: Lie| *l.lie.lock().unwrap() = lie;
    let got = e.read_range(&key, 100_000, 50_000).await.unwrap().unwrap();
    assert!(got == blob[100_000..150_000], "an honest node");
    // One request: the range's verified stream.
    assert_eq!(l.take_hits(), [("bao", 1)].into(), "an honest range");
    let whole = e.get(&key).await.unwrap().unwrap();
    assert!(whole == blob);
    assert_eq!(l.take_hits(), [("bao", 1)].into(), "a 2 MB get");
    // Each lie below is caught in the stream first, then read the long
    // way (the raw range and the outboard), which names the offset.

    set(Lie::Flip(1_234_567));
    assert_eq!(
        corrupt_at(e.read_range(&key, 1_200_000, 100_000).await),
        1_234_567 / GROUP * GROUP
    );
    let hits = l.take_hits();
    assert_eq!(hits.get("bao"), Some(&1), "{hits:?}");
    assert!(hits.get("blob").is_some_and(|n| *n >= 1), "{hits:?}");
    let fine = e.read_range(&key, 0, 100_000).await.unwrap().unwrap();
    assert!(fine == blob[..100_000], "ranges away from the flip read");
    let mut r = e.open_read(&key).await.unwrap().unwrap();
    let mut streamed = Vec::new();
    let err = r.read_to_end(&mut streamed).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
    assert!(
        streamed == blob[..streamed.len()],
        "only verified bytes were returned"
    );
    assert!((streamed.len() as u64) <= 1_234_567);

    set(Lie::Truncate(10));
    let end = (300_000u64 + 1000).div_ceil(GROUP) * GROUP;
    assert_eq!(
        corrupt_at(e.read_range(&key, 300_000, 1000).await),
        end - 10
    );

    set(Lie::Other(Bytes::from(data(10, 2_000_000))));
    assert_eq!(
        corrupt_at(e.read_range(&key, 500_000, 10).await),
        500_000 / GROUP * GROUP
    );

    // A wrong outboard alone: the bytes are still right, and the client
    // reads around it (the whole blob, checked against the key).
    let (_, mut bad) = alkblobs::outboard::of(&blob);
    bad[70] ^= 1;
    set(Lie::Outboard(Bytes::from(bad)));
    let got = e
        .read_range(&key, 1_900_000, 100_000)
        .await
        .unwrap()
        .unwrap();
    assert!(got == blob[1_900_000..]);
    // Another blob's bytes with its own outboard: nothing passes.
    let other = data(11, 2_000_000);
    let (_, other_ob) = alkblobs::outboard::of(&other);
    set(Lie::OtherWithOutboard(
        Bytes::from(other),
        Bytes::from(other_ob),
    ));
    assert!(e.read_range(&key, 10, 10).await.is_err());
    assert!(e.read_range(&key, 1_000_000, 100_000).await.is_err());

    // A cut transfer fails cleanly (retryable); a retry reads it.
    set(Lie::Cut(1));
    match e.read_range(&key, 0, 10).await {
        Err(err) => assert!(err.is_retryable(), "{err}"),
        Ok(v) => panic!("a failed transfer returned {v:?}"),
    }
    let got = e.read_range(&key, 0, 10).await.unwrap().unwrap();
    assert!(got == blob[..10]);

    // More bytes than asked for are not read past the window.
    set(Lie::Longer(5000));
    assert!(e.read_range(&key, 100, 10).await.is_err());
    // A claimed size of 2^62 bytes: reads fail as soon as the bytes run
    // out, allocating by what arrived, never by the claim.
    set(Lie::Huge);
    assert_eq!(e.size(&key).await.unwrap(), Some(1 << 62));
    assert!(e.get(&key).await.is_err());
    let mut r = e.open_read(&key).await.unwrap().unwrap();
    let mut sink = vec![0u8; 1 << 20];
    let mut n = 0u64;
    let failed = loop {
        match r.read(&mut sink).await {
            Ok(0) => break false,
            Ok(k) => n += k as u64,
            Err(_) => break true,
        }
    };
    assert!(failed && n <= 2_000_000, "read {n} bytes of a claimed 2^62");
}

/// `Server::shutdown` lets requests in flight finish within its grace and
/// then cuts off what is left, whatever phase it is in: an upload still
/// trickling in (fast enough for the minimum rate) ends with the
/// shutdown, not whenever its client stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cuts_off_what_outlasts_its_grace() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (server, _dir) = node().await;
    let addr = server.addr();
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(b"POST /blobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n")
        .await
        .unwrap();
    let trickle = tokio::spawn(async move {
        // 64 KiB every 100 ms: far over the minimum rate, never done.
        let chunk = vec![7u8; 64 << 10];
        loop {
            if c.write_all(&chunk).await.is_err() {
                return c;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    server
        .shutdown(std::time::Duration::from_secs(1))
        .await
        .unwrap();
    // The connection is gone: the client's writes fail soon after.
    let mut c = tokio::time::timeout(std::time::Duration::from_secs(10), trickle)
        .await
        .expect("the trickling upload was cut off at shutdown")
        .unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), c.read_to_end(&mut rest)).await;
}

/// An upload is timed by how long the server waits on its client, not by
/// the server's own pauses: a store that takes longer than the idle
/// cut-off to start its write (a pool connection, a slow tier) does not
/// turn a prompt client's upload into a 408, whether by the idle cut-off
/// or by the minimum rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_own_pauses_are_not_the_clients() {
    use alkblobs::conformance::fault::FaultBackend;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let large = std::sync::Arc::new(FaultBackend::new(std::sync::Arc::new(
        LocalBackend::open(dir.path(), LocalOptions::default())
            .await
            .unwrap(),
    )));
    let store = Store::builder()
        .kv(MemBackend::new())
        .large(large.clone())
        .threshold(1024)
        .build()
        .unwrap();
    let server = alkblobs::serve::start(
        store,
        ServeOptions::new("127.0.0.1:0".parse().unwrap())
            .idle_timeout(std::time::Duration::from_secs(1)),
    )
    .await
    .unwrap();
    large.delay_writes(std::time::Duration::from_secs(3));
    // 600 KiB in pieces of 4 KiB every 5 ms: far over the minimum rate.
    let body: Vec<u8> = (0..600u32 << 10).map(|i| (i % 251) as u8).collect();
    let mut c = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    c.write_all(
        format!(
            "POST /blobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    for piece in body.chunks(4 << 10) {
        c.write_all(piece).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let mut answer = Vec::new();
    c.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    server
        .shutdown(std::time::Duration::from_secs(5))
        .await
        .unwrap();
}
