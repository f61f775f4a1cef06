//! `ls`: every key, optionally with size and tier.

use std::io::Write;

use futures::TryStreamExt;

use crate::ctx::Ctx;
use crate::exit::{Exit, Fail, Res};

pub async fn ls(ctx: &Ctx, long: bool) -> Res {
    let store = ctx.open_read().await?;
    let mut keys = store.list();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let io = |e: std::io::Error| Fail::new(Exit::Failure, e.to_string());
    if ctx.json {
        write!(out, "[").map_err(io)?;
    }
    let mut first = true;
    while let Some(k) = keys.try_next().await? {
        if ctx.json {
            let sep = if first { "" } else { "," };
            if long {
                if let Some(m) = store.stat(&k).await? {
                    write!(
                        out,
                        "{sep}\n  {}",
                        serde_json::to_string(&m).unwrap_or_default()
                    )
                    .map_err(io)?;
                }
            } else {
                write!(out, "{sep}\n  \"{k}\"").map_err(io)?;
            }
        } else if long {
            if let Some(m) = store.stat(&k).await? {
                writeln!(out, "{k}  {:>12}  {}", m.size, m.tier).map_err(io)?;
            }
        } else {
            writeln!(out, "{k}").map_err(io)?;
        }
        first = false;
    }
    if ctx.json {
        writeln!(out, "{}]", if first { "" } else { "\n" }).map_err(io)?;
    }
    out.flush().map_err(io)
}
