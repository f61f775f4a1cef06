//! How the process ends: one enum of exit codes, the one table `--help`
//! prints (the README carries the same lines), and the classification of
//! every failure into a code.

use std::process::ExitCode;

use alkblobs::{Error, ErrorKind, KeyError};

/// The exit codes. The numbers are an interface scripts branch on: never
/// renumber one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Success.
    Ok = 0,
    /// Anything not classified below: an engine or I/O failure.
    Failure = 1,
    /// Bad usage or input.
    BadInput = 2,
    /// No such blob, or no store at the data directory.
    NotFound = 3,
    /// Content corrupt or missing.
    Integrity = 4,
    /// Another process holds the store.
    InUse = 5,
    /// A sweep aborted.
    SweepAborted = 6,
    /// `pool status`: a pool is critical.
    Critical = 7,
}

impl Exit {
    /// Every code, in order.
    const ALL: [Exit; 8] = [
        Exit::Ok,
        Exit::Failure,
        Exit::BadInput,
        Exit::NotFound,
        Exit::Integrity,
        Exit::InUse,
        Exit::SweepAborted,
        Exit::Critical,
    ];

    /// The code's line in the table.
    fn meaning(self) -> &'static str {
        match self {
            Exit::Ok => "success",
            Exit::Failure => "failure (an engine or I/O error)",
            Exit::BadInput => {
                "bad usage or input (a malformed key, an unreadable file, a bad option)"
            }
            Exit::NotFound => "not found: no blob with that key, or no store at the data directory",
            Exit::Integrity => "integrity: content corrupt or missing",
            Exit::InUse => "the store is in use by another process (see --wait)",
            Exit::SweepAborted => {
                "the sweep aborted (a liveness source could not answer); nothing was deleted"
            }
            Exit::Critical => {
                "pool status: a pool's health is critical (its collector is not running)"
            }
        }
    }

    /// The code an error of this class ends the process with.
    fn of(kind: ErrorKind) -> Exit {
        match kind {
            ErrorKind::NotFound | ErrorKind::Collected => Exit::NotFound,
            ErrorKind::Corrupt | ErrorKind::Lost => Exit::Integrity,
            ErrorKind::TooLarge | ErrorKind::InvalidInput | ErrorKind::Config => Exit::BadInput,
            ErrorKind::InUse => Exit::InUse,
            // ReadOnly, Conflict, Unavailable, Engine, and any class added later.
            _ => Exit::Failure,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e as u8)
    }
}

/// The table `--help` prints after the commands.
pub fn help_table() -> String {
    let mut s = String::from("Exit codes:\n");
    for e in Exit::ALL {
        s.push_str(&format!("  {}  {}\n", e as u8, e.meaning()));
    }
    s
}

/// A failure: the code it ends the process with and a one-line message.
pub struct Fail {
    /// The exit code.
    pub exit: Exit,
    /// What went wrong, on one line.
    pub message: String,
}

impl Fail {
    /// A failure with its code.
    pub fn new(exit: Exit, message: impl Into<String>) -> Fail {
        Fail {
            exit,
            message: message.into(),
        }
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::new(Exit::of(e.kind()), chain(&e))
    }
}

/// A result whose error ends the process.
pub type Res<T = ()> = std::result::Result<T, Fail>;

/// The error and each source it does not already quote, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        let m = x.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        src = x.source();
    }
    s
}

/// A key argument that does not parse, naming what was given.
#[derive(Debug, thiserror::Error)]
#[error("invalid key {input:?}: {source}")]
pub struct BadKey {
    input: String,
    source: KeyError,
}

/// The clap `value_parser` of every key argument: [`alkblobs::Key`]'s
/// `FromStr`, tolerating surrounding whitespace (a pasted line).
pub fn key_arg(s: &str) -> Result<alkblobs::Key, BadKey> {
    s.trim().parse().map_err(|source| BadKey {
        input: s.to_owned(),
        source,
    })
}

/// Ends a command line clap refused: help and version print and succeed; a
/// value that does not parse is one line; other usage errors keep clap's
/// usage hint. All exit [`Exit::BadInput`].
pub fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind as K;
    if !e.use_stderr() {
        let _ = e.print();
        return Exit::Ok.into();
    }
    if e.kind() == K::ValueValidation {
        let source = std::error::Error::source(&e);
        match source.and_then(|s| s.downcast_ref::<BadKey>()) {
            Some(bad) => eprintln!("alkblobs: error: {bad}"),
            None => {
                let rendered = e.render().to_string();
                let first = rendered.lines().next().unwrap_or_default();
                eprintln!("alkblobs: {first}");
            }
        }
    } else {
        let _ = e.print();
    }
    Exit::BadInput.into()
}
