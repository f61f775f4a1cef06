//! The statements the kv and the large-object engine share: paging a
//! tier, one key's size and tier, a tier's usage, deleting keys.

use std::fmt;

use futures::StreamExt;
use tokio_postgres::Row;
use tokio_postgres::types::Type;

use crate::backend::KeyStream;
use crate::pg::PgPool;
use crate::{Error, Key, Result};

/// Keys per `alkblobs_list` page.
const PAGE: i32 = 10_000;

pub(super) fn key_of(row: &Row, i: usize, engine: &(dyn fmt::Display + Sync)) -> Result<Key> {
    let b: Vec<u8> = row.get(i);
    Key::from_slice(&b).map_err(|e| Error::engine(engine, format!("bad key in the database: {e}")))
}

/// Lists keys of one tier in pages.
pub(super) fn list_tier<'a>(
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
                    (&pg.name(), Type::TEXT),
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
pub(super) async fn stat(
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
            &[(&pg.name(), Type::TEXT), (&k, Type::BYTEA)],
        )
        .await?;
    Ok(rows
        .first()
        .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, String>(1))))
}

/// Entries and bytes of one tier (`kv` or `lo`) from `alkblobs_usage`.
pub(super) async fn tier_usage(
    pg: &PgPool,
    engine: &(dyn fmt::Display + Sync),
    tier: &str,
) -> Result<Option<(u64, u64)>> {
    let sql =
        format!("SELECT {tier}_entries, {tier}_bytes::bigint FROM alkblobs_usage WHERE pool = $1");
    let rows = pg
        .rows(engine, None, &sql, &[(&pg.name(), Type::TEXT)])
        .await?;
    Ok(rows
        .first()
        .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1) as u64)))
}

/// Deletes keys of the pool (at most 1,000 per call), returning each
/// deleted key's size.
pub(super) async fn delete_keys(
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
                &[(&pg.name(), Type::TEXT), (&arr, Type::BYTEA_ARRAY)],
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
