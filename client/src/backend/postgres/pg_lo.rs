//! The `pg-lo` large engine: entries of tier `lo`, large objects whose
//! `alkblobs.entries` row is the companion-table authority; reads in
//! windows from one repeatable-read snapshot (shared with a second
//! connection for read-ahead).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use deadpool_postgres::Object;
use futures::StreamExt;
use tokio_postgres::types::Type;

use super::WINDOW;
use super::queries::{delete_keys, list_tier, stat, tier_usage};
use super::writer::PgLoWrite;
use crate::backend::{
    Backend, BlobReader, KeyStream, LargeBackend, PutOutcome, Sharing, StagedWrite,
};
use crate::pg::{InTx, PgPool, finish};
use crate::pg::{db_err, rename};
use crate::{Error, Key, Result};

/// The `pg-lo` large engine; see the module docs.
#[derive(Debug, Clone)]
pub struct PgLoBackend {
    pub(super) pg: PgPool,
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
                    (&self.pg.name(), Type::TEXT),
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
        let c2 = self.pg.conn_within(Duration::from_millis(20)).await?;
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

    fn scan(&self, after: Option<Key>) -> crate::backend::EntryStream<'_> {
        // (A PostgreSQL pool's verify walks its record, not this.)
        crate::backend::scan_by_lookup(self, after)
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
        // Engines never hash: an engine-level put stores no outboard.
        w.commit(key, Bytes::new()).await
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

    /// Whole large objects, one at a time (nothing reads them in batches).
    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<(u64, Bytes)>>> {
        crate::backend::get_each(self, keys).await
    }

    async fn usage(&self) -> Result<Option<(u64, u64)>> {
        tier_usage(&self.pg, self, "lo").await
    }

    async fn reclaim_abandoned(&self) -> Result<u64> {
        // Uploads whose transaction ended without `alkblobs_lo_commit` (a
        // client of the SQL API that committed without it). A
        // single-instance pool's sweep (this store's) reaps them here; a
        // fleet pool's `alkblobs_sweep` also does it itself.
        let row = self
            .pg
            .rows(
                self,
                None,
                "SELECT alkblobs_lo_reap($1)",
                &[(&self.pg.name(), Type::TEXT)],
            )
            .await?;
        Ok(row.first().map_or(0, |r| r.get::<_, i64>(0).max(0) as u64))
    }

    async fn close(&self) -> Result<()> {
        self.pg.close();
        Ok(())
    }

    fn sqlite_database(&self) -> Option<&crate::backend::sqlite::SqliteBackend> {
        None
    }

    // The pool's large objects share the database's files with everything else in
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
                &[(&self.pg.name(), Type::TEXT)],
            )
            .await
            .map_err(|e| db_err(self, None, e))?;
        let loid: u32 = row.get(0);
        Ok(Box::new(PgLoWrite {
            engine: self,
            pg: &self.pg,
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

    async fn read_outboard(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        let c = self.pg.conn().await.map_err(|e| rename(e, self))?;
        let k = key.as_bytes().to_vec();
        let off = i64::try_from(offset).unwrap_or(i64::MAX);
        let len = i32::try_from(len).unwrap_or(i32::MAX);
        let row = c
            .query_typed_one(
                "SELECT alkblobs_lo_outboard($1, $2, $3, $4)",
                &[
                    (&self.pg.name(), Type::TEXT),
                    (&k, Type::BYTEA),
                    (&off, Type::INT8),
                    (&len, Type::INT4),
                ],
            )
            .await
            .map_err(|e| db_err(self, Some(*key), e))?;
        Ok(row.get::<_, Option<Vec<u8>>>(0).map(Bytes::from))
    }

    async fn read_outboard_windows(
        &self,
        key: &Key,
        windows: &[std::ops::Range<u64>],
    ) -> Result<Option<Vec<Bytes>>> {
        // One query for every window.
        let c = self.pg.conn().await.map_err(|e| rename(e, self))?;
        let k = key.as_bytes().to_vec();
        let offs: Vec<i64> = windows
            .iter()
            .map(|w| i64::try_from(w.start).unwrap_or(i64::MAX))
            .collect();
        let lens: Vec<i32> = windows
            .iter()
            .map(|w| i32::try_from(w.end - w.start).unwrap_or(i32::MAX))
            .collect();
        let rows = c
            .query_typed(
                "SELECT alkblobs_lo_outboard($1, $2, w.o, w.l) \
                   FROM unnest($3::int8[], $4::int4[]) WITH ORDINALITY AS w(o, l, n) ORDER BY w.n",
                &[
                    (&self.pg.name(), Type::TEXT),
                    (&k, Type::BYTEA),
                    (&offs, Type::INT8_ARRAY),
                    (&lens, Type::INT4_ARRAY),
                ],
            )
            .await
            .map_err(|e| db_err(self, Some(*key), e))?;
        Ok(rows
            .iter()
            .map(|r| r.get::<_, Option<Vec<u8>>>(0).map(Bytes::from))
            .collect())
    }

    async fn put_outboard(&self, key: &Key, outboard: Bytes) -> Result<bool> {
        let c = self.pg.conn().await.map_err(|e| rename(e, self))?;
        let k = key.as_bytes().to_vec();
        let row = c
            .query_typed_one(
                "SELECT alkblobs_lo_put_outboard($1, $2, $3)",
                &[
                    (&self.pg.name(), Type::TEXT),
                    (&k, Type::BYTEA),
                    (&outboard.as_ref(), Type::BYTEA),
                ],
            )
            .await
            .map_err(|e| db_err(self, Some(*key), e))?;
        Ok(row.get(0))
    }

    async fn outboard_usage(&self) -> Result<Option<u64>> {
        let rows = self
            .pg
            .rows(
                self,
                None,
                "SELECT lo_outboard_bytes::bigint FROM alkblobs_usage WHERE pool = $1",
                &[(&self.pg.name(), Type::TEXT)],
            )
            .await?;
        Ok(Some(rows.first().map_or(0, |r| r.get::<_, i64>(0) as u64)))
    }

    async fn read_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        let c = self.snapshot().await?;
        let res = async {
            let k = key.as_bytes().to_vec();
            let rows = c
                .query_typed(
                    "SELECT size FROM alkblobs_stat($1, $2) WHERE tier = 'lo'",
                    &[(&self.pg.name(), Type::TEXT), (&k, Type::BYTEA)],
                )
                .await
                .map_err(|e| db_err(self, Some(*key), e))?;
            let Some(size) = rows.first().map(|r| r.get::<_, i64>(0) as u64) else {
                return Ok(None);
            };
            let end = crate::backend::clamp_range(key, size, offset, len)?.end;
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
