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

/// Child processes for crash and locking tests.
pub mod proc {
    use std::io::{BufRead, BufReader};
    use std::process::{Child, ChildStdout, Command, Stdio};

    /// A running helper with its stdout lines.
    pub struct Helper {
        /// The process.
        pub child: Child,
        /// Its stdout.
        pub out: BufReader<ChildStdout>,
    }

    impl Helper {
        /// Starts `bin` with `args`, stdin and stdout piped.
        pub fn spawn(bin: &str, args: &[&str]) -> Helper {
            let mut child = Command::new(bin)
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn helper");
            let out = BufReader::new(child.stdout.take().unwrap());
            Helper { child, out }
        }

        /// The next stdout line, without its newline; `None` at EOF.
        pub fn line(&mut self) -> Option<String> {
            let mut s = String::new();
            match self.out.read_line(&mut s) {
                Ok(0) | Err(_) => None,
                Ok(_) => Some(s.trim_end().to_owned()),
            }
        }

        /// Reads lines until one equals `want`; panics at EOF.
        pub fn wait_for(&mut self, want: &str) {
            while let Some(l) = self.line() {
                if l == want {
                    return;
                }
            }
            panic!("helper exited before printing {want:?}");
        }

        /// SIGKILLs the helper and reaps it.
        pub fn kill(mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub mod gc_support;
#[cfg(feature = "pg")]
pub mod pg;
