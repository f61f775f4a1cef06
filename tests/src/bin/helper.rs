//! Plays "another process" for the crash and locking tests.
//!
//! - `slow-put DIR`: opens the embedded store in DIR and streams an endless
//!   large put, one chunk every 20 ms, printing `writing` once started.
//! - `crash-puts DIR`: puts blobs of mixed sizes in a loop, printing each
//!   key once its put returned (so the parent knows it is durable).
//! - `hold-sqlite-lock DB`: takes SQLite's exclusive write lock on DB with a
//!   plain rusqlite connection, prints `locked`, holds until stdin closes.
//! - `sweep-then-die DIR WINDOW_MS`: runs a sweep on DIR and, once its rows
//!   are staged and sealed, prints `sealed` and hangs until killed.
//! - `pg-crash-puts URL POOL`: `crash-puts` on a single-instance PostgreSQL
//!   pool (threshold 1 KiB: kv rows and large objects).

use std::io::{BufRead, Write};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use alkblobs::{Store, SweepOptions, SweepPhase};
use tokio::io::{AsyncRead, ReadBuf};

struct Slow {
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    n: u64,
}

impl AsyncRead for Slow {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(20))));
        if sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        this.sleep = None;
        this.n += 1;
        let chunk = alkblobs_tests::data(this.n, buf.remaining().min(256 * 1024));
        buf.put_slice(&chunk);
        if this.n == 3 {
            println!("writing");
            let _ = std::io::stdout().flush();
        }
        Poll::Ready(Ok(()))
    }
}

use std::future::Future;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("slow-put") => {
            let store = Store::open_dir(&args[2]).await.expect("open");
            let _ = store.put_reader(Slow { sleep: None, n: 0 }).await;
        }
        Some("crash-puts") => {
            let store = Store::open_dir(&args[2]).await.expect("open");
            for i in 0u64.. {
                let size = match i % 4 {
                    0 => 10,
                    1 => 60_000,
                    2 => 200_000,
                    _ => 3_000_000,
                };
                let put = store.put(alkblobs_tests::data(i, size)).await.expect("put");
                println!("{}", put.key);
                let _ = std::io::stdout().flush();
            }
        }
        Some("pg-crash-puts") => {
            let opts =
                alkblobs::store::postgres::PostgresOptions::new(&args[2], &args[3]).threshold(1024);
            let store = Store::open_postgres(opts).await.expect("open");
            for i in 0u64.. {
                let size = match i % 4 {
                    0 => 10,
                    1 => 1_000,
                    2 => 200_000,
                    _ => 6_000_000,
                };
                let put = store.put(alkblobs_tests::data(i, size)).await.expect("put");
                println!("{}", put.key);
                let _ = std::io::stdout().flush();
            }
        }
        Some("hold-sqlite-lock") => {
            let conn = rusqlite::Connection::open(&args[2]).expect("open");
            conn.execute_batch("BEGIN EXCLUSIVE").expect("lock");
            println!("locked");
            let _ = std::io::stdout().flush();
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
            conn.execute_batch("ROLLBACK").expect("unlock");
        }
        Some("sweep-then-die") => {
            let store = Store::open_dir(&args[2]).await.expect("open");
            let window = Duration::from_millis(args[3].parse().expect("window ms"));
            let opts = SweepOptions::new().window(window).hook(|phase| {
                Box::pin(async move {
                    if phase == SweepPhase::Sealed {
                        println!("sealed");
                        let _ = std::io::stdout().flush();
                        std::future::pending::<()>().await;
                    }
                })
            });
            let _ = store.sweep(opts).await;
        }
        _ => {
            eprintln!(
                "usage: alkblobs-test-helper slow-put|crash-puts|pg-crash-puts|hold-sqlite-lock|sweep-then-die ARGS"
            );
            std::process::exit(2);
        }
    }
}
