//! `pool create | ls | alter`: pools in a PostgreSQL database (the
//! connecting role needs `alkblobs_admin` to create or change one).

use std::time::Duration;

use alkblobs::backend::postgres::{PgPool, PoolInfo, PoolSettings};
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
        // Where large content goes: the global --large (pg-lo, the default;
        // local; none). A fleet pool: the global --fleet.
    },
    /// List the pools this role may read.
    Ls,
    /// Change a pool's window or TTL.
    Alter {
        /// The pool.
        name: String,
        /// New delete window.
        #[arg(long, value_parser = humantime::parse_duration)]
        window: Option<Duration>,
        /// New pin TTL.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<Duration>,
    },
}

#[derive(serde::Serialize)]
struct PoolRow<'a> {
    pool: &'a str,
    mode: &'a str,
    large_tier: &'a str,
    delete_window_secs: f64,
    pin_ttl_secs: f64,
}

fn row(p: &PoolInfo) -> PoolRow<'_> {
    PoolRow {
        pool: &p.name,
        mode: &p.mode,
        large_tier: &p.large_tier,
        delete_window_secs: p.delete_window.as_secs_f64(),
        pin_ttl_secs: p.pin_ttl.as_secs_f64(),
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
        PoolCmd::Create { name, window, ttl } => {
            // --fleet: a fleet pool (several instances; the extension sweeps
            // it); without: a single-instance pool (this CLI's stores).
            let mut s = PoolSettings::new().single_instance(!pg.fleet);
            let large = match &pg.large {
                PgLarge::FromPool => None,
                PgLarge::PgLo => Some("pg-lo"),
                PgLarge::None => Some("none"),
                _ => Some("local"),
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
            db.create_pool(name, &s).await?;
            if !ctx.json {
                println!("created pool {name}");
            }
            Ok(())
        }
        PoolCmd::Ls => {
            let pools = db.pools().await?;
            if ctx.json {
                return print_json(&pools.iter().map(row).collect::<Vec<_>>());
            }
            println!(
                "{:<24} {:<7} {:<6} {:>10} {:>10}",
                "pool", "mode", "large", "window", "ttl"
            );
            for p in &pools {
                println!(
                    "{:<24} {:<7} {:<6} {:>10} {:>10}",
                    p.name,
                    p.mode,
                    p.large_tier,
                    humantime::format_duration(p.delete_window).to_string(),
                    humantime::format_duration(p.pin_ttl).to_string()
                );
            }
            Ok(())
        }
        PoolCmd::Alter { name, window, ttl } => {
            if window.is_none() && ttl.is_none() {
                return Err(Fail::new(
                    Exit::BadInput,
                    "pool alter: give --window and/or --ttl",
                ));
            }
            db.alter_pool(name, *window, *ttl).await?;
            Ok(())
        }
    }
}
