//! The single-node arbiter's durable tables in PostgreSQL (feature
//! `postgres`): a single-instance pool's staged candidates and roots, in
//! the extension's `single_staged` / `single_roots` tables, reached through
//! its functions. The instance that owns the pool is the only one that
//! sweeps it (the extension's own sweep refuses a single-instance pool), so
//! these rows are this process's, kept across its restarts.

use async_trait::async_trait;
use tokio_postgres::types::Type;

use super::tables::{GcTables, StagedRow};
use crate::pg::PgPool;
use crate::{Error, Key, Result};

/// `single_staged` and `single_roots` rows of one pool.
#[derive(Debug, Clone)]
pub struct PgGcTables {
    pg: PgPool,
}

impl PgGcTables {
    /// The tables of `pg`'s pool (a single-instance pool).
    pub fn new(pg: PgPool) -> PgGcTables {
        PgGcTables { pg }
    }

    fn display(&self) -> String {
        format!("postgres-gc-tables({})", self.pg)
    }

    async fn count(
        &self,
        sql: &str,
        params: &[(&(dyn tokio_postgres::types::ToSql + Sync), Type)],
    ) -> Result<u64> {
        let me = self.display();
        let rows = self.pg.rows(&me, None, sql, params).await?;
        Ok(rows.first().map(|r| r.get::<_, i64>(0) as u64).unwrap_or(0))
    }

    async fn page(
        &self,
        after: Option<Key>,
        limit: usize,
        due_at: Option<i64>,
    ) -> Result<Vec<StagedRow>> {
        let me = self.display();
        let after = after.map(|k| k.as_bytes().to_vec());
        let lim = limit.clamp(1, 100_000) as i32;
        let rows = self
            .pg
            .rows(
                &me,
                None,
                "SELECT key, staged_at_ms, visible_after_ms FROM alkblobs_single_staged($1, $2, $3, $4)",
                &[
                    (&self.pg.name(), Type::TEXT),
                    (&after, Type::BYTEA),
                    (&lim, Type::INT4),
                    (&due_at, Type::INT8),
                ],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let k: Vec<u8> = r.get(0);
                Ok(StagedRow {
                    key: Key::from_slice(&k).map_err(|e| Error::engine(&me, e))?,
                    staged_at_ms: r.get(1),
                    visible_after_ms: r.get(2),
                })
            })
            .collect()
    }

    /// Roots with key > `after`, at most `limit`; only those among `among`
    /// if given (`alkblobs_single_roots`).
    async fn roots_page(
        &self,
        after: Option<Key>,
        limit: usize,
        among: Option<&[Key]>,
    ) -> Result<Vec<Key>> {
        let me = self.display();
        let after = after.map(|k| k.as_bytes().to_vec());
        let lim = limit.clamp(1, 100_000) as i32;
        let among = among.map(PgGcTables::keys);
        let rows = self
            .pg
            .rows(
                &me,
                None,
                "SELECT k FROM alkblobs_single_roots($1, $2, $3, $4) k",
                &[
                    (&self.pg.name(), Type::TEXT),
                    (&after, Type::BYTEA),
                    (&lim, Type::INT4),
                    (&among, Type::BYTEA_ARRAY),
                ],
            )
            .await?;
        rows.iter()
            .map(|r| Key::from_slice(&r.get::<_, Vec<u8>>(0)).map_err(|e| Error::engine(&me, e)))
            .collect()
    }

    fn keys(keys: &[Key]) -> Vec<Vec<u8>> {
        keys.iter().map(|k| k.as_bytes().to_vec()).collect()
    }
}

#[async_trait]
impl GcTables for PgGcTables {
    fn durable(&self) -> bool {
        true
    }

    async fn discard_unsealed(&self) -> Result<u64> {
        let none: Option<i64> = None;
        self.count(
            "SELECT alkblobs_single_seal($1, 'discard', $2)",
            &[(&self.pg.name(), Type::TEXT), (&none, Type::INT8)],
        )
        .await
    }

    async fn stage(&self, keys: &[Key], now_ms: i64) -> Result<u64> {
        let mut n = 0;
        for chunk in keys.chunks(10_000) {
            let arr = PgGcTables::keys(chunk);
            n += self
                .count(
                    "SELECT alkblobs_single_stage($1, $2, $3)",
                    &[
                        (&self.pg.name(), Type::TEXT),
                        (&arr, Type::BYTEA_ARRAY),
                        (&now_ms, Type::INT8),
                    ],
                )
                .await?;
        }
        Ok(n)
    }

    async fn seal(&self, visible_after_ms: i64) -> Result<u64> {
        self.count(
            "SELECT alkblobs_single_seal($1, 'seal', $2)",
            &[
                (&self.pg.name(), Type::TEXT),
                (&visible_after_ms, Type::INT8),
            ],
        )
        .await
    }

    async fn reseal(&self, visible_after_ms: i64) -> Result<u64> {
        self.count(
            "SELECT alkblobs_single_seal($1, 'reseal', $2)",
            &[
                (&self.pg.name(), Type::TEXT),
                (&visible_after_ms, Type::INT8),
            ],
        )
        .await
    }

    async fn due(&self, now_ms: i64, after: Option<Key>, limit: usize) -> Result<Vec<StagedRow>> {
        self.page(after, limit, Some(now_ms)).await
    }

    async fn unstage(&self, keys: &[Key]) -> Result<u64> {
        let mut n = 0;
        for chunk in keys.chunks(10_000) {
            let arr = PgGcTables::keys(chunk);
            n += self
                .count(
                    "SELECT alkblobs_single_unstage($1, $2)",
                    &[(&self.pg.name(), Type::TEXT), (&arr, Type::BYTEA_ARRAY)],
                )
                .await?;
        }
        Ok(n)
    }

    async fn staged(&self, after: Option<Key>, limit: usize) -> Result<Vec<StagedRow>> {
        self.page(after, limit, None).await
    }

    async fn add_roots(&self, keys: &[Key]) -> Result<u64> {
        let arr = PgGcTables::keys(keys);
        self.count(
            "SELECT alkblobs_single_roots_set($1, $2, true)",
            &[(&self.pg.name(), Type::TEXT), (&arr, Type::BYTEA_ARRAY)],
        )
        .await
    }

    async fn remove_roots(&self, keys: &[Key]) -> Result<u64> {
        let arr = PgGcTables::keys(keys);
        self.count(
            "SELECT alkblobs_single_roots_set($1, $2, false)",
            &[(&self.pg.name(), Type::TEXT), (&arr, Type::BYTEA_ARRAY)],
        )
        .await
    }

    async fn roots(&self, after: Option<Key>, limit: usize) -> Result<Vec<Key>> {
        self.roots_page(after, limit, None).await
    }

    async fn roots_contain(&self, keys: &[Key]) -> Result<Vec<bool>> {
        let mut found = std::collections::HashSet::new();
        for chunk in keys.chunks(10_000) {
            found.extend(self.roots_page(None, 100_000, Some(chunk)).await?);
        }
        Ok(keys.iter().map(|k| found.contains(k)).collect())
    }
}
