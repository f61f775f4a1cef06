//! `stat`: a blob's size, tier and how its ranges are verified.

use alkblobs::{EntryMeta, Error, Key, RangeCheck};
use indicatif::HumanBytes;
use serde::Serialize;

use crate::ctx::Ctx;
use crate::exit::Res;
use crate::output::print_json;

/// What `stat --json` prints.
#[derive(Serialize)]
struct Stat {
    #[serde(flatten)]
    meta: EntryMeta,
    /// `outboard`, `whole_blob` for a large blob stored before outboards,
    /// or `below_floor` for one its engine keeps no outboard for.
    ranges: RangeCheck,
}

pub async fn stat(ctx: &Ctx, key: Key) -> Res {
    let store = ctx.open_read().await?;
    let meta = store.stat(&key).await?.ok_or(Error::NotFound { key })?;
    let ranges = store
        .range_check(&key)
        .await?
        .ok_or(Error::NotFound { key })?;
    if ctx.json {
        return print_json(&Stat { meta, ranges });
    }
    println!(
        "key:    {}\nsize:   {} ({} bytes)\ntier:   {}\nranges: {}",
        meta.key,
        HumanBytes(meta.size),
        meta.size,
        meta.tier,
        match ranges {
            RangeCheck::Outboard => "verified by its outboard (any range, reading only that range)",
            RangeCheck::WholeBlob =>
                "no outboard: a verified range reads the whole blob (alkblobs verify --repair-outboards)",
            RangeCheck::BelowFloor =>
                "verified whole (small enough that its engine keeps no outboard)",
        }
    );
    Ok(())
}
