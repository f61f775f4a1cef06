//! The `Backend` contract over the writer, the readers and group commit.

#[allow(unused_imports)]
use super::*;

#[async_trait]
impl Backend for SqliteBackend {
    fn name(&self) -> &str {
        "sqlite"
    }

    fn sqlite_database(&self) -> Option<&SqliteBackend> {
        Some(self)
    }

    fn sharing(&self) -> Sharing {
        // A writable open holds the instance lock; a read-only one deletes
        // nothing.
        Sharing::Process
    }

    async fn has(&self, key: &Key) -> Result<bool> {
        let k = *key;
        self.point_read("probe an entry", move |c| {
            c.prepare_cached("SELECT 1 FROM entries WHERE key = ?1")?
                .exists([key_param(&k)])
        })
        .await
    }

    async fn get(&self, key: &Key) -> Result<Option<Bytes>> {
        let k = *key;
        // The value is read only if it is small enough to copy inline (the
        // CASE is evaluated before the column is loaded); a larger one is
        // read again on a blocking thread.
        let read = move |c: &Connection, limit: i64| {
            c.prepare_cached(
                "SELECT CASE WHEN e.size <= ?2 THEN v.value END \
                 FROM entries e JOIN vals v ON v.vid = e.vid WHERE e.key = ?1",
            )?
            .query_row(rusqlite::params![key_param(&k), limit], |r| {
                r.get::<_, Option<Vec<u8>>>(0)
            })
            .optional()
        };
        if self.reads_inline() {
            match self
                .point_read("read a value", move |c| read(c, INLINE_VALUE_MAX))
                .await?
            {
                None => return Ok(None),
                Some(Some(v)) => return Ok(Some(Bytes::from(v))),
                // Present, over the limit: read below.
                Some(None) => {}
            }
        }
        match self
            .read("read a value", move |c| read(c, i64::MAX))
            .await?
        {
            None => Ok(None),
            Some(v) => Ok(Some(Bytes::from(v.unwrap_or_default()))),
        }
    }

    /// Puts use group commit: a put queues its row; if no commit is being
    /// led it leads one, committing every queued row in one transaction
    /// (and, durable, one fsync); each caller returns only after the commit
    /// that holds its row. A lone caller on a multi-thread runtime commits
    /// its own row at once, in its own call. Durable: when the last commit
    /// held several rows, the leader first lets those callers queue again
    /// (`gather`) and leads on a task of its own, as every leader does on a
    /// current-thread runtime, so that no commit waits for a caller's future
    /// to be polled. (Relaxed commits cost no fsync, but sharing them still
    /// took 16 concurrent 1 KiB puts from 62–65k to 85–99k/s here, for ~3%
    /// on a lone caller.)
    async fn put(&self, key: &Key, value: Bytes) -> Result<PutOutcome> {
        self.put_grouped(*key, value).await
    }

    async fn delete(&self, key: &Key) -> Result<Option<u64>> {
        let k = *key;
        self.write("delete an entry", move |w| {
            let tx = w
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = delete_in_tx(&tx, &k)?;
            tx.commit()?;
            Ok(out)
        })
        .await
    }

    fn list(&self) -> KeyStream<'_> {
        crate::pager::paged(
            LIST_PAGE as usize,
            |k: &Key| *k,
            move |after| {
                let after = after_param(after);
                self.read("list keys", move |c| {
                    let mut stmt = c.prepare_cached(
                        "SELECT key FROM entries WHERE key > ?1 ORDER BY key LIMIT ?2",
                    )?;
                    let rows = stmt.query_map(rusqlite::params![after, LIST_PAGE], |r| {
                        key_from_row(r.get(0)?)
                    })?;
                    rows.collect::<rusqlite::Result<Vec<Key>>>()
                })
            },
        )
    }

    fn scan(&self, after: Option<Key>) -> crate::backend::EntryStream<'_> {
        // Pages of rows read in one statement each, cut at SCAN_PAGE rows
        // or SCAN_BYTES of values (a kv value can be as large as the
        // threshold): a short page is not the end, so the pager goes on
        // until an empty one (page size 1).
        const SCAN_PAGE: i64 = 1024;
        const SCAN_BYTES: usize = 8 << 20;
        let first = after;
        crate::pager::paged(
            1,
            |e: &(Key, u64, Bytes)| e.0,
            move |cursor: Option<Key>| {
                let after = after_param(cursor.or(first));
                self.read("scan entries", move |c| {
                    let mut stmt = c.prepare_cached(
                        "SELECT e.key, e.size, v.value FROM entries e JOIN vals v ON v.vid = e.vid \
                         WHERE e.key > ?1 ORDER BY e.key LIMIT ?2",
                    )?;
                    let mut rows = stmt.query(rusqlite::params![after, SCAN_PAGE])?;
                    let (mut page, mut bytes) = (Vec::new(), 0usize);
                    while bytes < SCAN_BYTES
                        && let Some(r) = rows.next()?
                    {
                        let value: Vec<u8> = r.get(2)?;
                        bytes += value.len();
                        page.push((
                            key_from_row(r.get(0)?)?,
                            r.get::<_, i64>(1)? as u64,
                            Bytes::from(value),
                        ));
                    }
                    Ok(page)
                })
            },
        )
    }

    async fn size(&self, key: &Key) -> Result<Option<u64>> {
        let k = *key;
        self.point_read("probe a size", move |c| {
            c.prepare_cached("SELECT size FROM entries WHERE key = ?1")?
                .query_row([key_param(&k)], |r| r.get::<_, i64>(0))
                .optional()
        })
        .await
        .map(|o| o.map(|s| s as u64))
    }

    async fn get_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        let k = *key;
        let read = move |c: &Connection| {
            // One read transaction: the entry row and its value blob
            // come from the same snapshot (`read` has opened one unless
            // the engine is read-only).
            let _tx = if c.is_autocommit() {
                Some(c.unchecked_transaction()?)
            } else {
                None
            };
            let row: Option<(i64, i64)> = c
                .prepare_cached("SELECT size, vid FROM entries WHERE key = ?1")?
                .query_row([key_param(&k)], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            let Some((size, vid)) = row else {
                return Ok(Range::Missing);
            };
            let size = size as u64;
            if offset > size {
                return Ok(Range::PastEnd(size));
            }
            let n = len.min(size - offset) as usize;
            let mut buf = vec![0u8; n];
            if n > 0 {
                let blob = c.blob_open(rusqlite::MAIN_DB, "vals", "value", vid, true)?;
                blob.read_at_exact(&mut buf, offset as usize)?;
            }
            Ok(Range::Data(buf))
        };
        // Inline only when the copy is small (see `get`).
        let range = if len <= INLINE_VALUE_MAX as u64 {
            self.point_read("read a range", read).await?
        } else {
            self.read("read a range", read).await?
        };
        match range {
            Range::Missing => Ok(None),
            Range::PastEnd(size) => Err(Error::InvalidRange {
                key: *key,
                offset,
                size,
            }),
            Range::Data(d) => Ok(Some(Bytes::from(d))),
        }
    }

    async fn put_many(&self, items: &[(Key, Bytes)]) -> Result<Vec<PutOutcome>> {
        let items = items.to_vec();
        self.write("insert a batch", move |w| {
            let hook = w.put_hook();
            let tx = w
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = items
                .iter()
                .map(|(k, v)| put_in_tx(&tx, &mut w.next_vid, hook, k, v))
                .collect::<rusqlite::Result<Vec<_>>>()?;
            tx.commit()?;
            Ok(out)
        })
        .await
    }

    async fn delete_many(&self, keys: &[Key]) -> Result<Vec<Option<u64>>> {
        let keys = keys.to_vec();
        let out = self
            .write("delete a batch", move |w| {
                let tx = w
                    .conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)?;
                let out = keys
                    .iter()
                    .map(|k| delete_in_tx(&tx, k))
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                tx.commit()?;
                Ok(out)
            })
            .await?;
        // The pages the batch freed go back to the filesystem (a database
        // made with incremental auto-vacuum), a bounded step at a time. The
        // deletes are committed: a failure here (a full disk) is not theirs
        // to report, and the next batch tries again.
        if let Err(e) = self.give_back().await {
            tracing::warn!(engine = %self.inner.display, error = %e, "freed pages not given back");
        }
        Ok(out)
    }

    async fn disk_space(&self) -> Result<Option<DiskSpace>> {
        self.disk_space_now().await.map(Some)
    }

    async fn compact(&self) -> Result<Option<(DiskSpace, DiskSpace)>> {
        self.compact_now().await.map(Some)
    }

    async fn usage(&self) -> Result<Option<(u64, u64)>> {
        self.read("count entries", |c| {
            c.query_row(
                "SELECT count(*), coalesce(sum(size), 0) FROM entries",
                [],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
            )
        })
        .await
        .map(Some)
    }

    async fn close(&self) -> Result<()> {
        let inner = self.inner.clone();
        blocking(&self.inner.display, move || inner.close()).await
    }
}
