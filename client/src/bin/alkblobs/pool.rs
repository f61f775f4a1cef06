//! `pool create | ls | alter | status`: pools in a PostgreSQL database
//! (the connecting role needs `alkblobs_admin` to create or change one).

use std::time::Duration;

use alkblobs::backend::postgres::{
    EXTENSION_VERSION, Flavour, PgPool, PoolInfo, PoolLargeTier, PoolSettings,
};
use alkblobs::store::postgres::PgLarge;
use clap::Subcommand;

use crate::ctx::Ctx;
use crate::exit::{Exit, Fail, Res};
use crate::output::print_json;

#[derive(Subcommand)]
pub enum PoolCmd {
    /// Create a pool.
    Create {
        /// Its name (letters, digits, `_.:-`).
        name: String,
        /// Delete window (e.g. 5m): how long a staged candidate waits.
        #[arg(long, value_parser = humantime::parse_duration)]
        window: Option<Duration>,
        /// Pin TTL (e.g. 60s): how long a fleet pin protects unrenewed.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<Duration>,
        /// Fleet pools: the extension's scheduler sweeps it this often
        /// (e.g. 5m; default: only when a node or an operator sweeps).
        #[arg(long, value_parser = humantime::parse_duration)]
        sweep_every: Option<Duration>,
        /// A single-instance pool: one store instance (`--postgres` without
        /// `--fleet`) owns it and sweeps it. The other choice is the global
        /// `--fleet`: a pool many instances share, swept in the database.
        /// One of the two is required (`alkblobs_create_pool` makes a
        /// fleet pool unless told `single_instance => true`).
        #[arg(long)]
        single_instance: bool,
        // Where large content goes: the global --large (pg-lo, the default;
        // local; s3://BUCKET/PREFIX; none).
    },
    /// List the pools this role may read.
    Ls,
    /// Change a pool's window, TTL or schedule.
    Alter {
        /// The pool.
        name: String,
        /// New delete window.
        #[arg(long, value_parser = humantime::parse_duration)]
        window: Option<Duration>,
        /// New pin TTL.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<Duration>,
        /// New schedule (e.g. 5m), or `off` for manual sweeps only.
        #[arg(long, value_parser = every_arg)]
        sweep_every: Option<Every>,
    },
    /// Health of every pool this role may read (or one): whether its
    /// collector runs, and what is piling up. Exits 7 if a pool is
    /// critical (for cron jobs and health checks).
    Status {
        /// Just this pool.
        name: Option<String>,
    },
}

/// A `--sweep-every` value: a duration, or `off`.
#[derive(Clone, Copy)]
pub struct Every(Option<Duration>);

fn every_arg(s: &str) -> Result<Every, humantime::DurationError> {
    match s.trim() {
        "off" | "manual" | "0" => Ok(Every(None)),
        d => humantime::parse_duration(d).map(|d| Every(Some(d))),
    }
}

#[derive(serde::Serialize)]
struct PoolRow<'a> {
    pool: &'a str,
    mode: &'a str,
    large_tier: &'a str,
    delete_window_secs: f64,
    pin_ttl_secs: f64,
    sweep_every_secs: Option<f64>,
}

fn row(p: &PoolInfo) -> PoolRow<'_> {
    PoolRow {
        pool: &p.name,
        mode: p.mode.as_str(),
        large_tier: p.large_tier.as_str(),
        delete_window_secs: p.delete_window.as_secs_f64(),
        pin_ttl_secs: p.pin_ttl.as_secs_f64(),
        sweep_every_secs: p.sweep_every.map(|d| d.as_secs_f64()),
    }
}

pub async fn pool(ctx: &Ctx, cmd: &PoolCmd) -> Res {
    let Some(pg) = &ctx.pg else {
        return Err(Fail::new(
            Exit::BadInput,
            "pools live in PostgreSQL: give --postgres URL (or ALKBLOBS_POSTGRES)",
        ));
    };
    let db = PgPool::connect_db(&pg.url).await?;
    match cmd {
        PoolCmd::Create {
            name,
            window,
            ttl,
            sweep_every,
            single_instance,
        } => {
            // A required choice: the SQL default (fleet) and the CLI's own
            // default topology (--postgres alone: single-instance) differ,
            // so neither is guessed.
            match (pg.fleet, *single_instance) {
                (true, true) => {
                    return Err(Fail::new(
                        Exit::BadInput,
                        "--fleet and --single-instance contradict each other: a pool is one or the other",
                    ));
                }
                (false, false) => {
                    return Err(Fail::new(
                        Exit::BadInput,
                        format!(
                            "say which kind of pool {name:?} is: --fleet (many store instances share it; the database sweeps it) \
                             or --single-instance (one store instance, `--postgres` without `--fleet`, owns and sweeps it)"
                        ),
                    ));
                }
                _ => {}
            }
            let mut s = PoolSettings::new().single_instance(*single_instance);
            let large = match &pg.large {
                PgLarge::FromPool => None,
                PgLarge::PgLo => Some(PoolLargeTier::PgLo),
                PgLarge::None => Some(PoolLargeTier::None),
                PgLarge::S3(o) => {
                    s = s.s3(o.location.to_string());
                    None
                }
                _ => Some(PoolLargeTier::Local),
            };
            if let Some(w) = window {
                s = s.delete_window(*w);
            }
            if let Some(t) = ttl {
                s = s.pin_ttl(*t);
            }
            if let Some(l) = large {
                s = s.large_tier(l);
            }
            if let Some(e) = sweep_every {
                s = s.sweep_every(*e);
            }
            db.create_pool(name, &s).await?;
            if !ctx.json {
                println!("created pool {name}");
            }
            if sweep_every.is_some() {
                warn_if_unscheduled(&db, name).await?;
            }
            Ok(())
        }
        PoolCmd::Ls => {
            let pools = db.pools().await?;
            if ctx.json {
                return print_json(&pools.iter().map(row).collect::<Vec<_>>());
            }
            println!(
                "{:<24} {:<7} {:<6} {:>10} {:>10} {:>12}",
                "pool", "mode", "large", "window", "ttl", "sweep every"
            );
            for p in &pools {
                println!(
                    "{:<24} {:<7} {:<6} {:>10} {:>10} {:>12}",
                    p.name,
                    p.mode,
                    p.large_tier,
                    humantime::format_duration(p.delete_window).to_string(),
                    humantime::format_duration(p.pin_ttl).to_string(),
                    p.sweep_every
                        .map(|d| humantime::format_duration(d).to_string())
                        .unwrap_or_else(|| "manual".into())
                );
            }
            Ok(())
        }
        PoolCmd::Alter {
            name,
            window,
            ttl,
            sweep_every,
        } => {
            if window.is_none() && ttl.is_none() && sweep_every.is_none() {
                return Err(Fail::new(
                    Exit::BadInput,
                    "pool alter: give --window, --ttl and/or --sweep-every",
                ));
            }
            if window.is_some() || ttl.is_some() {
                db.alter_pool(name, *window, *ttl).await?;
            }
            if let Some(Every(e)) = sweep_every {
                db.set_sweep_every(name, *e).await?;
                if e.is_some() {
                    warn_if_unscheduled(&db, name).await?;
                }
            }
            Ok(())
        }
        PoolCmd::Status { name } => status(ctx, &db, name.as_deref()).await,
    }
}

/// Says on stderr when nothing will run pool `name`'s `sweep_every` (no
/// scheduler serves the database, and no pg_cron job has started a run):
/// the reason `alkblobs_health` gives, which `pool status` shows later.
async fn warn_if_unscheduled(db: &PgPool, name: &str) -> Res {
    for h in db.health(Some(name)).await? {
        if h.scheduler == "on" || h.scheduler == "pg_cron" {
            continue;
        }
        for r in h.reasons.iter().filter(|r| r.starts_with("sweep_every is")) {
            eprintln!(
                "warning: pool {name}: {r}; nothing sweeps it until a node or an operator does"
            );
        }
    }
    Ok(())
}

/// `pool status`: the extension's `alkblobs_health`, as a table or JSON;
/// exit 7 if any pool shown is critical.
async fn status(ctx: &Ctx, db: &PgPool, name: Option<&str>) -> Res {
    let rows = db.health(name).await?;
    if let Some(n) = name
        && rows.is_empty()
    {
        return Err(Fail::new(
            Exit::NotFound,
            format!("no pool {n:?} that this role may read"),
        ));
    }
    if ctx.json {
        print_json(&rows)?;
    } else {
        let flavour = match rows.first() {
            Some(h) => h.flavour,
            None => db.flavour().await?,
        };
        println!(
            "{}: alkblobs {EXTENSION_VERSION}, {flavour} flavour{}",
            db.to_string().trim_start_matches('@'),
            match flavour {
                Flavour::SqlOnly =>
                    " (keys trusted, not verified by the server; sweeps scheduled by pg_cron)",
                _ => "",
            }
        );
        let age = |s: Option<f64>| {
            s.map(|s| humantime::format_duration(Duration::from_secs(s as u64)).to_string())
                .unwrap_or_else(|| "never".into())
        };
        println!(
            "{:<24} {:<8} {:<10} {:>12} {:>14}  last outcome",
            "pool", "status", "scheduler", "sweep every", "last sweep ago"
        );
        for h in &rows {
            println!(
                "{:<24} {:<8} {:<10} {:>12} {:>14}  {}",
                h.pool,
                h.status,
                h.scheduler,
                h.sweep_every_secs
                    .map(|s| humantime::format_duration(Duration::from_secs_f64(s)).to_string())
                    .unwrap_or_else(|| "manual".into()),
                age(h.last_sweep_age_secs),
                h.last_outcome.as_deref().unwrap_or("-")
            );
            for r in &h.reasons {
                println!("    {r}");
            }
        }
    }
    let critical: Vec<&str> = rows
        .iter()
        .filter(|h| h.status == "critical")
        .map(|h| h.pool.as_str())
        .collect();
    if critical.is_empty() {
        Ok(())
    } else {
        Err(Fail::new(
            Exit::Critical,
            format!("critical: {}", critical.join(", ")),
        ))
    }
}
