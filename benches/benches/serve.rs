//! `alkblobs serve` beside nginx (Debian's package) serving the same bytes
//! from a file, both on loopback, one run, the same client (reqwest, on
//! its own runtime), interleaved:
//!
//! - GET of a 64 MiB blob (alkblobs checks every byte against the key
//!   through the outboard before sending it; nginx `sendfile`s);
//! - 1 KiB GETs with 64 connections at once (a kv-tier blob; nginx a small
//!   file), recorded.
//!
//! Needs `nginx` on the PATH or at /usr/sbin/nginx (`apt-get install
//! nginx-light`); the server side of each runs on its own 2-thread runtime
//! (alkblobs) or one worker process (nginx).

use std::process::{Child, Command};
use std::sync::Arc;
use std::time::Duration;

use alkblobs::serve::ServeOptions;
use alkblobs::{DirOptions, Store};
use alkblobs_benches::{Lat, data, header, on_worker, paired, rounds};
use bytes::Bytes;

const BIG: usize = 64 << 20;
const SMALL: usize = 1024;
const CONNS: usize = 64;

struct Nginx(Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers (SIGKILL would orphan them).
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn nginx(root: &std::path::Path, dir: &std::path::Path) -> (Nginx, u16) {
    let port = free_port();
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nworker_processes 1;\npid {pid};\nerror_log {err} warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{ access_log off; sendfile on; tcp_nopush on; keepalive_requests 100000;\n\
               client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp};\n\
               uwsgi_temp_path {tmp}; scgi_temp_path {tmp};\n\
               server {{ listen 127.0.0.1:{port}; root {root}; }} }}\n",
            pid = dir.join("nginx.pid").display(),
            err = dir.join("nginx.err").display(),
            tmp = dir.display(),
            root = root.display(),
        ),
    )
    .unwrap();
    let bin = ["/usr/sbin/nginx", "nginx"]
        .into_iter()
        .find(|b| Command::new(b).arg("-v").output().is_ok())
        .expect("nginx is not installed: apt-get install nginx-light");
    // Owned by the guard at once: stopped and waited for on every path.
    let nginx = Nginx(
        Command::new(bin)
            .args(["-c", conf.to_str().unwrap(), "-p", dir.to_str().unwrap()])
            .spawn()
            .unwrap(),
    );
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (nginx, port);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(nginx);
    panic!(
        "nginx did not start: {}",
        std::fs::read_to_string(dir.join("nginx.err")).unwrap_or_default()
    );
}

fn main() {
    let (rt, dir, mut probes) = alkblobs_benches::setup();
    // The server's own runtime: its threads, not the client's.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let store = server_rt
        .block_on(Store::open_dir_with(
            dir.path().join("store"),
            DirOptions::new().relaxed(),
        ))
        .unwrap();
    let big = Bytes::from(data(64, BIG));
    let small = Bytes::from(data(1, SMALL));
    let (kb, ks) = server_rt.block_on(async {
        let b = store.put(big.clone()).await.unwrap();
        let s = store.put(small.clone()).await.unwrap();
        (b.key, s.key)
    });
    let server = server_rt
        .block_on(alkblobs::serve::start(
            store,
            ServeOptions::new("127.0.0.1:0".parse().unwrap()).max_concurrency(256),
        ))
        .unwrap();
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join(kb.to_string()), &big).unwrap();
    std::fs::write(root.join(ks.to_string()), &small).unwrap();
    let (_nginx, port) = nginx(&root, dir.path());
    let ours = format!("http://{}/blobs", server.addr());
    let theirs = format!("http://127.0.0.1:{port}");
    // reqwest is built without a TLS provider of its own (the crate uses
    // ring everywhere).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CONNS)
        .build()
        .unwrap();
    header("alkblobs serve vs nginx, loopback");

    let rt = &rt;
    let get = |url: String, want: usize, n: usize| {
        let c = client.clone();
        move |lat: &mut Lat| {
            let ops: Vec<_> = (0..n)
                .map(|_| {
                    let (c, url) = (c.clone(), url.clone());
                    move || async move {
                        let r = c.get(url).send().await.unwrap();
                        assert!(r.status().is_success());
                        assert_eq!(r.bytes().await.unwrap().len(), want);
                    }
                })
                .collect();
            let done = on_worker(rt, lat, ops);
            (done, done * want as u64)
        }
    };
    let mut a = get(format!("{ours}/{kb}"), BIG, 2);
    let mut b = get(format!("{theirs}/{kb}"), BIG, 2);
    paired(
        "GET 64 MiB",
        "alkblobs serve",
        "nginx",
        rounds(10),
        &mut a,
        &mut b,
    );

    // 64 connections at once, each 20 GETs of 1 KiB.
    let many = |url: String| {
        let c = client.clone();
        let url = Arc::new(url);
        move |lat: &mut Lat| {
            let t = std::time::Instant::now();
            rt.block_on(async {
                let tasks: Vec<_> = (0..CONNS)
                    .map(|_| {
                        let (c, url) = (c.clone(), url.clone());
                        tokio::spawn(async move {
                            for _ in 0..20 {
                                let r = c.get(url.as_str()).send().await.unwrap();
                                assert_eq!(r.bytes().await.unwrap().len(), SMALL);
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
            });
            lat.record(t.elapsed() / (CONNS as u32 * 20));
            let n = (CONNS * 20) as u64;
            (n, 0)
        }
    };
    let mut a = many(format!("{ours}/{ks}"));
    let mut b = many(format!("{theirs}/{ks}"));
    paired(
        "1 KiB GETs, 64 connections",
        "alkblobs serve",
        "nginx",
        rounds(10),
        &mut a,
        &mut b,
    );
    probes.take("after the GETs", dir.path());
    probes.verdict();
    server_rt
        .block_on(server.shutdown(Duration::from_secs(5)))
        .unwrap();
}
