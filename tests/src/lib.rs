//! Support for this repository's own test suites.
//!
//! The conformance suites themselves are published from the crate
//! (`alkblobs::conformance`, feature `conformance`) so third-party engines
//! run the same cases; `tests/tests/{engines,stores,arbiters}.rs` run them
//! over every in-tree engine and store configuration. What lives here is
//! specific to this repository: GC store configurations, child processes
//! for crash tests, and the PostgreSQL helpers.

pub use alkblobs::conformance::{absent_key, data, fault};

#[cfg(feature = "s3")]
pub mod s3;

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

    /// A test that fails (or forgets) leaves no helper behind: one that a
    /// test stopped (SIGSTOP) would otherwise wait for ever, holding its
    /// connections.
    impl Drop for Helper {
        fn drop(&mut self) {
            if let Ok(None) = self.child.try_wait() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }
}

pub mod gc_support;
#[cfg(feature = "pg")]
pub mod pg;

#[cfg(feature = "pg")]
pub mod copies;

/// The blob of seed `seed` in the fleet race (sizes across both tiers at
/// the default threshold: 100 B, 3 KB, 70 KB, 300 KB).
pub fn fleet_value(seed: u64) -> Vec<u8> {
    let size = [100, 3_000, 70_000, 300_000][(seed % 4) as usize];
    data(seed, size)
}
