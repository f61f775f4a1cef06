//! The fleet arbiter (feature `postgres`, ADR-008 §2): many store instances
//! on many nodes share one pool in PostgreSQL, so pins are rows and sweeps
//! run inside the extension.
//!
//! - **Pins are rows of this instance** (`owner`, a store-instance id). A
//!   kv or `pg-lo` put commits its entry row and its pin row in one
//!   transaction: the engines are built on [`PgPool::pinning_for`] and pass
//!   the owner to `alkblobs_put` / `alkblobs_lo_commit`. A put to a shared
//!   `local` tier commits its pin row first (`alkblobs_pin_new`, in
//!   [`Arbiter::pin`]), renames the file into place, then marks it
//!   published (`alkblobs_local_published`, in [`Arbiter::published`]).
//! - **Guards are counted in process; rows are per key.** One pin row per
//!   (key, instance) however many guards hold it. When the last guard of a
//!   key drops, the key is queued and a background task deletes the rows
//!   in batches (`alkblobs_unpin_many`); a pin of a key whose row is being
//!   deleted waits for that delete, so the put's own upsert comes after it
//!   and is never undone by it.
//! - **Renewal**: a background task calls `alkblobs_renew(pool, owner)`
//!   every TTL/3 — one statement per round, whatever the number of pins.
//!   The extension renews only un-expired pins: a lapsed pin stays lapsed.
//!   Before a holder relies on its pins ([`Arbiter::confirm`]) the arbiter
//!   asks the database (`alkblobs_pins_held`) and fails with
//!   [`Error::PinExpired`] for a lapsed one.
//! - **Sweeps** are `alkblobs_sweep` calls (each one transaction under the
//!   pool's sweeper lock) until the mark is done and nothing due is left,
//!   while this sweep holds the pool's sweep lease (`alkblobs_sweep_lease`:
//!   an expiring row naming this instance and sweep, renewed by a task of
//!   its own and ended after; see `Lease`), so that of two
//!   instances sweeping at once exactly one does the work and the other
//!   reports [`GcAbortCause::SweeperLock`]. A `local` tier's files are
//!   enumerated, staged through the extension and deleted only under its
//!   arbitration: a claim commits tombstones (`alkblobs_claim_local`), then
//!   one transaction locks them, unlinks the files and removes them
//!   (`alkblobs_local_deleting`, `alkblobs_local_deleted`).
//! - The pool's delete window and pin TTL are read from the database when
//!   the store opens, never taken from client defaults.

mod lease;
mod pins;
mod shared_tier;
mod sweep;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_postgres::types::Type;

use super::{
    Arbiter, GcAbortCause, GcUsage, PinGuard, PinRelease, Pool, Scope, StagedRow, SweepOptions,
    SweepPhase, SweepProgress, SweepReport,
};
use crate::backend::Generations;
use crate::pg::{PgPool, PoolInfo};
use crate::tier::Tier;
use crate::{Error, Key, Result};
use lease::Lease;

/// Keys per `alkblobs_unpin_many` / `alkblobs_local_published` /
/// `alkblobs_pins_held` call.
const BATCH: usize = 10_000;
/// Keys per `alkblobs_stage` call when staging a local tier's files.
const STAGE_BATCH: usize = 50_000;
/// Files per `alkblobs_claim_local` call.
const CLAIM_BATCH: i32 = 1_000;
/// Rows an `alkblobs_sweep` call marks and executes at most.
const SWEEP_KEYS: i32 = 20_000;
/// How long a release that failed waits before it is tried again.
const RELEASE_RETRY: Duration = Duration::from_secs(1);
/// How long a put waits, in doubling steps, for a sweep to finish deleting
/// the file of the same key before it gives up with the retryable error.
const TOMBSTONE_WAIT: Duration = Duration::from_secs(2);

/// A fresh store-instance id: host, process and a random suffix, so two
/// instances in one process are two owners.
pub fn instance_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    let mut host: String = host.chars().take(64).collect();
    host.retain(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    format!(
        "{host}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// In-process pin counts and the release queue; see the module docs.
#[derive(Debug, Default)]
struct PinState {
    counts: HashMap<Key, u32>,
    /// Keys whose last guard dropped, waiting for the release task.
    queued: HashSet<Key>,
    /// Keys whose rows the release task is deleting right now; a pin waits
    /// until the sender drops.
    releasing: HashMap<Key, watch::Sender<()>>,
}

/// What the arbiter and its tasks share.
struct Shared {
    /// The store's connections (sweeps).
    pg: PgPool,
    /// The arbiter's own few connections: renewal, releases and pin calls
    /// never wait behind uploads and sweeps holding the store's.
    control: PgPool,
    owner: String,
    info: PoolInfo,
    pins: Mutex<PinState>,
    wake_releaser: Notify,
    /// What `alkblobs_pin_new` handed this instance's puts (the object an
    /// s3 tier names; see `backend::Generations`), shared with the engine.
    generations: Arc<Generations>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetArbiter")
            .field("pool", &self.info.name)
            .field("owner", &self.owner)
            .finish()
    }
}

fn key_of(bytes: &[u8]) -> Result<Key> {
    Ok(Key::from_slice(bytes)?)
}

/// The fleet arbiter; see the module docs. Built by
/// `Store::open_fleet`.
pub struct FleetArbiter {
    shared: Arc<Shared>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl fmt::Debug for FleetArbiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared.fmt(f)
    }
}

impl FleetArbiter {
    /// The arbiter of fleet pool `info` for store instance `owner`, over
    /// `pg` (whose engines must carry the same owner). Starts the renewal
    /// and release tasks; [`Arbiter::close`] or dropping it stops them.
    pub async fn start(
        pg: PgPool,
        control: PgPool,
        info: PoolInfo,
        owner: String,
    ) -> Result<FleetArbiter> {
        // An id whose pins are still alive belongs to a live instance (or
        // to one that died less than a TTL ago): adopting its rows would
        // renew pins no guard of ours will ever release.
        let live = control
            .rows(
                &control,
                None,
                "SELECT count(*) FROM alkblobs_pins WHERE pool = $1 AND owner = $2 AND NOT expired",
                &[(&info.name, Type::TEXT), (&owner, Type::TEXT)],
            )
            .await?;
        if live.first().map(|r| r.get::<_, i64>(0)).unwrap_or(0) > 0 {
            return Err(Error::Config(format!(
                "store instance id {owner:?} holds live pins in pool {:?}: another instance uses this id (ids must be unique), or one that stopped has pins that expire within the pool's TTL ({:?})",
                info.name, info.pin_ttl
            )));
        }
        // Fails early if the role may not write the pool (or it is not a
        // fleet pool).
        control
            .rows(
                &control,
                None,
                "SELECT count(*) FROM alkblobs_pins_held($1, $2, '{}')",
                &[(&info.name, Type::TEXT), (&owner, Type::TEXT)],
            )
            .await?;
        let id_rows = control
            .rows(
                &control,
                None,
                "SELECT pool_id FROM alkblobs_pools WHERE pool = $1",
                &[(&info.name, Type::TEXT)],
            )
            .await?;
        // (The view shows the pool only to a role with access to it.)
        if id_rows.is_empty() {
            return Err(Error::NoPool {
                pool: info.name.clone(),
                at: pg.to_string(),
            });
        }
        let shared = Arc::new(Shared {
            pg,
            control,
            owner,
            info,
            pins: Mutex::new(PinState::default()),
            wake_releaser: Notify::new(),
            generations: Arc::default(),
        });
        let every = shared.info.pin_ttl / 3;
        let renewer = {
            let s = shared.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    match s.renew().await {
                        Ok(n) => tracing::trace!(pool = %s.name(), renewed = n, "pins renewed"),
                        Err(e) => {
                            tracing::warn!(pool = %s.name(), error = %e, "renewing pins failed")
                        }
                    }
                }
            })
        };
        let releaser = {
            let s = shared.clone();
            tokio::spawn(async move {
                loop {
                    s.wake_releaser.notified().await;
                    s.release_queued().await;
                    let retry = !s.pins().queued.is_empty();
                    if retry {
                        tokio::time::sleep(RELEASE_RETRY).await;
                        s.wake_releaser.notify_one();
                    }
                }
            })
        };
        Ok(FleetArbiter {
            shared,
            tasks: Mutex::new(vec![renewer, releaser]),
        })
    }

    /// This store instance's id (the owner of its pin rows).
    pub fn owner(&self) -> &str {
        &self.shared.owner
    }

    /// The object generations this instance's puts were handed, for the
    /// large engine to name objects by (`Store::open_fleet` gives it to
    /// an s3 engine).
    pub(crate) fn generations(&self) -> Arc<Generations> {
        self.shared.generations.clone()
    }

    /// The pool's pin TTL (from the database).
    pub fn pin_ttl(&self) -> Duration {
        self.shared.info.pin_ttl
    }

    /// Runs one renewal round now; returns how many pin rows it renewed.
    pub async fn renew_now(&self) -> Result<i64> {
        self.shared.renew().await
    }

    fn shared_tier(&self) -> bool {
        self.shared.info.large_tier.is_shared()
    }

    fn stop_tasks(&self) {
        for t in self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            t.abort();
        }
        self.shared.abandon_releases();
    }

    fn guard(&self, keys: &[Key]) -> PinGuard {
        PinGuard::new(keys.to_vec(), self.shared.clone() as Arc<dyn PinRelease>)
    }
}

impl Drop for FleetArbiter {
    fn drop(&mut self) {
        self.stop_tasks();
    }
}

#[async_trait]
impl Arbiter for FleetArbiter {
    fn name(&self) -> &str {
        "fleet"
    }

    fn scope(&self) -> Scope {
        Scope::Pool
    }

    async fn pin(&self, tier: Tier, keys: &[Key]) -> Result<PinGuard> {
        self.shared.count(keys).await;
        let guard = self.guard(keys);
        if tier == Tier::Large && self.shared_tier() {
            // The pin row commits before the file is renamed into place.
            self.pin_new(keys).await?;
        }
        Ok(guard)
    }

    async fn pin_existing(&self, _pool: &Pool, key: &Key) -> Result<PinGuard> {
        let s = &self.shared;
        s.count(std::slice::from_ref(key)).await;
        let guard = self.guard(std::slice::from_ref(key));
        let kb = key.as_bytes().to_vec();
        let rows =
            s.pg.rows(
                &s.pg,
                Some(*key),
                "SELECT alkblobs_pin($1, $2, $3)",
                &[
                    (&s.info.name, Type::TEXT),
                    (&kb, Type::BYTEA),
                    (&s.owner, Type::TEXT),
                ],
            )
            .await?;
        if rows.first().map(|r| r.get::<_, bool>(0)) == Some(true) {
            Ok(guard)
        } else {
            Err(Error::NotFound { key: *key })
        }
    }

    async fn confirm(&self, keys: &[Key]) -> Result<()> {
        // Always the database's answer: a local clock cannot know whether
        // a row expired (a suspended host, a renewal that renewed other
        // rows), and a round trip is cheap next to what a holder does.
        let s = &self.shared;
        let held = s.held(keys).await?;
        match keys.iter().find(|k| !held.contains(k)) {
            Some(k) => Err(Error::PinExpired { key: *k }),
            None => Ok(()),
        }
    }

    async fn before_publish(&self, tier: Tier, keys: &[Key]) -> Result<()> {
        if tier == Tier::Large && self.shared_tier() {
            // alkblobs_pin_new committed these rows; the rename comes next.
            return self.confirm(keys).await;
        }
        // kv and pg-lo: the pin row commits with the entry.
        Ok(())
    }

    async fn published(&self, tier: Tier, keys: &[Key]) -> Result<()> {
        if tier != Tier::Large || !self.shared_tier() || keys.is_empty() {
            // kv and pg-lo: the put's own transaction restarted the window.
            return Ok(());
        }
        let s = &self.shared;
        let mut marked = HashSet::new();
        for chunk in keys.chunks(BATCH) {
            let ks: Vec<Vec<u8>> = chunk.iter().map(|k| k.as_bytes().to_vec()).collect();
            let rows =
                s.pg.rows(
                    &s.pg,
                    chunk.first().copied(),
                    "SELECT k FROM alkblobs_local_published($1, $2, $3) k",
                    &[
                        (&s.info.name, Type::TEXT),
                        (&ks, Type::BYTEA_ARRAY),
                        (&s.owner, Type::TEXT),
                    ],
                )
                .await?;
            for r in rows {
                marked.insert(key_of(&r.get::<_, Vec<u8>>(0))?);
            }
        }
        // Published: the engine has named their objects.
        for k in keys {
            s.generations.forget(k);
        }
        match keys.iter().find(|k| !marked.contains(k)) {
            // Its record is gone: a claim collected it, which only an
            // expired pin allows.
            Some(k) => Err(Error::PinExpired { key: *k }),
            None => Ok(()),
        }
    }

    fn pin_count(&self, key: &Key) -> u32 {
        self.shared.pins().counts.get(key).copied().unwrap_or(0)
    }

    async fn sweep(&self, pool: &Pool, opts: SweepOptions) -> Result<SweepReport> {
        let s = &self.shared;
        if opts.protect_source().is_some() {
            return Err(Error::Config(
                "a fleet sweep cannot consult an in-process protect callback (other instances cannot see it): write the protect set into a registered liveness table before sweeping".into(),
            ));
        }
        if let Some(w) = opts.window
            && w != s.info.delete_window
        {
            return Err(Error::Config(format!(
                "the delete window of fleet pool {:?} is the pool's ({:?}), the same for every instance and for psql; change it with alkblobs_alter_pool instead of per sweep",
                s.info.name, s.info.delete_window
            )));
        }
        let started = Instant::now();
        // This instance's dropped guards first: their rows would go within
        // a moment anyway, and a sweep by the instance that dropped them
        // should not keep what it no longer holds. The release task does
        // the work (so a sweep cancelled here leaves nothing half-done);
        // the sweep waits for it a bounded while, and not at all for a dry
        // run (which changes nothing).
        if !opts.dry_run {
            s.flush_releases(Duration::from_secs(2)).await;
        }
        // The lease: see `Lease`.
        let result = if let Some(lease) = Lease::take(&self.shared).await? {
            // (Test support: a hook at Mark runs with the lease held.)
            opts.run_hook(SweepPhase::Mark).await;
            let r = self.sweep_leased(pool, &opts, &lease).await;
            lease.end().await;
            r
        } else {
            Ok(SweepReport {
                window: s.info.delete_window,
                dry_run: opts.dry_run,
                aborted: Some(GcAbortCause::SweeperLock),
                ..SweepReport::default()
            })
        };
        result.map(|mut r| {
            r.duration = started.elapsed();
            r
        })
    }

    async fn staged(&self, after: Option<Key>, limit: usize) -> Result<Vec<StagedRow>> {
        let s = &self.shared;
        let after_hex = after.map(|k| k.to_string()).unwrap_or_default();
        let lim = limit.min(100_000) as i64;
        let rows =
            s.pg.rows(
                &s.pg,
                None,
                "SELECT key, (extract(epoch FROM staged_at) * 1000)::bigint, \
                 (extract(epoch FROM visible_after) * 1000)::bigint \
                 FROM alkblobs_staged WHERE pool = $1 AND key > $2 ORDER BY key LIMIT $3",
                &[
                    (&s.info.name, Type::TEXT),
                    (&after_hex, Type::TEXT),
                    (&lim, Type::INT8),
                ],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(StagedRow {
                    key: Key::parse(&r.get::<_, String>(0))?,
                    staged_at_ms: r.get(1),
                    visible_after_ms: r.get(2),
                })
            })
            .collect()
    }

    fn staged_durable(&self) -> bool {
        true
    }

    fn delete_window(&self) -> Duration {
        self.shared.info.delete_window
    }

    async fn usage(&self) -> Result<GcUsage> {
        let s = &self.shared;
        let rows =
            s.pg.rows(
                &s.pg,
                None,
                "SELECT count(*) FROM alkblobs_staged WHERE pool = $1",
                &[(&s.info.name, Type::TEXT)],
            )
            .await?;
        Ok(GcUsage {
            staged: rows.first().map(|r| r.get::<_, i64>(0)).unwrap_or(0) as u64,
            roots: 0,
        })
    }

    fn no_registry(&self, what: &str) -> Error {
        fleet_liveness(what)
    }

    async fn explain(&self, key: &Key) -> Result<Vec<(String, String)>> {
        let s = &self.shared;
        let kb = key.as_bytes().to_vec();
        let rows =
            s.pg.rows(
                &s.pg,
                Some(*key),
                "SELECT aspect, detail FROM alkblobs_explain($1, $2)",
                &[(&s.info.name, Type::TEXT), (&kb, Type::BYTEA)],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn close(&self) -> Result<()> {
        self.stop_tasks();
        // Release every pin of this instance at once instead of leaving
        // them to expire.
        let s = &self.shared;
        s.control
            .rows(
                &s.control,
                None,
                "SELECT alkblobs_unpin_all($1, $2)",
                &[(&s.info.name, Type::TEXT), (&s.owner, Type::TEXT)],
            )
            .await?;
        Ok(())
    }
}

/// A sweep call's `aborted` text as report data (or, for a pool the fleet
/// must not sweep, the configuration error it is).
fn abort_cause(pool: &str, cause: &str) -> Result<GcAbortCause> {
    Ok(match cause {
        "sweeper_lock" => GcAbortCause::SweeperLock,
        "liveness_table_invalid" => GcAbortCause::ProtectionSource {
            source: "liveness tables".into(),
            error: "a registered liveness table failed validation (the server log names it); fix or unregister it".into(),
        },
        "liveness_table_busy" => GcAbortCause::ProtectionSource {
            source: "liveness tables".into(),
            error: "a registered liveness table stayed locked by DDL; retry when it is done".into(),
        },
        "single_instance_pool" => {
            return Err(Error::Config(format!(
                "pool {pool:?} is a single-instance pool: the fleet does not sweep it"
            )));
        }
        other => GcAbortCause::ProtectionSource {
            source: "alkblobs_sweep".into(),
            error: other.to_owned(),
        },
    })
}

/// The error for a callback liveness source (or roots) given to a fleet.
fn fleet_liveness(what: &str) -> Error {
    Error::Config(format!(
        "a fleet store cannot use the in-process liveness source {what:?}: other instances and the database's sweep cannot consult it. Register a table instead (SELECT alkblobs_register_liveness(pool, 'your_table')) and write the keys you keep into it"
    ))
}
