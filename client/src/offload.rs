//! Work that blocks (a file's system calls, SQLite, hashing a large
//! buffer) run off the async workers' queues, a panic in it turned into an
//! engine error. The engines, verification and the store use it.

use crate::Result;

/// Runs blocking engine work without stalling the async workers.
///
/// On a multi-threaded tokio runtime this is `block_in_place`: the worker
/// hands its queue to another thread and runs `f` itself, so a 4 µs SQLite
/// read costs 4 µs rather than a 20 µs round trip to the blocking pool (see
/// `docs/benchmarks.md`). Elsewhere (a current-thread runtime) `f` goes to
/// the blocking pool. A panic in `f` becomes an engine error either way.
pub(crate) async fn blocking<T, F>(engine: &str, f: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    use tokio::runtime::{Handle, RuntimeFlavor};
    let panicked =
        |what: String| crate::Error::engine(engine, format!("blocking task failed: {what}"));
    let multi =
        Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread);
    if multi {
        inline(engine, || tokio::task::block_in_place(f))
    } else {
        match tokio::task::spawn_blocking(f).await {
            Ok(r) => r,
            Err(e) => Err(panicked(e.to_string())),
        }
    }
}

/// Runs `f` on the calling thread (an async worker, for point reads that
/// cost a few microseconds; see the sqlite engine's `inline_reads`). A panic
/// in `f` becomes an engine error, as in [`blocking`].
pub(crate) fn inline<T>(engine: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(crate::Error::engine(
            engine,
            format!(
                "read failed: {}",
                p.downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "panic".into())
            ),
        )),
    }
}
