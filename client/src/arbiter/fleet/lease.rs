//! A sweep's lease on its pool (`alkblobs_sweep_lease`): which instance
//! does the work when two sweep at once, renewed by a task of its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_postgres::types::Type;

use crate::Result;
use crate::pg::db_err;

use super::Shared;

/// How long a sweep lease lasts unless renewed (a sweep renews it every
/// third of this between its calls).
const LEASE_TTL: Duration = Duration::from_secs(60);
const LEASE_TTL_SQL: &str = "60 seconds";

/// A sweep's lease on its pool (`alkblobs_sweep_lease`), held by a task of
/// its own on a connection of its own: it renews the lease every third of
/// [`LEASE_TTL`] while the sweep runs (whatever phase the sweep is in),
/// notes in `lost` a renewal that found the lease taken by another
/// instance (after a stall past the TTL), and ends the lease when told to
/// or when this value is dropped (a cancelled sweep). The holder is this
/// instance's id and a token of the sweep, so two sweeps of one instance
/// exclude each other too and a late end never ends a newer sweep's lease.
/// The connection's backend is the lease's: a killed process's lease is
/// free as soon as its connections close.
pub(super) struct Lease {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    lost: Arc<std::sync::atomic::AtomicBool>,
    task: JoinHandle<()>,
}

impl Lease {
    /// Takes the pool's lease; `None` while another sweep holds it.
    pub(super) async fn take(s: &Arc<Shared>) -> Result<Option<Lease>> {
        let conn = s.pg.conn().await?;
        let holder = format!("{}/{:016x}", s.owner, rand::random::<u64>());
        if !lease_call(s, &conn, &holder).await? {
            return Ok(None);
        }
        let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = {
            let (s, lost) = (s.clone(), lost.clone());
            tokio::spawn(async move {
                let every = LEASE_TTL / 3;
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                let mut renewed = Instant::now();
                loop {
                    tokio::select! {
                        // Told to end, or the sweep was dropped.
                        _ = &mut stopped => break,
                        _ = tick.tick() => match lease_call(&s, &conn, &holder).await {
                            Ok(true) => renewed = Instant::now(),
                            Ok(false) => {
                                lost.store(true, std::sync::atomic::Ordering::Release);
                                return;
                            }
                            // Unrenewed for a whole TTL (its connection
                            // broke): another instance may hold it now.
                            Err(_) if renewed.elapsed() >= LEASE_TTL => {
                                lost.store(true, std::sync::atomic::Ordering::Release);
                                return;
                            }
                            Err(e) => tracing::warn!(pool = %s.info.name, error = %e, "unable to renew the sweep lease; retrying"),
                        },
                    }
                }
                let r = conn
                    .query_typed(
                        "SELECT alkblobs_sweep_lease_end($1, $2)",
                        &[(&s.info.name, Type::TEXT), (&holder, Type::TEXT)],
                    )
                    .await;
                if let Err(e) = r {
                    tracing::warn!(pool = %s.info.name, error = %e, "unable to end the sweep lease; it expires by itself");
                }
            })
        };
        Ok(Some(Lease {
            stop: Some(stop),
            lost,
            task,
        }))
    }

    /// Whether another instance took the lease meanwhile.
    pub(super) fn lost(&self) -> bool {
        self.lost.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Ends the lease and waits until it is ended.
    pub(super) async fn end(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

/// One `alkblobs_sweep_lease` call on the lease's connection.
pub(super) async fn lease_call(
    s: &Shared,
    conn: &deadpool_postgres::Object,
    holder: &str,
) -> Result<bool> {
    let row = conn
        .query_typed_one(
            "SELECT alkblobs_sweep_lease($1, $2, $3::text::interval)",
            &[
                (&s.info.name, Type::TEXT),
                (&holder, Type::TEXT),
                (&LEASE_TTL_SQL, Type::TEXT),
            ],
        )
        .await
        .map_err(|e| db_err(&s.pg, None, e))?;
    Ok(row.get(0))
}
