//! The PostgreSQL client under the `postgres` and `pg-lo` engines and the
//! fleet arbiter (feature `postgres`): connections to a pool's database
//! and their TLS, transactions that never go back to the pool half-done,
//! the driver's errors as this crate's, and pool administration. Neither
//! an engine nor an arbiter: both build on it.

mod admin;
mod connection;
mod errors;
mod info;
mod record;
mod tls;

pub use admin::{PoolHealth, PoolSettings};
pub use connection::{EXTENSION_VERSION, PgOptions, PgPool};
pub(crate) use connection::{InTx, finish};
pub(crate) use errors::{db_err, rename};
pub use info::{Flavour, PoolInfo, PoolLargeTier, PoolMode};
pub use record::PgRecord;
