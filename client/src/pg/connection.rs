//! Connections to a pool's database: options, the connection pool with
//! its bounded retry of conflicts, the extension and pool checks at open,
//! and transactions that never go back to the pool half-done (`InTx`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::errors::{db_err, pool_err, rename};
use super::info::{Flavour, PoolInfo, pool_info};
use crate::{Error, Key, Result};

/// The extension version this client speaks.
pub const EXTENSION_VERSION: &str = "0.8.0";

/// How many times a call the database refused as a retryable conflict
/// (40001, 40P01) is tried before the error is returned.
const ATTEMPTS: u32 = 3;

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

/// A connection pool to one alkblobs pool, shared by its engines, the
/// fleet arbiter and the single-instance arbiter's tables.
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
        let tls = super::tls::split(&opts.url)?;
        let mut cfg: tokio_postgres::Config = tls
            .url
            .parse()
            .map_err(|e| Error::Config(format!("invalid PostgreSQL URL: {e}")))?;
        cfg.ssl_mode(super::tls::driver_mode(tls.mode));
        let connector = super::tls::connector(&tls)?;
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

    /// Which install the database has, after checking that this client
    /// speaks its version: the extension's catalog row (the library
    /// flavour), else the SQL-only install's `alkblobs_sql_only_version()`.
    /// Which install of alkblobs the database has (checked against this
    /// client's version, as at connect).
    pub async fn flavour(&self) -> Result<Flavour> {
        let c = self.conn().await?;
        self.check_extension(&c).await
    }

    pub(crate) async fn check_extension(&self, c: &tokio_postgres::Client) -> Result<Flavour> {
        let row = c
            .query_typed_one(
                "SELECT (SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'alkblobs'),
                        pg_catalog.to_regprocedure('alkblobs_sql_only_version()') IS NOT NULL",
                &[],
            )
            .await
            .map_err(|e| db_err(self, None, e))?;
        let (version, flavour) = match (row.get::<_, Option<String>>(0), row.get::<_, bool>(1)) {
            (Some(v), _) => (v, Flavour::Library),
            (None, true) => {
                let v = c
                    .query_typed_one("SELECT alkblobs_sql_only_version()", &[])
                    .await
                    .map_err(|e| db_err(self, None, e))?;
                (v.get::<_, String>(0), Flavour::SqlOnly)
            }
            (None, false) => {
                return Err(Error::Config(format!(
                    "{self}: the database has no alkblobs install; as a superuser run CREATE EXTENSION alkblobs (after installing the package or scripts/install-extension.sh on the server), or on a server that cannot load it run the SQL-only script (scripts/package.sh sql-only) with psql"
                )));
            }
        };
        if version != EXTENSION_VERSION {
            let how = match flavour {
                Flavour::Library => "as a superuser run ALTER EXTENSION alkblobs UPDATE",
                Flavour::SqlOnly => "install the SQL-only script of this version",
            };
            return Err(Error::Config(format!(
                "{self}: alkblobs in this database ({flavour} flavour) is version {version}, this client speaks {EXTENSION_VERSION}; {how}"
            )));
        }
        Ok(flavour)
    }

    async fn check(&self) -> Result<PoolInfo> {
        let c = self.conn().await?;
        let flavour = self.check_extension(&c).await?;
        let row = c
            .query_typed_opt(
                "SELECT p.pool, p.mode, p.large_tier, extract(epoch FROM p.delete_window)::text,
                        extract(epoch FROM p.pin_ttl)::text, extract(epoch FROM p.sweep_every)::text,
                        p.large_location
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
        pool_info(&row, flavour)
    }
}

impl PgPool {
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

    /// A connection if one is free or can be made within `d`, else none
    /// (a read's optional second connection).
    pub(crate) async fn conn_within(&self, d: Duration) -> Option<Object> {
        tokio::time::timeout(d, self.inner.pool.get())
            .await
            .ok()?
            .ok()
    }

    /// Closes the pool: idle connections now, the others when returned.
    pub(crate) fn close(&self) {
        self.inner.pool.close();
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
    pub(crate) fn into_object(mut self) -> Object {
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
