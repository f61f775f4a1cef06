//! The `postgres` kv engine: entries of tier `kv`, values inline in
//! `alkblobs.entries`, batched puts through `alkblobs_put_many`.

use std::fmt;

use async_trait::async_trait;
use bytes::Bytes;
use tokio_postgres::types::Type;

use super::queries::{delete_keys, list_tier, stat, tier_usage};
use crate::backend::{Backend, KeyStream, PutOutcome, Sharing};
use crate::pg::PgPool;
use crate::{Error, Key, Result};

/// Bytes per `alkblobs_put_many` call (values travel in one message).
const BATCH_BYTES: usize = 16 << 20;

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

    fn scan(&self, after: Option<Key>) -> crate::backend::EntryStream<'_> {
        // (A PostgreSQL pool's verify walks its record, not this.)
        crate::backend::scan_by_lookup(self, after)
    }

    async fn get(&self, key: &Key) -> Result<Option<Bytes>> {
        let k = key.as_bytes().to_vec();
        let rows = self
            .pg
            .rows(
                self,
                Some(*key),
                "SELECT alkblobs_get($1, $2)",
                &[(&self.pg.name(), Type::TEXT), (&k, Type::BYTEA)],
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
        crate::backend::slice_range(key, &value, offset, len).map(Some)
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
                        (&self.pg.name(), Type::TEXT),
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

    /// One statement per 1,000 keys: each key's `alkblobs_stat` and, for a
    /// kv entry, `alkblobs_get` (a pool's verify reads its record's kv
    /// entries a page at a time; a size and a get per key made a million
    /// keys twelve minutes of round trips).
    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<(u64, Bytes)>>> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(1000) {
            let ks: Vec<Vec<u8>> = chunk.iter().map(|k| k.as_bytes().to_vec()).collect();
            let rows = self
                .pg
                .rows(
                    self,
                    None,
                    "SELECT s.size, CASE WHEN s.tier = 'kv' THEN alkblobs_get($1, k.key) END \
                       FROM unnest($2::bytea[]) WITH ORDINALITY AS k(key, i) \
                       LEFT JOIN LATERAL alkblobs_stat($1, k.key) s ON true \
                      ORDER BY k.i",
                    &[(&self.pg.name(), Type::TEXT), (&ks, Type::BYTEA_ARRAY)],
                )
                .await?;
            if rows.len() != chunk.len() {
                return Err(crate::Error::engine(
                    self,
                    format!("{} rows for {} keys", rows.len(), chunk.len()),
                ));
            }
            out.extend(rows.iter().map(|r| {
                let size: Option<i64> = r.get(0);
                let value: Option<Vec<u8>> = r.get(1);
                size.zip(value).map(|(n, v)| (n as u64, Bytes::from(v)))
            }));
        }
        Ok(out)
    }

    async fn usage(&self) -> Result<Option<(u64, u64)>> {
        tier_usage(&self.pg, self, "kv").await
    }

    async fn reclaim_abandoned(&self) -> Result<u64> {
        Ok(0)
    }

    async fn close(&self) -> Result<()> {
        self.pg.close();
        Ok(())
    }

    fn sqlite_database(&self) -> Option<&crate::backend::sqlite::SqliteBackend> {
        None
    }

    // The pool's rows share the database's files with everything else in
    // it, and PostgreSQL's (auto)vacuum gives their space back: the
    // server's to report and to do, not this engine's.
    async fn disk_space(&self) -> Result<Option<crate::backend::DiskSpace>> {
        Ok(None)
    }

    async fn compact(
        &self,
    ) -> Result<Option<(crate::backend::DiskSpace, crate::backend::DiskSpace)>> {
        Ok(None)
    }
}
