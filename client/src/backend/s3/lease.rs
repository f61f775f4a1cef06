//! The lease of a prefix one process writes (`alkblobs.lock`): an
//! in-process arbiter sweeps a prefix against its own pins only, so two
//! processes sweeping one prefix would delete each other's puts. A
//! writable open that is not a fleet's takes it; a renewal task keeps it
//! every third of its TTL; another process may take it over once its
//! last renewal is three TTLs old by the service's clock. (A fleet's
//! shared prefix needs none: the database arbitrates.)
//!
//! A live lease is always refused (it is read first). Where the service
//! has conditional puts — probed at open, since some accept the header
//! and ignore it — taking an absent or stale lease is exclusive
//! (`If-None-Match: *` to create it, `If-Match` on the stale version's
//! ETag to take it over). Where it has not, the lease is written, a
//! settle time (1 s) waited out and read back: two processes that both
//! read it absent write within a request's time of each other, and both
//! read back the later writer's. Only a process stalled for longer than
//! the settle time between its read and its write could hold it beside
//! another; the renewal reads the lease back before each renewal, so it
//! finds out within a third of a TTL and refuses every write and delete
//! from then on ([`Error::InUse`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use bytes::Bytes;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};

use super::{Inner, unsupported};
use crate::{Error, Result};

/// How long an unconditional lease write waits before reading the lease
/// back (services without conditional puts).
pub(super) const SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

/// Finds out whether the service honours `If-None-Match: *`: some
/// compatible services (Garage 2.5, measured) accept the header and
/// overwrite anyway, which looks like success. A create over the clock
/// object, which exists, must be refused; if it is not, the lease falls
/// back to write, settle and read back.
pub(super) async fn probe_conditional(inner: &Arc<Inner>) -> Result<()> {
    if !inner.conditional.load(Ordering::Relaxed) {
        return Ok(());
    }
    let path = inner.opts.location.clock();
    inner
        .store
        .put(&path, PutPayload::from_static(b"clock"))
        .await
        .map_err(|e| inner.err("write the prefix's clock object", e))?;
    let create = PutOptions {
        mode: PutMode::Create,
        ..PutOptions::default()
    };
    match inner
        .store
        .put_opts(&path, PutPayload::from_static(b"clock"), create)
        .await
    {
        Err(
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. },
        ) => Ok(()),
        Ok(_) => {
            tracing::info!(engine = %inner.display, "the service ignores If-None-Match: the prefix lease is written, settled and read back");
            inner.conditional.store(false, Ordering::Relaxed);
            Ok(())
        }
        Err(e) if unsupported(&e) => {
            inner.conditional.store(false, Ordering::Relaxed);
            Ok(())
        }
        Err(e) => Err(inner.err("probe the service's conditional puts", e)),
    }
}

/// A lease this process holds.
pub(super) struct Lease {
    owner: String,
    lost: Arc<AtomicBool>,
    /// When a renewal last succeeded (or the lease was taken).
    confirmed: Arc<std::sync::Mutex<std::time::Instant>>,
    ttl: std::time::Duration,
    renewal: tokio::task::JoinHandle<()>,
}

/// What the lease object says: its holder (`owner` is random per open).
fn body(owner: &str) -> PutPayload {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "?".into());
    PutPayload::from(format!(
        "{owner}\nhost {host} pid {}\n{}\n",
        std::process::id(),
        process_space().unwrap_or_else(|| "space unknown".into())
    ))
}

/// This machine's boot and this process's PID namespace: two leases
/// naming the same space name PIDs of one process table.
fn process_space() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    Some(format!("space {} {}", boot.trim(), ns.display()))
}

/// Whether the lease `text` names a process of this machine's boot and
/// PID namespace that no longer runs: its lease is stale at once (a
/// crashed CLI or test on this machine), without waiting three TTLs.
fn holder_is_dead_here(text: &str) -> bool {
    let mut lines = text.lines().skip(1);
    let (Some(who), Some(space)) = (lines.next(), lines.next()) else {
        return false;
    };
    if process_space().as_deref() != Some(space) {
        return false;
    }
    let Some(pid) = who
        .rsplit_once(" pid ")
        .and_then(|(_, p)| p.trim().parse::<u32>().ok())
    else {
        return false;
    };
    if pid == std::process::id() || pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // Signal 0 probes without signalling: only ESRCH means no such process
    // (EPERM is a live process of another user; a /proc mounted with
    // hidepid would hide it and must not read as dead).
    // SAFETY: kill(2) with signal 0 has no effect on the target.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

fn owner_of(bytes: &Bytes) -> (String, String) {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = text.lines();
    (
        lines.next().unwrap_or_default().to_owned(),
        lines.next().unwrap_or_default().to_owned(),
    )
}

impl Lease {
    /// Takes the prefix's lease, waiting for it if the open mode says so.
    pub(super) async fn take(inner: &Arc<Inner>) -> Result<Lease> {
        let owner = format!("{:032x}", rand::random::<u128>());
        let path = inner.opts.location.lease();
        let ttl = inner.opts.lease_ttl;
        let wait = inner.opts.mode.wait() == crate::backend::Wait::Yes;
        probe_conditional(inner).await?;
        loop {
            // Read first: a live lease is refused whatever the service
            // does with conditions. (Confirmed as of before the write: the
            // service stamps the lease after that, and the release's
            // budget counts from here.)
            let attempt = std::time::Instant::now();
            if Self::take_over(inner, &owner).await? {
                let lost = Arc::new(AtomicBool::new(false));
                let confirmed = Arc::new(std::sync::Mutex::new(attempt));
                let renewal = tokio::spawn(renew(
                    inner.clone(),
                    owner.clone(),
                    lost.clone(),
                    confirmed.clone(),
                ));
                return Ok(Lease {
                    owner,
                    lost,
                    confirmed,
                    ttl,
                    renewal,
                });
            }
            if !wait {
                let holder = match inner.store.get(&path).await {
                    Ok(g) => owner_of(&g.bytes().await.unwrap_or_default()).1,
                    Err(_) => "unknown".into(),
                };
                return Err(Error::InUse {
                    resource: PathBuf::from(format!("{}/alkblobs.lock", inner.opts.location)),
                    holder,
                });
            }
            tokio::time::sleep(ttl / 3).await;
        }
    }

    /// Takes the lease over if it is absent or stale; false if it is held.
    async fn take_over(inner: &Arc<Inner>, owner: &str) -> Result<bool> {
        let path = inner.opts.location.lease();
        let current = match inner.store.get(&path).await {
            Ok(g) => g,
            // Released meanwhile: take it (conditionally where possible).
            Err(object_store::Error::NotFound { .. }) => {
                return Self::write(inner, owner, None).await;
            }
            Err(e) => return Err(inner.err("read the prefix's lease", e)),
        };
        let meta = current.meta.clone();
        let bytes = current.bytes().await.unwrap_or_default();
        let held = owner_of(&bytes).0;
        if held == owner {
            return Ok(true); // an unconditional write of ours, read back
        }
        if holder_is_dead_here(&String::from_utf8_lossy(&bytes)) {
            tracing::warn!(engine = %inner.display, "taking over the prefix lease of a process of this machine that no longer runs");
        } else {
            let age = server_now(inner)
                .await?
                .duration_since(SystemTime::from(meta.last_modified))
                .unwrap_or_default();
            if age < inner.opts.lease_ttl * 3 {
                return Ok(false);
            }
            tracing::warn!(engine = %inner.display, ?age, "taking over a stale prefix lease");
        }
        Self::write(
            inner,
            owner,
            Some(UpdateVersion {
                e_tag: meta.e_tag,
                version: meta.version,
            }),
        )
        .await
    }

    /// Writes the lease as `owner`: replacing exactly `previous` (or
    /// creating it) where the service has conditional puts; otherwise
    /// unconditionally, then read back.
    async fn write(
        inner: &Arc<Inner>,
        owner: &str,
        previous: Option<UpdateVersion>,
    ) -> Result<bool> {
        let path = inner.opts.location.lease();
        if inner.conditional.load(Ordering::Relaxed) {
            let mode = match previous {
                Some(v) => PutMode::Update(v),
                None => PutMode::Create,
            };
            let opts = PutOptions {
                mode,
                ..PutOptions::default()
            };
            match inner.store.put_opts(&path, body(owner), opts).await {
                Ok(_) => return Ok(true),
                Err(
                    object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. },
                ) => {
                    return Ok(false);
                }
                Err(e) if unsupported(&e) => inner.conditional.store(false, Ordering::Relaxed),
                Err(e) => return Err(inner.err("take the prefix's lease", e)),
            }
        }
        inner
            .store
            .put(&path, body(owner))
            .await
            .map_err(|e| inner.err("take the prefix's lease", e))?;
        // Another process that read the lease absent or stale just before
        // this write writes its own within one request's time: wait that
        // out, then the last writer's is what both read back.
        tokio::time::sleep(SETTLE.min(inner.opts.lease_ttl / 3)).await;
        let back = inner
            .store
            .get(&path)
            .await
            .map_err(|e| inner.err("read the prefix's lease", e))?;
        Ok(owner_of(&back.bytes().await.unwrap_or_default()).0 == owner)
    }

    /// Ok while the lease is this process's.
    ///
    /// A lease not renewed for a whole TTL (the service unreachable, the
    /// renewal task stalled, this process paused) is treated as lost until
    /// a renewal succeeds: another process may take it after three TTLs,
    /// so this one stops writing and deleting well before.
    pub(super) fn check(&self) -> Result<()> {
        if self.lost.load(Ordering::Acquire) {
            return Err(Error::InUse {
                resource: PathBuf::from("the S3 prefix's lease (alkblobs.lock)"),
                holder: "another process took it over; this one stopped writing".into(),
            });
        }
        let since = self
            .confirmed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed();
        if since > self.ttl {
            return Err(Error::Unavailable {
                engine: "s3".into(),
                source: format!(
                    "the prefix's lease was last renewed {since:?} ago (TTL {:?}): writes and deletes wait for a renewal",
                    self.ttl
                )
                .into(),
            });
        }
        Ok(())
    }

    /// Stops renewing and deletes the lease if it is still ours.
    ///
    /// The read and the delete are two requests: a process that read the
    /// lease as its own and then stalled (a slow answer, a paused process)
    /// would delete the lease of whoever took it over meanwhile, and a
    /// third process could then write beside that one. A takeover needs
    /// this process's last renewal three TTLs old by the service's clock
    /// (stamped after `confirmed`, which is when the renewal was sent), so
    /// the release runs only until two TTLs after it: what is not done by
    /// then is dropped and the lease left to lapse (three TTLs), as after
    /// a crash. The TTL left over covers a request already on its way.
    pub(super) async fn release(self, inner: &Arc<Inner>) {
        self.renewal.abort();
        let since = self
            .confirmed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed();
        let path = inner.opts.location.lease();
        let Some(budget) = (self.ttl * 2).checked_sub(since) else {
            tracing::warn!(engine = %inner.display, ?since, "the prefix's lease was last renewed too long ago to release safely; it lapses instead");
            return;
        };
        let released = tokio::time::timeout(budget, async {
            if let Ok(g) = inner.store.get(&path).await
                && owner_of(&g.bytes().await.unwrap_or_default()).0 == self.owner
            {
                let _ = inner.store.delete(&path).await;
            }
        })
        .await;
        if released.is_err() {
            tracing::warn!(engine = %inner.display, ?budget, "the prefix's lease could not be released in time; it lapses instead");
        }
    }

    /// Stops renewing; the lease expires on its own.
    pub(super) fn abandon(self) {
        self.renewal.abort();
    }
}

/// The service's clock: the last-modified time of an object written now.
async fn server_now(inner: &Arc<Inner>) -> Result<SystemTime> {
    let path = inner.opts.location.clock();
    inner
        .store
        .put(&path, PutPayload::from_static(b"clock\n"))
        .await
        .map_err(|e| inner.err("read the service's clock", e))?;
    let m = inner
        .store
        .head(&path)
        .await
        .map_err(|e| inner.err("read the service's clock", e))?;
    Ok(SystemTime::from(m.last_modified))
}

/// Renews the lease every third of its TTL; marks it lost when another
/// process holds it. Transient failures are retried at the next tick (the
/// lease only lapses after three TTLs).
async fn renew(
    inner: Arc<Inner>,
    owner: String,
    lost: Arc<AtomicBool>,
    confirmed: Arc<std::sync::Mutex<std::time::Instant>>,
) {
    let path = inner.opts.location.lease();
    let mut tick = tokio::time::interval(inner.opts.lease_ttl / 3);
    tick.tick().await;
    loop {
        tick.tick().await;
        let current = match inner.store.get(&path).await {
            Ok(g) => {
                let meta = g.meta.clone();
                (owner_of(&g.bytes().await.unwrap_or_default()).0, meta)
            }
            Err(object_store::Error::NotFound { .. }) => {
                // Deleted (by hand, or released and taken meanwhile): never
                // recreated blindly over a process that may be taking it
                // now. This store stops writing; reopen it.
                tracing::error!(engine = %inner.display, "the prefix's lease is gone; this store stops writing");
                lost.store(true, Ordering::Release);
                return;
            }
            Err(e) => {
                tracing::warn!(engine = %inner.display, error = %inner.err("renew the prefix's lease", e), "lease renewal failed; retrying");
                continue;
            }
        };
        if current.0 != owner {
            tracing::error!(engine = %inner.display, "another process took over the prefix's lease; this store stops writing");
            lost.store(true, Ordering::Release);
            return;
        }
        let opts = PutOptions {
            mode: if inner.conditional.load(Ordering::Relaxed) {
                PutMode::Update(UpdateVersion {
                    e_tag: current.1.e_tag,
                    version: current.1.version,
                })
            } else {
                PutMode::Overwrite
            },
            ..PutOptions::default()
        };
        let started = std::time::Instant::now();
        match inner.store.put_opts(&path, body(&owner), opts).await {
            Ok(_) => {
                *confirmed.lock().unwrap_or_else(|p| p.into_inner()) = started;
            }
            Err(object_store::Error::Precondition { .. }) => {
                // Replaced between the read and the write: the next round
                // reads whose it is.
            }
            Err(e) => {
                tracing::warn!(engine = %inner.display, error = %inner.err("renew the prefix's lease", e), "lease renewal failed; retrying");
            }
        }
    }
}
