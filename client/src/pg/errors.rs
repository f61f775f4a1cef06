//! The driver's and the connection pool's errors as this crate's
//! [`Error`]s.

use std::fmt;

use crate::{Error, Key};

/// What went wrong, as tokio-postgres classifies it. The driver keeps its
/// error kind private but gives each kind one fixed `Display` text (its
/// cause is only in `source()`), so the text of the error itself — never
/// of its cause — names the kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DriverKind {
    /// The server answered with an error (it has a SQLSTATE).
    Db,
    /// The connection is gone (the server closed it, or it broke earlier).
    Closed,
    /// Reading from or writing to the server failed (reset, EOF).
    Io,
    /// Connecting failed (refused, unreachable, DNS).
    Connect,
    /// A connect or statement timeout of the driver.
    Timeout,
    /// The TLS handshake failed.
    Tls,
    /// The URL, the configuration or the client-side authentication.
    Config,
    /// Anything else (a protocol or conversion error: a defect).
    Other,
}

fn driver_kind(e: &tokio_postgres::Error) -> DriverKind {
    if e.as_db_error().is_some() {
        return DriverKind::Db;
    }
    if e.is_closed() {
        return DriverKind::Closed;
    }
    match e.to_string().as_str() {
        "error communicating with the server" => DriverKind::Io,
        "error connecting to server" => DriverKind::Connect,
        "timeout waiting for server" => DriverKind::Timeout,
        "error performing TLS handshake" => DriverKind::Tls,
        "authentication error" | "invalid connection string" | "invalid configuration" => {
            DriverKind::Config
        }
        _ => DriverKind::Other,
    }
}

/// Whether a TLS failure is the connection breaking during the handshake
/// (a server restarting) rather than the handshake being refused (a
/// certificate that does not verify, a server without TLS): an I/O error
/// of a lost connection, and no rustls error, anywhere in the chain.
fn tls_lost_connection(e: &tokio_postgres::Error) -> bool {
    use std::io::ErrorKind as K;
    let mut lost = false;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(err) = cur {
        if err.downcast_ref::<rustls::Error>().is_some() {
            return false;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
            {
                return false;
            }
            lost |= matches!(
                io.kind(),
                K::ConnectionReset
                    | K::ConnectionAborted
                    | K::ConnectionRefused
                    | K::BrokenPipe
                    | K::UnexpectedEof
                    | K::NotConnected
                    | K::TimedOut
            );
        }
        cur = err.source();
    }
    lost
}

/// An error of the driver or the pool as this crate's error: a SQLSTATE by
/// [`Error::from_sqlstate`]; a connection that closed, broke, could not be
/// made or timed out (a server restarting or down) as the retryable
/// [`Error::Unavailable`]; a TLS handshake the server or its certificate
/// refused, and bad configuration, as [`Error::Config`]; anything else as
/// an engine error.
pub(crate) fn db_err(
    engine: &(dyn fmt::Display + Sync),
    key: Option<Key>,
    e: tokio_postgres::Error,
) -> Error {
    if let Some(code) = e.code().map(|c| c.code().to_owned()) {
        return Error::from_sqlstate(engine, &code, key, e);
    }
    let cause = || {
        std::error::Error::source(&e)
            .map(|s| s.to_string())
            .unwrap_or_default()
    };
    match driver_kind(&e) {
        DriverKind::Closed | DriverKind::Io | DriverKind::Connect | DriverKind::Timeout => {
            Error::Unavailable {
                engine: engine.to_string(),
                source: e.into(),
            }
        }
        DriverKind::Tls if tls_lost_connection(&e) => Error::Unavailable {
            engine: engine.to_string(),
            source: e.into(),
        },
        DriverKind::Tls => Error::Config(format!(
            "{engine}: {e}: {}; check sslmode and sslrootcert in the URL",
            cause()
        )),
        DriverKind::Config => Error::Config(format!("{engine}: {e}: {}", cause())),
        DriverKind::Db | DriverKind::Other => Error::engine(engine, e),
    }
}

pub(super) fn pool_err(
    engine: &(dyn fmt::Display + Sync),
    e: deadpool_postgres::PoolError,
) -> Error {
    use deadpool_postgres::PoolError;
    match e {
        PoolError::Backend(e) => db_err(engine, None, e),
        other => Error::Unavailable {
            engine: engine.to_string(),
            source: other.into(),
        },
    }
}

/// An error raised for the pool, renamed for the engine that asked.
pub(crate) fn rename(e: Error, engine: &(dyn fmt::Display + Sync)) -> Error {
    match e {
        Error::Unavailable { source, .. } => Error::Unavailable {
            engine: engine.to_string(),
            source,
        },
        other => other,
    }
}
