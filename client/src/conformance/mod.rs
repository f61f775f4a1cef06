//! The conformance suites, published so a third-party engine, store
//! configuration or arbiter runs the same cases ours do (feature
//! `conformance`).
//!
//! - [`backend`]: `pub async fn` cases over any `Arc<dyn Backend>`, plus the
//!   large-engine cases over `Arc<dyn LargeBackend>`;
//!   [`backend_suite!`](crate::backend_suite) and
//!   [`large_backend_suite!`](crate::large_backend_suite) stamp out one
//!   `#[tokio::test]` per case.
//! - [`store`]: cases over a [`crate::Store`] in any configuration
//!   ([`store_suite!`](crate::store_suite)).
//! - [`arbiter`]: the GC invariant over a store's arbiter — pins, liveness,
//!   roots, aborts, the sweeper lock, in-flight puts, windows
//!   ([`arbiter_suite!`](crate::arbiter_suite)).
//! - [`fault`]: an engine wrapper that fails the Nth write or delete.
//!
//! Capability differences are parameters ([`backend::Caps`],
//! [`store::Config`]), not copies. The macros expand to `#[tokio::test]`s:
//! the calling crate needs `tokio` (with `macros` and `rt-multi-thread`) as
//! a dev-dependency.
//!
//! ```text
//! // tests/conformance.rs of a crate with its own engine
//! alkblobs::backend_suite!(my_kv, alkblobs::conformance::backend::Caps {
//!     max_value: 65_537, list_keys: 10_000 }, async { (MyKv::open().await, ()) });
//! alkblobs::store_suite!(my_store, alkblobs::conformance::store::Config {
//!     kv_only: true, big: 0, list_keys: 10_000 }, async {
//!     (alkblobs::Store::builder().kv(MyKv::open().await).kv_only().build().unwrap(), ())
//! });
//! ```

pub mod arbiter;
pub mod backend;
pub mod fault;
pub mod store;

/// Deterministic incompressible bytes: the BLAKE3 XOF of `seed`.
pub fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    blake3::Hasher::new()
        .update(&seed.to_le_bytes())
        .finalize_xof()
        .fill(&mut out);
    out
}

/// A key that is certainly absent (the hash of a marker string).
pub fn absent_key(tag: &str) -> crate::Key {
    crate::Key::of(format!("absent:{tag}").as_bytes())
}
