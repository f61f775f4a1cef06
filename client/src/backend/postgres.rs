//! The `postgres` kv engine and the `pg-lo` large engine (feature
//! `postgres`): a pool's entries in the `alkblobs` extension's tables,
//! reached only through the extension's SQL functions, over tokio-postgres
//! and a deadpool connection pool.
//!
//! Both engines are views of one pool: `postgres` holds the entries of tier
//! `kv` (values inline), `pg-lo` those of tier `lo` (large objects, the
//! `entries` row being the companion-table authority). Every statement is
//! sent with `query_typed` (explicit parameter types, an unnamed statement,
//! one round trip): no named prepared statement outlives its transaction, so
//! the engines also work through a transaction-mode connection pooler.
//!
//! Engines store and delete what they are told. In a single-instance pool
//! (`alkblobs_create_pool(…, single_instance => true)`) puts carry no pin
//! (`owner => NULL`): the store's in-process arbiter pins and sweeps. In a
//! fleet pool every put carries the pin of its store instance
//! ([`PgPool::pinning_for`]), so the entry row and the pin row commit in
//! one transaction; the fleet arbiter renews and releases those rows and
//! the extension sweeps.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use futures::StreamExt;
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::{Backend, BlobReader, KeyStream, LargeBackend, PutOutcome, Sharing, StagedWrite};
use crate::{Error, Key, Result};

/// The extension version this client speaks.
pub const EXTENSION_VERSION: &str = "0.8.0";

/// How many times a call the database refused as a retryable conflict
/// (40001, 40P01) is tried before the error is returned.
const ATTEMPTS: u32 = 3;
/// Keys per `alkblobs_list` page.
const PAGE: i32 = 10_000;
/// Bytes per `alkblobs_lo_write` / `alkblobs_lo_read` call (the server
/// reads and writes a large object in 2 KiB pages either way; bigger
/// windows only save round trips and per-call overhead).
const WINDOW: usize = 4 << 20;
/// Bytes per `alkblobs_put_many` call (values travel in one message).
const BATCH_BYTES: usize = 16 << 20;

/// How to reach a pool.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PgOptions {
    /// A libpq-style URL or key=value string (`postgresql://user@host/db`).
    /// `sslmode` has libpq's meanings (`disable`, `allow`, `prefer` — the
    /// default —, `require`, `verify-ca`, `verify-full`) and `sslrootcert`
    /// names a PEM file of roots (else the system's are used for the
    /// verifying modes); TLS is rustls.
    pub url: String,
    /// The pool's name (`alkblobs_create_pool`).
    pub pool: String,
    /// Connections kept open (default 16).
    pub max_connections: usize,
}

impl PgOptions {
    /// Options for `pool` at `url`.
    pub fn new(url: impl Into<String>, pool: impl Into<String>) -> PgOptions {
        PgOptions {
            url: url.into(),
            pool: pool.into(),
            max_connections: 16,
        }
    }

    /// Connections kept open.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }
}

/// What the database says about a pool (`alkblobs_pools`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolInfo {
    /// The pool's name.
    pub name: String,
    /// `fleet` or `single`.
    pub mode: String,
    /// `pg-lo`, `local` or `none`.
    pub large_tier: String,
    /// The pool's delete window.
    pub delete_window: Duration,
    /// The pool's pin TTL.
    pub pin_ttl: Duration,
    /// How often the extension's scheduler sweeps the pool (`None`: only
    /// when a node or an operator does).
    pub sweep_every: Option<Duration>,
}

/// One pool's row of `alkblobs_health` ([`PgPool::health`]): is its
/// collector running, and is anything piling up? docs/operations.md,
/// "Health", has the thresholds.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct PoolHealth {
    /// The pool.
    pub pool: String,
    /// `ok`, `warn` or `critical`.
    pub status: String,
    /// Why it is not `ok`, one sentence each.
    pub reasons: Vec<String>,
    /// `fleet` or `single`.
    pub mode: String,
    /// The pool's schedule, in seconds (`None`: manual).
    pub sweep_every_secs: Option<f64>,
    /// `on`, `paused`, `off` (nothing serves this database), `manual` or
    /// `owner instance` (single-instance pools).
    pub scheduler: String,
    /// Seconds since the last completed sweep (`None`: never swept).
    pub last_sweep_age_secs: Option<f64>,
    /// `ok`, `aborted: <cause>` or `error: <SQLSTATE: message>` of the
    /// last sweep call.
    pub last_outcome: Option<String>,
    /// Staged rows due for longer than the warn threshold.
    pub overdue_staged: i64,
    /// Pins expired for longer than the warn threshold.
    pub expired_pins: i64,
    /// Uploads whose transaction ended without a commit, and their bytes.
    pub abandoned_uploads: i64,
    /// Bytes of those uploads.
    pub abandoned_upload_bytes: i64,
    /// Registered liveness tables that fail validation.
    pub invalid_sources: i64,
}

/// A connection pool to one alkblobs pool, shared by its engines and the
/// single-instance arbiter's tables.
#[derive(Clone)]
pub struct PgPool {
    inner: Arc<PgInner>,
    /// The store instance whose pin every put carries (fleet pools; see
    /// [`PgPool::pinning_for`]), or none (single-instance pools).
    owner: Option<Arc<str>>,
}

struct PgInner {
    pool: Pool,
    name: String,
    /// `pool@host:port/db`, for messages (no password).
    display: String,
}

impl fmt::Debug for PgPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgPool")
            .field("pool", &self.inner.display)
            .finish()
    }
}

impl fmt::Display for PgPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.display)
    }
}

/// An error of the driver or the pool as this crate's error.
pub(crate) fn db_err(
    engine: &(dyn fmt::Display + Sync),
    key: Option<Key>,
    e: tokio_postgres::Error,
) -> Error {
    if let Some(code) = e.code().map(|c| c.code().to_owned()) {
        return Error::from_sqlstate(engine, &code, key, e);
    }
    let text = e.to_string();
    if text.contains("TLS") || text.contains("ssl") {
        // A certificate that does not verify, or a server without TLS when
        // it is required: configuration, not a passing fault.
        return Error::Config(format!(
            "{engine}: {text}: {}; check sslmode and sslrootcert in the URL",
            std::error::Error::source(&e)
                .map(|s| s.to_string())
                .unwrap_or_default()
        ));
    }
    if e.is_closed() || text.contains("connection") {
        return Error::Unavailable {
            engine: engine.to_string(),
            source: e.into(),
        };
    }
    Error::engine(engine, e)
}

fn pool_err(engine: &(dyn fmt::Display + Sync), e: deadpool_postgres::PoolError) -> Error {
    use deadpool_postgres::PoolError;
    match e {
        PoolError::Backend(e) => db_err(engine, None, e),
        other => Error::Unavailable {
            engine: engine.to_string(),
            source: other.into(),
        },
    }
}

fn pool_info(row: &Row) -> PoolInfo {
    PoolInfo {
        name: row.get(0),
        mode: row.get(1),
        large_tier: row.get(2),
        delete_window: interval_secs(row.get::<_, String>(3).as_str()),
        pin_ttl: interval_secs(row.get::<_, String>(4).as_str()),
        sweep_every: row
            .get::<_, Option<String>>(5)
            .map(|s| interval_secs(s.as_str())),
    }
}

/// A duration as an interval literal PostgreSQL parses exactly.
fn secs_text(d: Duration) -> String {
    format!("{}.{:06} seconds", d.as_secs(), d.subsec_micros())
}

/// Settings of a new pool ([`PgPool::create_pool`]); `None` takes the
/// extension's defaults (5 minutes, 60 seconds, `pg-lo`).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct PoolSettings {
    /// The delete window.
    pub delete_window: Option<Duration>,
    /// The pin TTL.
    pub pin_ttl: Option<Duration>,
    /// `pg-lo`, `local` or `none`.
    pub large_tier: Option<String>,
    /// One instance owns the pool (its in-process arbiter sweeps it).
    pub single_instance: bool,
    /// How often the extension's scheduler sweeps the pool (fleet pools;
    /// `None`: manual).
    pub sweep_every: Option<Duration>,
}

impl PoolSettings {
    /// The defaults.
    pub fn new() -> PoolSettings {
        PoolSettings::default()
    }

    /// The delete window.
    pub fn delete_window(mut self, d: Duration) -> Self {
        self.delete_window = Some(d);
        self
    }

    /// The pin TTL.
    pub fn pin_ttl(mut self, d: Duration) -> Self {
        self.pin_ttl = Some(d);
        self
    }

    /// The large tier.
    pub fn large_tier(mut self, tier: impl Into<String>) -> Self {
        self.large_tier = Some(tier.into());
        self
    }

    /// A single-instance pool.
    pub fn single_instance(mut self, yes: bool) -> Self {
        self.single_instance = yes;
        self
    }

    /// Swept by the extension's scheduler every `every` (fleet pools).
    pub fn sweep_every(mut self, every: Duration) -> Self {
        self.sweep_every = Some(every);
        self
    }
}

fn interval_secs(text: &str) -> Duration {
    // `alkblobs_pools` intervals as text with extract(epoch): seconds.
    Duration::from_secs_f64(text.parse::<f64>().unwrap_or(0.0).max(0.0))
}

impl PgPool {
    /// Connects to `opts.url` and checks that the database has the
    /// extension at the version this client speaks and that `opts.pool`
    /// exists and is readable by the connecting role.
    pub async fn connect(opts: &PgOptions) -> Result<(PgPool, PoolInfo)> {
        let pg = PgPool::open(opts).await?;
        let info = pg.check().await?;
        Ok((pg, info))
    }

    /// Connects without looking for a pool (for administration): checks
    /// only that the database has the extension at this client's version.
    pub async fn connect_db(url: &str) -> Result<PgPool> {
        let pg = PgPool::open(&PgOptions::new(url, "")).await?;
        pg.check_extension(&*pg.conn().await?).await?;
        Ok(pg)
    }

    async fn open(opts: &PgOptions) -> Result<PgPool> {
        let tls = super::pg_tls::split(&opts.url)?;
        let mut cfg: tokio_postgres::Config = tls
            .url
            .parse()
            .map_err(|e| Error::Config(format!("invalid PostgreSQL URL: {e}")))?;
        cfg.ssl_mode(super::pg_tls::driver_mode(tls.mode));
        let connector = super::pg_tls::connector(&tls)?;
        let host = cfg
            .get_hosts()
            .first()
            .map(|h| match h {
                tokio_postgres::config::Host::Tcp(s) => s.clone(),
                tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
            })
            .unwrap_or_else(|| "localhost".into());
        let port = cfg.get_ports().first().copied().unwrap_or(5432);
        let db = cfg
            .get_dbname()
            .map(str::to_owned)
            .or_else(|| cfg.get_user().map(str::to_owned))
            .unwrap_or_default();
        let display = format!("{}@{host}:{port}/{db}", opts.pool);
        let mgr = Manager::from_config(
            cfg,
            connector,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(mgr)
            .max_size(opts.max_connections)
            .build()
            .map_err(|e| Error::Config(format!("cannot build a connection pool: {e}")))?;
        Ok(PgPool {
            inner: Arc::new(PgInner {
                pool,
                name: opts.pool.clone(),
                display,
            }),
            owner: None,
        })
    }

    async fn check_extension(&self, c: &tokio_postgres::Client) -> Result<()> {
        let version = c
            .query_typed_opt(
                "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'alkblobs'",
                &[],
            )
            .await
            .map_err(|e| db_err(self, None, e))?;
        match version {
            None => {
                return Err(Error::Config(format!(
                    "{self}: the database has no alkblobs extension; as a superuser run CREATE EXTENSION alkblobs (after scripts/install-extension.sh on the server)"
                )));
            }
            Some(row) => {
                let v: String = row.get(0);
                if v != EXTENSION_VERSION {
                    return Err(Error::Config(format!(
                        "{self}: the alkblobs extension is version {v}, this client speaks {EXTENSION_VERSION}; as a superuser run ALTER EXTENSION alkblobs UPDATE"
                    )));
                }
            }
        }
        Ok(())
    }

    async fn check(&self) -> Result<PoolInfo> {
        let c = self.conn().await?;
        self.check_extension(&c).await?;
        let row = c
            .query_typed_opt(
                "SELECT p.pool, p.mode, p.large_tier, extract(epoch FROM p.delete_window)::text,
                        extract(epoch FROM p.pin_ttl)::text, extract(epoch FROM p.sweep_every)::text
                   FROM alkblobs_pools p WHERE p.pool = $1",
                &[(&self.inner.name, Type::TEXT)],
            )
            .await
            .map_err(|e| match e.code().map(|c| c.code()) {
                Some("42501") => Error::Config(format!(
                    "{self}: the role may not use alkblobs; GRANT alkblobs_writer (or alkblobs_admin) TO it"
                )),
                _ => db_err(self, None, e),
            })?;
        let Some(row) = row else {
            return Err(Error::NoPool {
                pool: self.inner.name.clone(),
                at: self.to_string(),
            });
        };
        Ok(pool_info(&row))
    }

    /// Every pool the connecting role may read.
    pub async fn pools(&self) -> Result<Vec<PoolInfo>> {
        let rows = self
            .rows(
                self,
                None,
                "SELECT p.pool, p.mode, p.large_tier, extract(epoch FROM p.delete_window)::text,
                        extract(epoch FROM p.pin_ttl)::text, extract(epoch FROM p.sweep_every)::text
                   FROM alkblobs_pools p ORDER BY p.pool",
                &[],
            )
            .await?;
        Ok(rows.iter().map(pool_info).collect())
    }

    /// Creates pool `name` (the connecting role needs `alkblobs_admin`).
    pub async fn create_pool(&self, name: &str, settings: &PoolSettings) -> Result<()> {
        let window = settings.delete_window.unwrap_or(Duration::from_secs(300));
        let ttl = settings.pin_ttl.unwrap_or(Duration::from_secs(60));
        let (w, t) = (secs_text(window), secs_text(ttl));
        let large = settings
            .large_tier
            .clone()
            .unwrap_or_else(|| "pg-lo".into());
        self.rows(
            self,
            None,
            "SELECT alkblobs_create_pool($1, $2::interval, $3::interval, $4, single_instance => $5,
                                         sweep_every => $6::interval)",
            &[
                (&name, Type::TEXT),
                (&w, Type::TEXT),
                (&t, Type::TEXT),
                (&large, Type::TEXT),
                (&settings.single_instance, Type::BOOL),
                (&settings.sweep_every.map(secs_text), Type::TEXT),
            ],
        )
        .await?;
        Ok(())
    }

    /// Changes pool `name`'s window or TTL (`None` keeps it).
    pub async fn alter_pool(
        &self,
        name: &str,
        window: Option<Duration>,
        ttl: Option<Duration>,
    ) -> Result<()> {
        let (w, t) = (window.map(secs_text), ttl.map(secs_text));
        self.rows(
            self,
            None,
            "SELECT alkblobs_alter_pool($1, $2::interval, $3::interval)",
            &[(&name, Type::TEXT), (&w, Type::TEXT), (&t, Type::TEXT)],
        )
        .await?;
        Ok(())
    }

    /// Sets pool `name`'s schedule: swept by the extension's scheduler
    /// every `every`, or (`None`) only when someone sweeps it.
    pub async fn set_sweep_every(&self, name: &str, every: Option<Duration>) -> Result<()> {
        let e = secs_text(every.unwrap_or(Duration::ZERO));
        self.rows(
            self,
            None,
            "SELECT alkblobs_alter_pool($1, sweep_every => $2::interval)",
            &[(&name, Type::TEXT), (&e, Type::TEXT)],
        )
        .await?;
        Ok(())
    }

    /// `alkblobs_health`: one row per pool this role may read (or just
    /// `pool`), in name order.
    pub async fn health(&self, pool: Option<&str>) -> Result<Vec<PoolHealth>> {
        let rows = self
            .rows(
                self,
                None,
                "SELECT pool, status, reasons, mode, extract(epoch FROM sweep_every)::float8, scheduler,
                        extract(epoch FROM last_sweep_age)::float8, last_outcome, overdue_staged,
                        expired_pins, abandoned_uploads, abandoned_upload_bytes, invalid_sources
                   FROM alkblobs_health WHERE $1::text IS NULL OR pool = $1 ORDER BY pool",
                &[(&pool, Type::TEXT)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| PoolHealth {
                pool: r.get(0),
                status: r.get(1),
                reasons: r.get(2),
                mode: r.get(3),
                sweep_every_secs: r.get(4),
                scheduler: r.get(5),
                last_sweep_age_secs: r.get(6),
                last_outcome: r.get(7),
                overdue_staged: r.get(8),
                expired_pins: r.get(9),
                abandoned_uploads: r.get(10),
                abandoned_upload_bytes: r.get(11),
                invalid_sources: r.get(12),
            })
            .collect())
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The same connections, with every put of the engines built from the
    /// result committing a pin row of store instance `owner` together with
    /// its entry (`alkblobs_put(…, owner)`): a fleet pool's pin before
    /// publish. The fleet arbiter renews and releases those rows.
    pub fn pinning_for(&self, owner: &str) -> PgPool {
        PgPool {
            inner: self.inner.clone(),
            owner: Some(owner.into()),
        }
    }

    /// The instance whose pins puts carry, if any.
    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    pub(crate) async fn conn(&self) -> Result<Object> {
        self.inner.pool.get().await.map_err(|e| pool_err(self, e))
    }

    /// Runs `query` with `params` and returns its rows, retrying a bounded
    /// number of times when the database reports a retryable conflict
    /// (every caller's statement is idempotent or all-or-nothing).
    pub(crate) async fn rows(
        &self,
        engine: &(dyn fmt::Display + Sync),
        key: Option<Key>,
        query: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let c = self.conn().await.map_err(|e| rename(e, engine))?;
            match c.query_typed(query, params).await {
                Ok(rows) => return Ok(rows),
                Err(e) => {
                    let err = db_err(engine, key, e);
                    if matches!(err, Error::Conflict { .. }) && attempt < ATTEMPTS {
                        tokio::time::sleep(Duration::from_millis(5 << attempt)).await;
                        continue;
                    }
                    return Err(err);
                }
            }
        }
    }
}

/// An error raised for the pool, renamed for the engine that asked.
fn rename(e: Error, engine: &(dyn fmt::Display + Sync)) -> Error {
    match e {
        Error::Unavailable { source, .. } => Error::Unavailable {
            engine: engine.to_string(),
            source,
        },
        other => other,
    }
}

fn key_of(row: &Row, i: usize, engine: &(dyn fmt::Display + Sync)) -> Result<Key> {
    let b: Vec<u8> = row.get(i);
    Key::from_slice(&b).map_err(|e| Error::engine(engine, format!("bad key in the database: {e}")))
}

/// Lists keys of one tier in pages.
fn list_tier<'a>(
    pg: &'a PgPool,
    engine: &'a (dyn fmt::Display + Sync),
    tier: &'static str,
) -> KeyStream<'a> {
    let pages = futures::stream::try_unfold(Some(Vec::<u8>::new()), move |after| async move {
        let Some(after) = after else {
            return Ok(None);
        };
        let rows = pg
            .rows(
                engine,
                None,
                "SELECT key FROM alkblobs_list($1, $2, $3, $4)",
                &[
                    (&pg.inner.name, Type::TEXT),
                    (&after, Type::BYTEA),
                    (&PAGE, Type::INT4),
                    (&tier, Type::TEXT),
                ],
            )
            .await?;
        let keys: Vec<Result<Key>> = rows.iter().map(|r| key_of(r, 0, engine)).collect();
        let next = if rows.len() < PAGE as usize {
            None
        } else {
            rows.last().map(|r| r.get::<_, Vec<u8>>(0))
        };
        Ok(Some((futures::stream::iter(keys), next)))
    });
    Box::pin(
        pages
            .map(|r| match r {
                Ok(s) => s.left_stream(),
                Err(e) => futures::stream::iter(vec![Err(e)]).right_stream(),
            })
            .flatten(),
    )
}

/// (size, tier) of a key.
async fn stat(
    pg: &PgPool,
    engine: &(dyn fmt::Display + Sync),
    key: &Key,
) -> Result<Option<(u64, String)>> {
    let k = key.as_bytes().to_vec();
    let rows = pg
        .rows(
            engine,
            Some(*key),
            "SELECT size, tier FROM alkblobs_stat($1, $2)",
            &[(&pg.inner.name, Type::TEXT), (&k, Type::BYTEA)],
        )
        .await?;
    Ok(rows
        .first()
        .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, String>(1))))
}

/// Entries and bytes of one tier (`kv` or `lo`) from `alkblobs_usage`.
async fn tier_usage(
    pg: &PgPool,
    engine: &(dyn fmt::Display + Sync),
    tier: &str,
) -> Result<Option<(u64, u64)>> {
    let sql =
        format!("SELECT {tier}_entries, {tier}_bytes::bigint FROM alkblobs_usage WHERE pool = $1");
    let rows = pg
        .rows(engine, None, &sql, &[(&pg.inner.name, Type::TEXT)])
        .await?;
    Ok(rows
        .first()
        .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1) as u64)))
}

/// Deletes keys of the pool (at most 1,000 per call), returning each
/// deleted key's size.
async fn delete_keys(
    pg: &PgPool,
    engine: &(dyn fmt::Display + Sync),
    keys: &[Key],
) -> Result<Vec<Option<u64>>> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(1000) {
        let arr: Vec<Vec<u8>> = chunk.iter().map(|k| k.as_bytes().to_vec()).collect();
        let rows = pg
            .rows(
                engine,
                None,
                "SELECT key, size FROM alkblobs_delete($1, $2)",
                &[(&pg.inner.name, Type::TEXT), (&arr, Type::BYTEA_ARRAY)],
            )
            .await?;
        let mut sizes = std::collections::HashMap::new();
        for r in &rows {
            sizes.insert(key_of(r, 0, engine)?, r.get::<_, i64>(1) as u64);
        }
        out.extend(chunk.iter().map(|k| sizes.get(k).copied()));
    }
    Ok(out)
}

/// The `postgres` kv engine; see the module docs.
#[derive(Debug, Clone)]
pub struct PostgresBackend {
    pg: PgPool,
}

impl PostgresBackend {
    /// The kv engine of `pg`'s pool.
    pub fn new(pg: PgPool) -> PostgresBackend {
        PostgresBackend { pg }
    }
}

impl fmt::Display for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "postgres({})", self.pg)
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl Backend for PostgresBackend {
    fn name(&self) -> &str {
        "postgres"
    }

    fn sharing(&self) -> Sharing {
        Sharing::Shared
    }

    async fn has(&self, key: &Key) -> Result<bool> {
        Ok(self.size(key).await?.is_some())
    }

    async fn get(&self, key: &Key) -> Result<Option<Bytes>> {
        let k = key.as_bytes().to_vec();
        let rows = self
            .pg
            .rows(
                self,
                Some(*key),
                "SELECT alkblobs_get($1, $2)",
                &[(&self.pg.inner.name, Type::TEXT), (&k, Type::BYTEA)],
            )
            .await?;
        Ok(rows
            .first()
            .and_then(|r| r.get::<_, Option<Vec<u8>>>(0))
            .map(Bytes::from))
    }

    async fn put(&self, key: &Key, value: Bytes) -> Result<PutOutcome> {
        Ok(self.put_many(&[(*key, value)]).await?[0])
    }

    async fn delete(&self, key: &Key) -> Result<Option<u64>> {
        Ok(delete_keys(&self.pg, self, std::slice::from_ref(key)).await?[0])
    }

    fn list(&self) -> KeyStream<'_> {
        list_tier(&self.pg, self, "kv")
    }

    async fn size(&self, key: &Key) -> Result<Option<u64>> {
        Ok(stat(&self.pg, self, key)
            .await?
            .and_then(|(s, t)| (t == "kv").then_some(s)))
    }

    async fn get_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        let Some(value) = self.get(key).await? else {
            return Ok(None);
        };
        super::slice_range(key, &value, offset, len).map(Some)
    }

    async fn put_many(&self, items: &[(Key, Bytes)]) -> Result<Vec<PutOutcome>> {
        let mut out = Vec::with_capacity(items.len());
        let mut start = 0;
        while start < items.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < items.len()
                && end - start < 10_000
                && (end == start || bytes + items[end].1.len() <= BATCH_BYTES)
            {
                bytes += items[end].1.len();
                end += 1;
            }
            let keys: Vec<Vec<u8>> = items[start..end]
                .iter()
                .map(|(k, _)| k.as_bytes().to_vec())
                .collect();
            let vals: Vec<&[u8]> = items[start..end].iter().map(|(_, v)| v.as_ref()).collect();
            let owner = self.pg.owner();
            let rows = self
                .pg
                .rows(
                    self,
                    items.get(start).map(|(k, _)| *k),
                    "SELECT alkblobs_put_many($1, $2, $3, $4)",
                    &[
                        (&self.pg.inner.name, Type::TEXT),
                        (&keys, Type::BYTEA_ARRAY),
                        (&vals, Type::BYTEA_ARRAY),
                        (&owner, Type::TEXT),
                    ],
                )
                .await?;
            let created: Vec<bool> = rows
                .first()
                .map(|r| r.get(0))
                .ok_or_else(|| Error::engine(self, "alkblobs_put_many returned no row"))?;
            out.extend(created.into_iter().map(|c| {
                if c {
                    PutOutcome::Created
                } else {
                    PutOutcome::Existed
                }
            }));
            start = end;
        }
        Ok(out)
    }

    async fn delete_many(&self, keys: &[Key]) -> Result<Vec<Option<u64>>> {
        delete_keys(&self.pg, self, keys).await
    }

    async fn usage(&self) -> Result<Option<(u64, u64)>> {
        tier_usage(&self.pg, self, "kv").await
    }

    async fn reclaim_abandoned(&self) -> Result<u64> {
        Ok(0)
    }

    async fn close(&self) -> Result<()> {
        self.pg.inner.pool.close();
        Ok(())
    }
}

/// The `pg-lo` large engine; see the module docs.
#[derive(Debug, Clone)]
pub struct PgLoBackend {
    pg: PgPool,
}

impl PgLoBackend {
    /// The large-object engine of `pg`'s pool (same PostgreSQL instance and
    /// database as its kv engine, by construction).
    pub fn new(pg: PgPool) -> PgLoBackend {
        PgLoBackend { pg }
    }

    /// A window of the object, in a transaction the caller may hold open.
    async fn window(
        &self,
        c: &Object,
        key: &Key,
        offset: u64,
        len: usize,
    ) -> Result<Option<Bytes>> {
        let k = key.as_bytes().to_vec();
        let off = offset as i64;
        let len = len as i32;
        let row = c
            .query_typed_one(
                "SELECT alkblobs_lo_read($1, $2, $3, $4)",
                &[
                    (&self.pg.inner.name, Type::TEXT),
                    (&k, Type::BYTEA),
                    (&off, Type::INT8),
                    (&len, Type::INT4),
                ],
            )
            .await
            .map_err(|e| db_err(self, Some(*key), e))?;
        Ok(row.get::<_, Option<Vec<u8>>>(0).map(Bytes::from))
    }

    /// A connection in a REPEATABLE READ, READ ONLY transaction: every
    /// window it reads is of one snapshot, so a sweep deleting the object
    /// meanwhile cannot tear the read.
    async fn snapshot(&self) -> Result<InTx> {
        let c = self.pg.conn().await.map_err(|e| rename(e, self))?;
        InTx::begin(c, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await
            .map_err(|e| db_err(self, None, e))
    }
}

impl PgLoBackend {
    /// A second connection in `c`'s snapshot (`pg_export_snapshot` /
    /// `SET TRANSACTION SNAPSHOT`), or None when the pool has none to spare
    /// within a moment or the import fails: the read goes on with `c` alone.
    async fn shared_snapshot(&self, c: &Object) -> Option<InTx> {
        let id: String = c
            .query_typed_one("SELECT pg_catalog.pg_export_snapshot()", &[])
            .await
            .ok()?
            .get(0);
        let c2 = tokio::time::timeout(Duration::from_millis(20), self.pg.inner.pool.get())
            .await
            .ok()?
            .ok()?;
        // The id is PostgreSQL's own (hex digits and dashes); quoted anyway.
        let quoted = id.replace('\'', "''");
        InTx::begin(
            c2,
            &format!(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{quoted}'"
            ),
        )
        .await
        .ok()
    }
}

impl fmt::Display for PgLoBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pg-lo({})", self.pg)
    }
}

/// A pooled connection inside a transaction. Dropped before [`finish`]
/// ends the transaction — an error returned early, or the caller's future
/// cancelled at an `.await` — it is taken out of the pool and closed, which
/// rolls the transaction back: a connection is never handed to another
/// caller in the middle of a transaction.
pub(crate) struct InTx(Option<Object>);

impl InTx {
    /// Runs `begin` (e.g. `BEGIN ISOLATION LEVEL …`) on `c`.
    pub(crate) async fn begin(
        c: Object,
        begin: &str,
    ) -> std::result::Result<InTx, tokio_postgres::Error> {
        let t = InTx(Some(c));
        t.batch_execute(begin).await?;
        Ok(t)
    }

    /// A connection whose transaction the caller already began.
    pub(crate) fn adopt(c: Object) -> InTx {
        InTx(Some(c))
    }

    /// The connection, still in its transaction, for an owner that takes
    /// over the same duty (an upload's `Drop`).
    fn into_object(mut self) -> Object {
        self.0.take().expect("a live transaction")
    }
}

impl std::ops::Deref for InTx {
    type Target = Object;
    fn deref(&self) -> &Object {
        // Emptied only by `finish` and `drop`, which consume it.
        self.0.as_ref().expect("a live transaction")
    }
}

impl Drop for InTx {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            drop(Object::take(c));
        }
    }
}

/// Ends a transaction (`COMMIT` or `ROLLBACK`) and returns the connection
/// to the pool, or closes it if that fails.
pub(crate) async fn finish(
    mut c: InTx,
    sql: &str,
) -> std::result::Result<(), tokio_postgres::Error> {
    c.batch_execute(sql).await?;
    // Back to the pool, outside any transaction.
    drop(c.0.take());
    Ok(())
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl Backend for PgLoBackend {
    fn name(&self) -> &str {
        "pg-lo"
    }

    fn sharing(&self) -> Sharing {
        Sharing::Shared
    }

    async fn has(&self, key: &Key) -> Result<bool> {
        Ok(self.size(key).await?.is_some())
    }

    async fn get(&self, key: &Key) -> Result<Option<Bytes>> {
        let Some(size) = self.size(key).await? else {
            return Ok(None);
        };
        self.read_range(key, 0, size).await
    }

    async fn put(&self, key: &Key, value: Bytes) -> Result<PutOutcome> {
        let mut w = self.begin_write().await?;
        let mut rest = value;
        while !rest.is_empty() {
            let n = rest.len().min(WINDOW);
            w.write(rest.split_to(n)).await?;
        }
        w.commit(key).await
    }

    async fn delete(&self, key: &Key) -> Result<Option<u64>> {
        Ok(delete_keys(&self.pg, self, std::slice::from_ref(key)).await?[0])
    }

    fn list(&self) -> KeyStream<'_> {
        list_tier(&self.pg, self, "lo")
    }

    async fn size(&self, key: &Key) -> Result<Option<u64>> {
        Ok(stat(&self.pg, self, key)
            .await?
            .and_then(|(s, t)| (t == "lo").then_some(s)))
    }

    async fn get_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        self.read_range(key, offset, len).await
    }

    async fn put_many(&self, items: &[(Key, Bytes)]) -> Result<Vec<PutOutcome>> {
        let mut out = Vec::with_capacity(items.len());
        for (k, v) in items {
            out.push(self.put(k, v.clone()).await?);
        }
        Ok(out)
    }

    async fn delete_many(&self, keys: &[Key]) -> Result<Vec<Option<u64>>> {
        delete_keys(&self.pg, self, keys).await
    }

    async fn usage(&self) -> Result<Option<(u64, u64)>> {
        tier_usage(&self.pg, self, "lo").await
    }

    async fn reclaim_abandoned(&self) -> Result<u64> {
        // Abandoned uploads are reclaimed by the extension's sweep; a
        // single-instance pool's uploads die with their transaction.
        Ok(0)
    }

    async fn close(&self) -> Result<()> {
        self.pg.inner.pool.close();
        Ok(())
    }
}

#[async_trait]
impl LargeBackend for PgLoBackend {
    async fn begin_write(&self) -> Result<Box<dyn StagedWrite + '_>> {
        let c = self.pg.conn().await.map_err(|e| rename(e, self))?;
        let c = InTx::begin(c, "BEGIN")
            .await
            .map_err(|e| db_err(self, None, e))?;
        let row = c
            .query_typed_one(
                "SELECT alkblobs_lo_create($1)",
                &[(&self.pg.inner.name, Type::TEXT)],
            )
            .await
            .map_err(|e| db_err(self, None, e))?;
        let loid: u32 = row.get(0);
        Ok(Box::new(PgLoWrite {
            engine: self,
            conn: Some(c.into_object()),
            loid,
            buf: BytesMut::with_capacity(WINDOW),
            offset: 0,
            written: 0,
        }))
    }

    async fn open_read(&self, key: &Key) -> Result<Option<BlobReader>> {
        let c = self.snapshot().await?;
        // Absent in this snapshot: absent.
        let first = match self.window(&c, key, 0, WINDOW).await {
            Ok(w) => w,
            Err(e) => {
                let _ = finish(c, "ROLLBACK").await;
                return Err(e);
            }
        };
        let Some(first) = first else {
            let _ = finish(c, "COMMIT").await;
            return Ok(None);
        };
        // More than one window: a second connection in the same snapshot
        // reads every other window (one backend reads and sends a window
        // while the other does the next), if the pool has one to spare.
        let mut conns = vec![c];
        if first.len() == WINDOW
            && let Some(c2) = self.shared_snapshot(&conns[0]).await
        {
            conns.push(c2);
        }
        let engine = self.clone();
        let key = *key;
        let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(2);
        tokio::spawn(async move {
            let mut offset = first.len() as u64;
            let mut more = first.len() == WINDOW;
            // Windows in flight, in order: two per connection (each
            // connection pipelines its queries). Reading past the end
            // returns an empty window, which is ignored.
            let mut inflight = futures::stream::FuturesOrdered::new();
            let mut issued = 0usize;
            let depth = 2 * conns.len();
            if tx.send(Ok(first)).await.is_err() {
                more = false;
            }
            while more {
                while inflight.len() < depth {
                    let c = &conns[issued % conns.len()];
                    inflight.push_back(engine.window(c, &key, offset, WINDOW));
                    offset += WINDOW as u64;
                    issued += 1;
                }
                match inflight.next().await {
                    Some(Ok(Some(w))) if !w.is_empty() => {
                        more = w.len() == WINDOW;
                        if tx.send(Ok(w)).await.is_err() {
                            break;
                        }
                    }
                    Some(Ok(_)) | None => break,
                    Some(Err(e)) => {
                        let _ = tx.send(Err(std::io::Error::other(e))).await;
                        break;
                    }
                }
            }
            drop(inflight);
            for c in conns {
                let _ = finish(c, "COMMIT").await;
            }
        });
        let stream = tokio_stream_from(rx);
        Ok(Some(Box::pin(tokio_util::io::StreamReader::new(stream))))
    }

    async fn read_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        let c = self.snapshot().await?;
        let res = async {
            let k = key.as_bytes().to_vec();
            let rows = c
                .query_typed(
                    "SELECT size FROM alkblobs_stat($1, $2) WHERE tier = 'lo'",
                    &[(&self.pg.inner.name, Type::TEXT), (&k, Type::BYTEA)],
                )
                .await
                .map_err(|e| db_err(self, Some(*key), e))?;
            let Some(size) = rows.first().map(|r| r.get::<_, i64>(0) as u64) else {
                return Ok(None);
            };
            if offset > size {
                return Err(Error::InvalidRange {
                    key: *key,
                    offset,
                    size,
                });
            }
            let end = offset.saturating_add(len).min(size);
            let mut out = BytesMut::with_capacity((end - offset) as usize);
            let mut at = offset;
            while at < end {
                let n = ((end - at) as usize).min(16 * WINDOW);
                match self.window(&c, key, at, n).await? {
                    Some(w) if !w.is_empty() => {
                        at += w.len() as u64;
                        out.extend_from_slice(&w);
                    }
                    _ => {
                        return Err(Error::engine(
                            self,
                            format!(
                                "large object of {key} ended at byte {at}, its entry says {size}"
                            ),
                        ));
                    }
                }
            }
            Ok(Some(out.freeze()))
        }
        .await;
        let _ = finish(c, "COMMIT").await;
        res
    }
}

/// A bounded channel as a stream of chunks.
fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>,
) -> impl futures::Stream<Item = std::io::Result<Bytes>> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// An upload in progress: one transaction on one connection, the bytes
/// written to the extension's upload in windows. Dropped without a commit,
/// the connection is closed (not returned to the pool), which rolls the
/// transaction and the large object back.
struct PgLoWrite<'a> {
    engine: &'a PgLoBackend,
    conn: Option<Object>,
    loid: u32,
    buf: BytesMut,
    offset: u64,
    written: u64,
}

impl PgLoWrite<'_> {
    async fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = self.buf.split().freeze();
        let c = self
            .conn
            .as_ref()
            .ok_or_else(|| Error::engine(self.engine, "upload already finished"))?;
        let off = self.offset as i64;
        let data: &[u8] = chunk.as_ref();
        c.query_typed(
            "SELECT alkblobs_lo_write($1, $2, $3)",
            &[
                (&self.loid, Type::OID),
                (&off, Type::INT8),
                (&data, Type::BYTEA),
            ],
        )
        .await
        .map_err(|e| db_err(self.engine, None, e))?;
        self.offset += chunk.len() as u64;
        Ok(())
    }
}

impl Drop for PgLoWrite<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take() {
            // Mid-transaction: never hand this connection to someone else.
            drop(Object::take(c));
        }
    }
}

#[async_trait]
impl StagedWrite for PgLoWrite<'_> {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        self.written += chunk.len() as u64;
        let mut rest = chunk;
        while !rest.is_empty() {
            let room = WINDOW - self.buf.len();
            let n = rest.len().min(room);
            self.buf.extend_from_slice(&rest.split_to(n));
            if self.buf.len() == WINDOW {
                self.flush().await?;
            }
        }
        Ok(())
    }

    fn written(&self) -> u64 {
        self.written
    }

    async fn commit(mut self: Box<Self>, key: &Key) -> Result<PutOutcome> {
        self.flush().await?;
        let c = InTx::adopt(
            self.conn
                .take()
                .ok_or_else(|| Error::engine(self.engine, "upload already finished"))?,
        );
        let k = key.as_bytes().to_vec();
        let owner = self.engine.pg.owner();
        let created = c
            .query_typed_one(
                "SELECT alkblobs_lo_commit($1, $2, $3, $4)",
                &[
                    (&self.engine.pg.inner.name, Type::TEXT),
                    (&k, Type::BYTEA),
                    (&self.loid, Type::OID),
                    (&owner, Type::TEXT),
                ],
            )
            .await;
        let created: bool = match created {
            Ok(r) => r.get(0),
            Err(e) => {
                drop(c);
                return Err(db_err(self.engine, Some(*key), e));
            }
        };
        finish(c, "COMMIT")
            .await
            .map_err(|e| db_err(self.engine, Some(*key), e))?;
        Ok(if created {
            PutOutcome::Created
        } else {
            PutOutcome::Existed
        })
    }

    async fn abort(mut self: Box<Self>) -> Result<()> {
        if let Some(c) = self.conn.take() {
            finish(InTx::adopt(c), "ROLLBACK")
                .await
                .map_err(|e| db_err(self.engine, None, e))?;
        }
        Ok(())
    }
}
