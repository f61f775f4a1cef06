//! The alkblobs conformance suite.
//!
//! - [`backend_cases`]: `pub async fn` cases over any `&dyn Backend`.
//! - [`store_cases`]: cases over a `Store` in any configuration.
//! - [`fault`]: an engine wrapper that fails the Nth write or delete.
//!
//! `backend_suite!` and `store_suite!` stamp out one `#[tokio::test]` per
//! case for an engine or a store configuration, so every engine runs the
//! whole list and the list is written once. Capability differences are
//! parameters ([`backend_cases::Caps`], [`store_cases::Config`]), not copies.

pub mod backend_cases;
pub mod fault;
pub mod store_cases;

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
pub fn absent_key(tag: &str) -> alkblobs::Key {
    alkblobs::Key::of(format!("absent:{tag}").as_bytes())
}
