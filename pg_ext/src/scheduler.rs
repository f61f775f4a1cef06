//! The sweep scheduler: one background worker per database named in
//! `alkblobs.scheduler_databases`, registered when the library is loaded
//! through `shared_preload_libraries` (the way pg_cron runs).
//!
//! Every `alkblobs.scheduler_naptime` the worker asks its database which
//! fleet pools are due (`alkblobs.scheduler_due()`: `sweep_every` has
//! passed since the last scheduled call) and runs each one's sweep as
//! bounded calls, one transaction each (`alkblobs.scheduled_sweep`, which
//! is the same `alkblobs.sweep_core` a psql user's `alkblobs_sweep` calls,
//! records every call in the sweep history and catches a sweep's error so
//! that it is recorded, logged and retried after `sweep_every`). A pool
//! whose sweeper lock a node holds is recorded as a skip
//! (`aborted = 'sweeper_lock'`), never waited for.
//!
//! Each run is claimed first (`alkblobs.scheduler_claim`, its own
//! transaction), so a run that takes the worker down does not make the
//! same pool first in line again after the restart. The worker connects as
//! the bootstrap superuser but calls the extension only after checking that
//! the functions it names belong to the installed extension, and only as
//! `alkblobs_owner` (a local user-id change that cannot be `RESET`, in a
//! security-restricted operation whose settings do not outlive the call
//! and which cannot queue deferred triggers: see `as_extension`); its
//! session pins READ
//! COMMITTED,
//! read-write, `search_path = pg_catalog` and `lock_timeout = 5s` over
//! whatever the database's or role's defaults say.
//!
//! The policy lives in SQL (`sql/api/91-scheduler.sql`); this file is the
//! loop: signals, configuration reloads, transactions, and nothing about
//! pools. SIGTERM (server shutdown, `pg_terminate_backend`) stops it after
//! the call in progress; an error that escapes a transaction (which the SQL
//! never lets a sweep do) exits the process with code 1 and the postmaster
//! starts it again after `RESTART_AFTER`: never a tight crash loop.

use std::ffi::CString;
use std::time::{Duration, Instant};

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::prelude::*;

/// `bgw_type`: what `pg_stat_activity.backend_type` shows for the worker
/// (and what `alkblobs.scheduler_state()` looks for).
const WORKER_TYPE: &str = "alkblobs scheduler";
/// How long the postmaster waits before restarting a worker that failed.
const RESTART_AFTER: Duration = Duration::from_secs(10);
/// At most this many calls per pool per run, and this long, before the
/// worker moves on to the next due pool (the rest waits for the next run).
const MAX_CALLS_PER_RUN: u32 = 100;
const MAX_RUN_TIME: Duration = Duration::from_secs(60);

static DATABASES: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static ENABLED: GucSetting<bool> = GucSetting::<bool>::new(true);
static NAPTIME_MS: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// Whether this process has the library through `shared_preload_libraries`
/// (set in the postmaster while it loads preloaded libraries; every backend
/// it forks inherits the value). A backend that loads the library on its
/// own (`CREATE EXTENSION`, the first call of one of its functions, `LOAD`)
/// on a server that does not preload it sees `false`: no scheduler runs.
static PRELOADED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the library was preloaded (see `PRELOADED`).
pub fn preloaded() -> bool {
    PRELOADED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Defines the reloadable GUCs (in every process that loads the library,
/// so that `SHOW alkblobs.scheduler_enabled` works everywhere) and, in the
/// postmaster while `shared_preload_libraries` is processed, the
/// postmaster-only `alkblobs.scheduler_databases` and one worker per
/// database named in it.
///
/// PostgreSQL refuses to define a `PGC_POSTMASTER` setting after startup,
/// at FATAL level (the session is killed): on a server that does not
/// preload the library, which is every server until its operator changes
/// `postgresql.conf`, `CREATE EXTENSION alkblobs` would fail. So that one is
/// defined only while preloading; elsewhere the scheduler is simply off
/// (`alkblobs_health` and a NOTICE at `CREATE EXTENSION` say so).
pub fn init() {
    // SAFETY: a plain read of a postmaster global set before _PG_init runs.
    let preloading = unsafe { pg_sys::process_shared_preload_libraries_in_progress };
    if preloading {
        PRELOADED.store(true, std::sync::atomic::Ordering::Relaxed);
        GucRegistry::define_string_guc(
            c"alkblobs.scheduler_databases",
            c"Databases whose alkblobs pools the scheduler sweeps (comma-separated).",
            c"One background worker per database; needs alkblobs in shared_preload_libraries and a restart.",
            &DATABASES,
            GucContext::Postmaster,
            GucFlags::default(),
        );
    }
    GucRegistry::define_bool_guc(
        c"alkblobs.scheduler_enabled",
        c"Whether the alkblobs scheduler sweeps pools whose sweep_every is due (off: paused).",
        c"Reloadable: ALTER SYSTEM SET alkblobs.scheduler_enabled = off; SELECT pg_reload_conf();",
        &ENABLED,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"alkblobs.scheduler_naptime",
        c"How often the alkblobs scheduler looks for due pools.",
        c"The finest useful sweep_every.",
        &NAPTIME_MS,
        100,
        60_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    if !preloading {
        return;
    }
    let names = DATABASES
        .get()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut served = Vec::new();
    for db in names.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if served.iter().any(|d| d == db) {
            continue;
        }
        BackgroundWorkerBuilder::new(&format!("alkblobs scheduler for {db}"))
            .set_type(WORKER_TYPE)
            .set_library("alkblobs")
            .set_function("alkblobs_scheduler_main")
            .set_extra(db)
            .enable_spi_access()
            .set_restart_time(Some(RESTART_AFTER))
            .load();
        served.push(db.to_owned());
    }
    if served.is_empty() {
        log!(
            "alkblobs: loaded through shared_preload_libraries, but alkblobs.scheduler_databases is empty: no pool is swept on a schedule"
        );
    }
}

/// Has the postmaster asked this process to stop? (Set by pgrx's SIGTERM
/// handler; unlike `BackgroundWorker::sigterm_received` it stays set.)
fn stopping() -> bool {
    // SAFETY: a volatile read of a flag the signal handler sets.
    unsafe { std::ptr::read_volatile(&raw const pg_sys::ShutdownRequestPending) != 0 }
}

/// Shows `what` in `pg_stat_activity.query` (state active), or idle.
fn report(what: Option<&str>) {
    let text = CString::new(what.unwrap_or("")).unwrap_or_default();
    let state = if what.is_some() {
        pg_sys::BackendState::STATE_RUNNING
    } else {
        pg_sys::BackendState::STATE_IDLE
    };
    // SAFETY: the string outlives the call, which copies it.
    unsafe { pg_sys::pgstat_report_activity(state, text.as_ptr()) };
}

/// Is this database's `alkblobs` schema the extension's, at 0.6.0 or
/// later? The worker is a superuser: before it calls anything in schema
/// `alkblobs` it checks that the functions it calls are members of the
/// installed extension (without this, a role allowed to create a schema in
/// a served database without the extension could plant an `alkblobs`
/// schema and have its functions run here). Pure catalog reads, every
/// function and operator schema-qualified: no search_path can redirect
/// them.
const READY: &str = "SELECT pg_catalog.count(*) OPERATOR(pg_catalog.=) 3 FROM pg_catalog.pg_depend d \
      JOIN pg_catalog.pg_extension x ON x.oid OPERATOR(pg_catalog.=) d.refobjid \
                                     AND x.extname OPERATOR(pg_catalog.=) 'alkblobs' \
     WHERE d.deptype OPERATOR(pg_catalog.=) 'e' \
       AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass \
       AND d.objid OPERATOR(pg_catalog.=) ANY (ARRAY[ \
           pg_catalog.to_regprocedure('alkblobs.scheduled_sweep(integer,boolean)')::pg_catalog.oid, \
           pg_catalog.to_regprocedure('alkblobs.scheduler_due()')::pg_catalog.oid, \
           pg_catalog.to_regprocedure('alkblobs.scheduler_claim(integer)')::pg_catalog.oid])";

/// The role the extension's functions run as.
const OWNER: &str = "SELECT r.oid FROM pg_catalog.pg_roles r \
     WHERE r.rolname OPERATOR(pg_catalog.=) 'alkblobs_owner'";

/// In a transaction: checks `READY`, then (if ready) runs `f` as
/// `alkblobs_owner` — the role the extension's own functions run as, so
/// nothing the worker calls ever runs with its superuser privileges,
/// whoever could redefine it. The switch is the one autovacuum and REFRESH
/// MATERIALIZED VIEW make (`SetUserIdAndSecContext` with
/// `SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION`), not
/// `SET ROLE`: code it runs cannot `RESET ROLE` back to the superuser, nor
/// leave temporary tables, `WITH HOLD` cursors, prepared statements or
/// `LISTEN`s in the worker's session. (A temporary function or a
/// session-level advisory lock it takes does outlive the call; neither is
/// reached by the worker, whose own statements name only schema-qualified
/// objects — `pg_temp` is never searched for functions or operators — and
/// which takes no advisory lock.) Nothing it does reaches past the switch
/// back:
/// - settings it changes, even with a plain session-level `SET`, are
///   rolled back before the switch (a GUC nest level, as REFRESH
///   MATERIALIZED VIEW does), so a `search_path` or `lock_timeout` it set
///   never governs the worker's own statements or its next call;
/// - it cannot queue a deferred trigger, which would fire at commit, as
///   the worker's superuser: PostgreSQL refuses one inside a
///   security-restricted operation (42501 at the end of the statement that
///   queued it; the transaction aborts and the worker restarts).
///
/// `None` when the extension is not there.
fn as_extension<R, F>(f: F) -> Option<R>
where
    F: FnOnce() -> R + std::panic::UnwindSafe + std::panic::RefUnwindSafe,
{
    BackgroundWorker::transaction(|| {
        let ready = Spi::get_one::<bool>(READY).ok().flatten().unwrap_or(false);
        if !ready {
            return None;
        }
        let owner = Spi::get_one::<pg_sys::Oid>(OWNER).ok().flatten()?;
        let (mut saved_user, mut saved_ctx) = (pg_sys::InvalidOid, 0);
        // SAFETY: the standard save/switch/restore of the current user
        // and of the settings inside a transaction; an error in `f` aborts
        // the transaction, which restores both on its own.
        let nest = unsafe {
            pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_ctx);
            pg_sys::SetUserIdAndSecContext(
                owner,
                saved_ctx
                    | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32
                    | pg_sys::SECURITY_RESTRICTED_OPERATION as i32,
            );
            pg_sys::NewGUCNestLevel()
        };
        let r = f();
        // SAFETY: as above.
        unsafe {
            pg_sys::AtEOXact_GUC(false, nest);
            pg_sys::SetUserIdAndSecContext(saved_user, saved_ctx);
        }
        Some(r)
    })
}

/// The pools due now, or nothing when this database has no alkblobs
/// extension at a version with a scheduler (logged once per state change).
fn due_pools(missing: &mut Option<bool>) -> Vec<i32> {
    let due = as_extension(|| {
        Spi::connect(|c| {
            c.select("SELECT alkblobs.scheduler_due()", None, &[])
                .map(|rows| {
                    rows.filter_map(|r| r.get::<i32>(1).ok().flatten())
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        })
    });
    let ready = due.is_some();
    if *missing != Some(!ready) {
        if !ready {
            log!(
                "alkblobs scheduler: database \"{}\" has no alkblobs extension at 0.6.0 or later (CREATE EXTENSION alkblobs, or ALTER EXTENSION alkblobs UPDATE); checking again every naptime",
                BackgroundWorker::get_extra()
            );
        }
        *missing = Some(!ready);
    }
    due.unwrap_or_default()
}

/// Claims a run of `pool` (committed before its first call); false if the
/// extension went away.
fn claim(pool: i32) -> bool {
    as_extension(|| {
        Spi::connect_mut(|c| {
            c.update(
                "SELECT alkblobs.scheduler_claim($1)",
                Some(1),
                &[pool.into()],
            )
            .ok()
            .and_then(|t| t.first().get::<bool>(1).ok().flatten())
            .unwrap_or(false)
        })
    })
    .unwrap_or(false)
}

/// One scheduled call; returns the next call's `mark`, or None when the
/// pool's run is over.
fn sweep_call(pool: i32, mark: bool) -> Option<bool> {
    as_extension(|| {
        Spi::connect_mut(|c| {
            c.update(
                "SELECT alkblobs.scheduled_sweep($1, $2)",
                Some(1),
                &[pool.into(), mark.into()],
            )
            .ok()
            .and_then(|t| t.first().get::<bool>(1).ok().flatten())
        })
    })
    .flatten()
}

/// Applies a pending configuration reload; whether scheduling is on.
fn reload_and_enabled() -> bool {
    if BackgroundWorker::sighup_received() {
        // SAFETY: the standard reload, outside any transaction.
        unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
    }
    ENABLED.get()
}

/// The worker's main function (named in its registration).
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn alkblobs_scheduler_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let db = BackgroundWorker::get_extra().to_owned();
    BackgroundWorker::connect_worker_to_spi(Some(&db), None);
    BackgroundWorker::transaction(|| {
        // Lock waits are bounded (the sweep itself never waits for the
        // sweeper lock); the name is what the history's application_name
        // column and pg_stat_activity show. The sweep runs only in READ
        // COMMITTED and writes: database or role defaults saying otherwise
        // (ALTER DATABASE … SET default_transaction_isolation) must not
        // stop it. Everything it names is schema-qualified.
        Spi::run(
            "SET application_name = 'alkblobs scheduler'; SET lock_timeout = '5s'; \
             SET search_path = pg_catalog; SET default_transaction_isolation = 'read committed'; \
             SET default_transaction_read_only = off",
        )
    })
    .unwrap_or_else(|e| warning!("alkblobs scheduler: cannot configure its session: {e}"));
    log!("alkblobs scheduler started for database \"{db}\"");
    let mut missing = None;
    let mut paused_logged = false;
    'serve: while !stopping() && BackgroundWorker::wait_latch(Some(naptime())) {
        if !reload_and_enabled() {
            if !paused_logged {
                log!("alkblobs scheduler: paused (alkblobs.scheduler_enabled = off)");
                paused_logged = true;
            }
            continue;
        }
        if paused_logged {
            log!("alkblobs scheduler: resumed");
            paused_logged = false;
        }
        for pool in due_pools(&mut missing) {
            if stopping() {
                break 'serve;
            }
            if !reload_and_enabled() || !claim(pool) {
                continue;
            }
            let started = Instant::now();
            let mut mark = Some(true);
            let mut calls = 0;
            while let Some(m) = mark {
                if stopping() {
                    break 'serve;
                }
                if !reload_and_enabled() {
                    break;
                }
                report(Some(&format!(
                    "alkblobs scheduler: sweeping pool id {pool}"
                )));
                mark = sweep_call(pool, m);
                calls += 1;
                if calls >= MAX_CALLS_PER_RUN || started.elapsed() >= MAX_RUN_TIME {
                    break;
                }
            }
            report(None);
        }
    }
    log!("alkblobs scheduler for database \"{db}\" stopping");
    // Exit code 1: if the server is not shutting down (someone ran
    // pg_terminate_backend), the postmaster starts a new worker after
    // RESTART_AFTER. (Code 0 would unregister it until the next server
    // start; pausing is alkblobs.scheduler_enabled's job.)
    // SAFETY: proc_exit runs the exit callbacks and never returns.
    unsafe { pg_sys::proc_exit(1) };
}

fn naptime() -> Duration {
    Duration::from_millis(NAPTIME_MS.get().clamp(100, 60_000) as u64)
}
