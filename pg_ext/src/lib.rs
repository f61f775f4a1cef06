//! placeholder
use pgrx::prelude::*;
::pgrx::pg_module_magic!();
#[pg_extern]
fn alkblobs_version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}
