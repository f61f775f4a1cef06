//! What the CLI test files share: running the binary on a data directory,
//! and a small tmpfs for the tests of a full disk (they need root, as the
//! power-cut test does; scripts/test.sh runs them so).
#![allow(dead_code)] // Each test file uses its own part.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_alkblobs");

/// The CLI on the store at `dir/data`, run in `dir`.
pub fn cmd(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("ALKBLOBS_DATA_DIR", dir.join("data"))
        .current_dir(dir);
    c
}

pub fn run(dir: &Path, args: &[&str]) -> Output {
    cmd(dir, args).output().expect("run alkblobs")
}

/// Runs and asserts success; returns stdout.
pub fn ok(dir: &Path, args: &[&str]) -> String {
    let o = run(dir, args);
    assert!(o.status.success(), "{args:?} failed: {}", stderr(&o));
    stdout(&o)
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn code(o: &Output) -> i32 {
    o.status.code().expect("exit code")
}

pub fn b3(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// A tmpfs of `size` (as `mount -o size=` takes it) mounted on `at`
/// (created) until dropped.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    pub fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .expect("mount (the test needs root, as scripts/test.sh runs it)");
        assert!(ok.success(), "mount a tmpfs: the test needs root");
        Tmpfs(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}
