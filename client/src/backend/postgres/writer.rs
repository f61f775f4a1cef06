//! The `pg-lo` writer: one upload, one transaction on one connection,
//! the bytes sent to the extension's upload in windows; committed with
//! `alkblobs_lo_commit` (verified in the server), or rolled back whole.

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use deadpool_postgres::Object;
use tokio_postgres::types::Type;

use super::WINDOW;
use crate::backend::{PutOutcome, StagedWrite};
use crate::pg::PgPool;
use crate::pg::db_err;
use crate::pg::{InTx, finish};
use crate::{Error, Key, Result};

/// The largest outboard stored in an entry (256 MiB: a 64 GiB blob's, the
/// pool's default `max_object_bytes`); a bytea holds at most 1 GiB.
const MAX_OUTBOARD: usize = 256 << 20;

/// An upload in progress: one transaction on one connection, the bytes
/// written to the extension's upload in windows. Dropped without a commit,
/// the connection is closed (not returned to the pool), which rolls the
/// transaction and the large object back.
pub(super) struct PgLoWrite<'a> {
    /// The engine, for messages.
    pub(super) engine: &'a (dyn std::fmt::Display + Sync),
    pub(super) pg: &'a PgPool,
    pub(super) conn: Option<Object>,
    pub(super) loid: u32,
    pub(super) buf: BytesMut,
    pub(super) offset: u64,
    pub(super) written: u64,
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

    async fn commit(mut self: Box<Self>, key: &Key, outboard: Bytes) -> Result<PutOutcome> {
        self.flush().await?;
        let c = InTx::adopt(
            self.conn
                .take()
                .ok_or_else(|| Error::engine(self.engine, "upload already finished"))?,
        );
        let k = key.as_bytes().to_vec();
        let owner = self.pg.owner();
        let created = c
            .query_typed_one(
                "SELECT alkblobs_lo_commit($1, $2, $3, $4, $5)",
                &[
                    (&self.pg.name(), Type::TEXT),
                    (&k, Type::BYTEA),
                    (&self.loid, Type::OID),
                    (&owner, Type::TEXT),
                    // None: an engine-level put's (it has none), or one
                    // too big for one bytea parameter (a blob over 64 GiB:
                    // its ranges verify by the whole blob).
                    (
                        &(!outboard.is_empty() && outboard.len() <= MAX_OUTBOARD)
                            .then_some(outboard.as_ref()),
                        Type::BYTEA,
                    ),
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
