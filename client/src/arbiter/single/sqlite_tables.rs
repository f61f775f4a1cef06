//! The single-node arbiter's durable tables in an embedded SQLite database.
//!
//! `staged` and `roots` live in the same database as the entries, created
//! here and not by the `sqlite` engine, which knows only its own tables.
//! Sharing the database buys one thing the protocol relies on: a put
//! deletes its key's staged row in the entry's own transaction, so "re-put
//! restarts the window" holds even across a crash. That cooperation is the
//! engine's public companion seam ([`PutHook`]), installed by
//! [`SqliteTables::attach`], which the preset calls when it builds the
//! store — never discovered through the engine trait.

use async_trait::async_trait;
use rusqlite::TransactionBehavior;

use super::tables::{GcTables, StagedRow};
use crate::backend::sqlite::{Companion, PutHook, SqliteBackend};
use crate::{Key, Result};

/// The arbiter's tables (created at attach, idempotent).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS staged (
    key           BLOB PRIMARY KEY,
    staged_at     INTEGER NOT NULL,
    visible_after INTEGER
) WITHOUT ROWID;
-- No index on visible_after: `due` walks the primary key (key order) and
-- seal/discard scan once per sweep; an index would make sealing rewrite it.
DROP INDEX IF EXISTS staged_visible_after;
CREATE TABLE IF NOT EXISTS roots (
    key BLOB PRIMARY KEY
) WITHOUT ROWID;
";

/// What every put runs in its transaction: a re-put key's staged row goes
/// (its window restarts). Skipped by the engine while `staged` is known to
/// be empty.
const ON_PUT: PutHook = PutHook {
    on_put: "DELETE FROM staged WHERE key = ?1",
};

fn any_staged(c: &rusqlite::Connection) -> rusqlite::Result<bool> {
    c.query_row("SELECT EXISTS (SELECT 1 FROM staged)", [], |r| r.get(0))
}

/// Recomputes whether puts need the hook, after rows were removed.
fn refresh(w: &mut Companion<'_>) -> rusqlite::Result<()> {
    let any = any_staged(w.conn())?;
    w.set_hook_active(any);
    Ok(())
}

fn key_param(k: &Key) -> &[u8] {
    k.as_bytes()
}

/// A `key > after` bound: the empty blob sorts before every 32-byte key.
fn after_param(after: Option<Key>) -> Vec<u8> {
    after.map(|k| k.as_bytes().to_vec()).unwrap_or_default()
}

fn key_from_row(bytes: Vec<u8>) -> rusqlite::Result<Key> {
    Key::from_slice(&bytes).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Blob, Box::new(e))
    })
}

/// `staged` and `roots` rows in a [`SqliteBackend`]'s database.
#[derive(Debug, Clone)]
pub struct SqliteTables {
    db: SqliteBackend,
}

impl SqliteTables {
    /// The tables of `db`'s database, created if missing. Rows staged
    /// through them are cleared by a put of their key on `db`, in the put's
    /// own transaction (see the module docs).
    pub fn attach(db: &SqliteBackend) -> Result<SqliteTables> {
        db.install_put_hook(SCHEMA, ON_PUT, any_staged)?;
        Ok(SqliteTables { db: db.clone() })
    }
}

fn staged_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StagedRow> {
    Ok(StagedRow {
        key: key_from_row(r.get(0)?)?,
        staged_at_ms: r.get(1)?,
        visible_after_ms: r.get(2)?,
    })
}

fn for_each_key<F>(
    w: &mut Companion<'_>,
    keys: Vec<Key>,
    sql: &'static str,
    mut f: F,
) -> rusqlite::Result<u64>
where
    F: FnMut(&mut rusqlite::CachedStatement<'_>, &Key) -> rusqlite::Result<usize>,
{
    let tx = w
        .conn()
        .transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut n = 0u64;
    {
        let mut stmt = tx.prepare_cached(sql)?;
        for k in &keys {
            n += f(&mut stmt, k)? as u64;
        }
    }
    tx.commit()?;
    Ok(n)
}

#[async_trait]
impl GcTables for SqliteTables {
    fn durable(&self) -> bool {
        true
    }

    async fn discard_unsealed(&self) -> Result<u64> {
        self.db
            .companion_write("discard unsealed staged rows", |w| {
                let n = w
                    .conn()
                    .execute("DELETE FROM staged WHERE visible_after IS NULL", [])?;
                refresh(w)?;
                Ok(n as u64)
            })
            .await
    }

    async fn stage(&self, keys: &[Key], now_ms: i64) -> Result<u64> {
        let keys = keys.to_vec();
        self.db.companion_write("stage candidates", move |w| {
            // Set before the rows exist: a put racing this stage then clears
            // the row it finds (the flag is only read under the writer's
            // mutex).
            w.set_hook_active(true);
            for_each_key(
                w,
                keys,
                "INSERT INTO staged (key, staged_at, visible_after) VALUES (?1, ?2, NULL) ON CONFLICT (key) DO NOTHING",
                |s, k| s.execute(rusqlite::params![key_param(k), now_ms]),
            )
        })
        .await
    }

    async fn seal(&self, visible_after_ms: i64) -> Result<u64> {
        self.db
            .companion_write("seal staged rows", move |w| {
                w.conn()
                    .execute(
                        "UPDATE staged SET visible_after = ?1 WHERE visible_after IS NULL",
                        [visible_after_ms],
                    )
                    .map(|n| n as u64)
            })
            .await
    }

    async fn reseal(&self, visible_after_ms: i64) -> Result<u64> {
        self.db
            .companion_write("re-seal staged rows", move |w| {
                w.conn()
                    .execute(
                        "UPDATE staged SET visible_after = ?1
                         WHERE visible_after IS NOT NULL AND visible_after > ?1",
                        [visible_after_ms],
                    )
                    .map(|n| n as u64)
            })
            .await
    }

    async fn due(&self, now_ms: i64, after: Option<Key>, limit: usize) -> Result<Vec<StagedRow>> {
        let after = after_param(after);
        self.db
            .companion_read("read due staged rows", move |c| {
                let mut s = c.prepare_cached(
                    // Walks the primary key, already in key order.
                    "SELECT key, staged_at, visible_after FROM staged
                 WHERE key > ?1 AND visible_after <= ?2
                 ORDER BY key LIMIT ?3",
                )?;
                let rows =
                    s.query_map(rusqlite::params![after, now_ms, limit as i64], staged_row)?;
                rows.collect()
            })
            .await
    }

    async fn unstage(&self, keys: &[Key]) -> Result<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        let keys = keys.to_vec();
        self.db
            .companion_write("unstage keys", move |w| {
                if !w.hook_active() {
                    return Ok(0); // nothing is staged
                }
                let n = for_each_key(w, keys, "DELETE FROM staged WHERE key = ?1", |s, k| {
                    s.execute([key_param(k)])
                })?;
                refresh(w)?;
                Ok(n)
            })
            .await
    }

    async fn staged(&self, after: Option<Key>, limit: usize) -> Result<Vec<StagedRow>> {
        let after = after_param(after);
        self.db.companion_read("list staged rows", move |c| {
            let mut s = c.prepare_cached(
                "SELECT key, staged_at, visible_after FROM staged WHERE key > ?1 ORDER BY key LIMIT ?2",
            )?;
            let rows = s.query_map(rusqlite::params![after, limit as i64], staged_row)?;
            rows.collect()
        })
        .await
    }

    async fn add_roots(&self, keys: &[Key]) -> Result<u64> {
        let keys = keys.to_vec();
        self.db
            .companion_write("add roots", move |w| {
                for_each_key(
                    w,
                    keys,
                    "INSERT INTO roots (key) VALUES (?1) ON CONFLICT (key) DO NOTHING",
                    |s, k| s.execute([key_param(k)]),
                )
            })
            .await
    }

    async fn remove_roots(&self, keys: &[Key]) -> Result<u64> {
        let keys = keys.to_vec();
        self.db
            .companion_write("remove roots", move |w| {
                for_each_key(w, keys, "DELETE FROM roots WHERE key = ?1", |s, k| {
                    s.execute([key_param(k)])
                })
            })
            .await
    }

    async fn roots(&self, after: Option<Key>, limit: usize) -> Result<Vec<Key>> {
        let after = after_param(after);
        self.db
            .companion_read("list roots", move |c| {
                let mut s =
                    c.prepare_cached("SELECT key FROM roots WHERE key > ?1 ORDER BY key LIMIT ?2")?;
                let rows = s.query_map(rusqlite::params![after, limit as i64], |r| {
                    key_from_row(r.get(0)?)
                })?;
                rows.collect()
            })
            .await
    }

    async fn roots_contain(&self, keys: &[Key]) -> Result<Vec<bool>> {
        let keys = keys.to_vec();
        self.db
            .companion_read("probe roots", move |c| {
                let sorted = keys.windows(2).all(|w| w[0] < w[1]);
                if sorted && keys.len() > 16 {
                    // The GC asks about key-ordered batches: one range scan and
                    // a merge instead of a probe per key.
                    let (first, last) = (keys[0], keys[keys.len() - 1]);
                    let mut s = c.prepare_cached(
                        "SELECT key FROM roots WHERE key >= ?1 AND key <= ?2 ORDER BY key",
                    )?;
                    let mut rows = s.query([key_param(&first), key_param(&last)])?;
                    let mut out = vec![false; keys.len()];
                    let mut i = 0;
                    while let Some(row) = rows.next()? {
                        let root = key_from_row(row.get(0)?)?;
                        while i < keys.len() && keys[i] < root {
                            i += 1;
                        }
                        if i < keys.len() && keys[i] == root {
                            out[i] = true;
                            i += 1;
                        }
                    }
                    return Ok(out);
                }
                let mut s = c.prepare_cached("SELECT 1 FROM roots WHERE key = ?1")?;
                keys.iter().map(|k| s.exists([key_param(k)])).collect()
            })
            .await
    }
}
