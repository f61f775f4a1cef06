//! `alkblobs`: the command line for people.
//!
//! Works on the embedded default store (sqlite + local files under a data
//! directory, no server), or on a single-instance pool in PostgreSQL
//! (`--postgres URL --pool NAME`). The exit codes are [`exit::Exit`], printed by
//! `--help`. One module per command; `ctx` opens the store, `output` prints.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use alkblobs::Key;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

mod ctx;
mod exit;
mod explain;
mod gc;
mod get;
mod ls;
mod output;
mod pool;
mod put;
mod roots;
mod serve;
mod staged;
mod stat;
mod usage;
mod verify;

use alkblobs::backend::routed::RoutedOptions;
use alkblobs::backend::s3::{S3Location, S3Options};
use alkblobs::store::postgres::PgLarge;
use ctx::{Ctx, PgTarget};
use exit::{Exit, Fail, Res, key_arg};
use roots::RootsCmd;

#[derive(Parser)]
#[command(
    name = "alkblobs",
    version,
    about = "A content-addressed, deduplicated, garbage-collected blob store"
)]
struct Cli {
    /// The store's data directory (sqlite index + large files).
    #[arg(long, global = true, env = "ALKBLOBS_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    json: bool,
    /// Wait for another process to release the store instead of failing.
    #[arg(long, global = true)]
    wait: bool,
    /// No progress bars.
    #[arg(long, short, global = true)]
    quiet: bool,
    /// A PostgreSQL database (URL, `sslmode`/`sslrootcert` as in libpq)
    /// holding the store's pool, instead of the data directory.
    #[arg(long, global = true, env = "ALKBLOBS_POSTGRES", value_name = "URL")]
    postgres: Option<String>,
    /// The pool in that database.
    #[arg(
        long,
        global = true,
        env = "ALKBLOBS_POOL",
        default_value = "default",
        value_name = "NAME"
    )]
    pool: String,
    /// The large tier: s3://BUCKET/PREFIX (objects on S3; endpoint and
    /// credentials from the AWS environment), or for a PostgreSQL store
    /// pg-lo, none or local=DIR (the pool's own if not given; it must match
    /// the pool's), or for a fleet node routed=URL (the pool's tier through
    /// a storage node's `alkblobs serve`; its token in ALKBLOBS_ROUTED_TOKEN,
    /// a CA file in ALKBLOBS_ROUTED_CA). For `pool create`: the new pool's (pg-lo if not given;
    /// `local` alone; s3://BUCKET/PREFIX records the pool's location).
    #[arg(long, global = true, value_name = "TIER", value_parser = large_arg)]
    large: Option<PgLarge>,
    /// The S3 service's URL for --large s3://… (default: AWS_ENDPOINT_URL,
    /// then the AWS profile's endpoint_url, then AWS itself).
    #[arg(long, global = true, value_name = "URL")]
    s3_endpoint: Option<String>,
    /// Fleet mode: this process is one of many store instances sharing the
    /// pool (pins are rows renewed by this process, sweeps run in the
    /// database). Needs --postgres and an explicit --large (the
    /// fleet-validity rule); --large local=DIR also needs --shared-media.
    #[arg(long, global = true, env = "ALKBLOBS_FLEET")]
    fleet: bool,
    /// With --fleet --large local=DIR: asserts that DIR is the same
    /// fleet-shared media on every node (atomic rename, close-to-open
    /// consistency).
    #[arg(long, global = true)]
    shared_media: bool,
    #[command(subcommand)]
    command: Command,
}

/// Every command but `put`, `roots add` and `serve --create` needs a store
/// at the data directory and fails with "no store at DIR" (exit 3) where
/// there is none.
#[derive(Subcommand)]
enum Command {
    /// Store files (or `-` for stdin), creating the store if need be; prints
    /// each key on its own line.
    Put {
        /// Files to store; `-` reads standard input. A file that cannot be
        /// read is reported at the end (exit 2) after the others are stored.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Also record each key as a root, so no sweep collects it.
        #[arg(long)]
        root: bool,
        /// Store every file under each directory given, recursively (with
        /// --json, each path paired with its key).
        #[arg(short, long)]
        recursive: bool,
    },
    /// Write a blob to stdout or a file, verifying its hash.
    Get {
        /// The key (64 hex characters).
        #[arg(value_parser = key_arg)]
        key: Key,
        /// Write to FILE (atomically, only if the content verifies).
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Only bytes START to END, END inclusive as in HTTP (`START-END`,
        /// `START-` to the end, `-N` the last N), verified through the
        /// blob's outboard without reading the rest.
        #[arg(long, value_name = "START-END", value_parser = get::range_arg, allow_hyphen_values = true)]
        range: Option<get::ByteRange>,
    },
    /// Show a blob's size and tier.
    Stat {
        /// The key.
        #[arg(value_parser = key_arg)]
        key: Key,
    },
    /// List every key, streamed (with --json, one array).
    Ls {
        /// Also show size and tier.
        #[arg(short, long)]
        long: bool,
    },
    /// Re-hash every blob the store must hold; exit 4 and name each corrupt
    /// or missing key. A PostgreSQL pool is checked against its record
    /// (every entry, published file, root and liveness row), an embedded
    /// store against its engines and roots.
    Verify {
        /// Store the BLAKE3 outboard of every intact large blob that has
        /// none (stored before outboards) or a damaged one, so its ranges
        /// verify without reading it whole.
        #[arg(long)]
        repair_outboards: bool,
        /// Blobs read and hashed at once.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=256))]
        jobs: u16,
        /// Only keys after this one: resume a run where it stopped (the
        /// last key it reached), or verify a slice.
        #[arg(long, value_name = "KEY")]
        after: Option<Key>,
        /// Only keys up to this one (inclusive).
        #[arg(long, value_name = "KEY")]
        until: Option<Key>,
    },
    /// Entries and bytes per tier, and the database's size on disk.
    Usage,
    /// Give the space collected blobs left back to the filesystem: rewrite
    /// the store's database without its free pages. A store made by 0.8 or
    /// later does this after every gc on its own; an older one needs it
    /// once. Needs room for a copy of the database; puts wait meanwhile.
    Compact,
    /// Manage roots: keys the garbage collector treats as live.
    Roots {
        #[command(subcommand)]
        action: RootsCmd,
    },
    /// Collect unreferenced blobs.
    Gc {
        /// A file of extra root keys for this run, one per line.
        #[arg(long = "roots", value_name = "FILE")]
        roots_files: Vec<PathBuf>,
        /// Delete window (e.g. 0s, 5m) for candidates this run stages; candidates
        /// staged earlier with a later deadline are moved to it.
        #[arg(long, value_parser = humantime::parse_duration)]
        window: Option<Duration>,
        /// Report what would be staged; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Show staged delete candidates and when they become due.
    Staged,
    /// Why a blob is or is not live: entry, root, staged row and deadline,
    /// window, verdict (exit 3 if the pool does not hold it).
    Explain {
        /// The key.
        #[arg(value_parser = key_arg)]
        key: Key,
    },
    /// Create, list and change pools in PostgreSQL (needs --postgres).
    Pool {
        #[command(subcommand)]
        action: pool::PoolCmd,
    },
    /// Serve this store over HTTP (`PUT`/`POST`/`GET`/`HEAD /blobs…`) until
    /// SIGTERM or Ctrl-C; docs/operations.md, "alkblobs serve".
    Serve(serve::ServeArgs),
}

fn large_arg(s: &str) -> Result<PgLarge, String> {
    match s {
        "pg-lo" => Ok(PgLarge::PgLo),
        "none" => Ok(PgLarge::None),
        // Bare `local` names the tier (`pool create`); a store needs the
        // directory.
        "local" => Ok(PgLarge::Local(PathBuf::new())),
        other if other.starts_with("s3://") => other
            .parse::<S3Location>()
            .map(|l| PgLarge::S3(S3Options::new(l)))
            .map_err(|e| e.to_string()),
        other if other.starts_with("routed=") => {
            let url = &other["routed=".len()..];
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!(
                    "{other:?}: routed=URL names a storage node's http:// or https:// URL"
                ));
            }
            // The node's token and CA from the environment (never argv).
            let mut o = RoutedOptions::new(url);
            if let Ok(t) = std::env::var("ALKBLOBS_ROUTED_TOKEN") {
                o = o.token(t);
            }
            if let Ok(ca) = std::env::var("ALKBLOBS_ROUTED_CA") {
                o = o.ca_file(ca);
            }
            Ok(PgLarge::Routed(o))
        }
        other => match other.strip_prefix("local=") {
            Some(dir) if !dir.is_empty() => Ok(PgLarge::Local(PathBuf::from(dir))),
            _ => Err(format!(
                "{other:?} is not pg-lo, none, local, local=DIR, routed=URL or s3://BUCKET/PREFIX"
            )),
        },
    }
}

fn default_data_dir() -> PathBuf {
    dirs::data_dir()
        .unwrap_or_else(|| PathBuf::from("."))
        .join("alkblobs")
}

async fn run(cli: Cli) -> Res {
    if (cli.fleet || cli.shared_media) && cli.postgres.is_none() {
        return Err(Fail::new(
            Exit::BadInput,
            "--fleet and --shared-media need --postgres URL (a fleet shares a pool in PostgreSQL)",
        ));
    }
    let large = match (cli.large.clone(), &cli.s3_endpoint) {
        (Some(PgLarge::S3(o)), Some(url)) => Some(PgLarge::S3(o.endpoint(url))),
        (_, Some(_)) => {
            return Err(Fail::new(
                Exit::BadInput,
                "--s3-endpoint is the service of --large s3://BUCKET/PREFIX: give both",
            ));
        }
        (large, None) => large,
    };
    if cli.postgres.is_none() && !matches!(large, None | Some(PgLarge::S3(_))) {
        return Err(Fail::new(
            Exit::BadInput,
            "an embedded store (--data-dir) keeps large content in DIR/large or, with --large s3://BUCKET/PREFIX, on S3; pg-lo, none and local=DIR are PostgreSQL stores' tiers (--postgres)",
        ));
    }
    let ctx = Ctx {
        dir: cli.data_dir.clone().unwrap_or_else(default_data_dir),
        s3: match (&cli.postgres, &large) {
            (None, Some(PgLarge::S3(o))) => Some(o.clone()),
            _ => None,
        },
        pg: cli.postgres.clone().map(|url| PgTarget {
            url,
            pool: cli.pool.clone(),
            large: large.clone().unwrap_or(PgLarge::FromPool),
            fleet: cli.fleet,
            shared_media: cli.shared_media,
        }),
        json: cli.json,
        wait: cli.wait,
        progress: !cli.quiet && std::io::stderr().is_terminal(),
        opened: Default::default(),
    };
    let result = match &cli.command {
        Command::Put {
            files,
            root,
            recursive,
        } => put::put(&ctx, files, *root, *recursive).await,
        Command::Get { key, output, range } => {
            get::get(&ctx, *key, output.as_deref(), *range).await
        }
        Command::Stat { key } => stat::stat(&ctx, *key).await,
        Command::Ls { long } => ls::ls(&ctx, *long).await,
        Command::Verify {
            repair_outboards,
            jobs,
            after,
            until,
        } => {
            let opts = alkblobs::VerifyOptions::default()
                .repair_outboards(*repair_outboards)
                .jobs(usize::from(*jobs))
                .after(*after)
                .until(*until);
            verify::verify(&ctx, opts).await
        }
        Command::Usage => usage::usage(&ctx).await,
        Command::Compact => usage::compact(&ctx).await,
        Command::Roots { action } => roots::roots(&ctx, action).await,
        Command::Gc {
            roots_files,
            window,
            dry_run,
        } => gc::gc(&ctx, roots_files, *window, *dry_run).await,
        Command::Staged => staged::staged(&ctx).await,
        Command::Pool { action } => pool::pool(&ctx, action).await,
        Command::Explain { key } => explain::explain(&ctx, *key).await,
        Command::Serve(args) => serve::serve(&ctx, args).await,
    };
    // Release what the stores hold outside this process (an S3 prefix's
    // lease; a fleet's pin rows), so the next command need not wait for
    // them to expire.
    ctx.close().await;
    result
}

fn main() -> ExitCode {
    let parsed = Cli::command()
        .after_help(exit::help_table())
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => return exit::usage_error(e),
    };
    let serving = matches!(cli.command, Command::Serve(_));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ALKBLOBS_LOG").unwrap_or_else(|_| {
                // `serve` logs every request (its access log).
                tracing_subscriber::EnvFilter::new(if serving {
                    "warn,alkblobs::access=info"
                } else {
                    "warn"
                })
            }),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("alkblobs: error: cannot start the runtime: {e}");
            return Exit::Failure.into();
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => Exit::Ok.into(),
        Err(f) => {
            eprintln!("alkblobs: error: {}", f.message);
            f.exit.into()
        }
    }
}
