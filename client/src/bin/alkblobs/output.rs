//! Output helpers. JSON is always serde's: one value, or a sequence written
//! element by element as a stream yields it, so a listing of millions of
//! keys is never held in memory and never hand-framed.

use std::io::{BufWriter, Write};

use futures::{Stream, TryStreamExt};
use serde::Serialize;
use serde::ser::{SerializeSeq, Serializer as _};

use crate::exit::{Exit, Fail, Res};

fn io_fail(e: std::io::Error) -> Fail {
    Fail::new(Exit::Failure, format!("writing the output: {e}"))
}

fn json_fail(e: serde_json::Error) -> Fail {
    Fail::new(Exit::Failure, format!("writing JSON: {e}"))
}

/// Prints one value as pretty JSON.
pub fn print_json<T: Serialize>(v: &T) -> Res {
    let mut out = BufWriter::new(std::io::stdout().lock());
    serde_json::to_writer_pretty(&mut out, v).map_err(json_fail)?;
    writeln!(out).map_err(io_fail)?;
    out.flush().map_err(io_fail)
}

/// Prints a stream as one JSON array, element by element. If the stream
/// fails midway the array is left unclosed and the error ends the process
/// with a non-zero code: a reader never mistakes a partial listing for a
/// whole one.
pub async fn json_seq<T, S>(items: S) -> Res
where
    T: Serialize,
    S: Stream<Item = alkblobs::Result<T>>,
{
    let mut items = std::pin::pin!(items);
    let mut ser = serde_json::Serializer::pretty(BufWriter::new(std::io::stdout().lock()));
    let mut seq = ser.serialize_seq(None).map_err(json_fail)?;
    while let Some(item) = items.try_next().await? {
        seq.serialize_element(&item).map_err(json_fail)?;
    }
    seq.end().map_err(json_fail)?;
    let mut out = ser.into_inner();
    writeln!(out).map_err(io_fail)?;
    out.flush().map_err(io_fail)
}

/// Prints a stream as text, one `line` per element.
pub async fn lines<T, S>(
    items: S,
    mut line: impl FnMut(&mut dyn Write, &T) -> std::io::Result<()>,
) -> Res
where
    S: Stream<Item = alkblobs::Result<T>>,
{
    let mut items = std::pin::pin!(items);
    let mut out = BufWriter::new(std::io::stdout().lock());
    while let Some(item) = items.try_next().await? {
        line(&mut out, &item).map_err(io_fail)?;
    }
    out.flush().map_err(io_fail)
}

/// Prints a stream as a JSON array or as text lines, as `--json` says.
pub async fn list<T, S>(
    json: bool,
    items: S,
    line: impl FnMut(&mut dyn Write, &T) -> std::io::Result<()>,
) -> Res
where
    T: Serialize,
    S: Stream<Item = alkblobs::Result<T>>,
{
    if json {
        json_seq(items).await
    } else {
        lines(items, line).await
    }
}
