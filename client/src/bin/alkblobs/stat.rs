//! `stat`: a blob's size and tier.

use alkblobs::{Error, Key};
use indicatif::HumanBytes;

use crate::ctx::Ctx;
use crate::exit::Res;
use crate::output::print_json;

pub async fn stat(ctx: &Ctx, key: Key) -> Res {
    let store = ctx.open_read().await?;
    let meta = store.stat(&key).await?.ok_or(Error::NotFound { key })?;
    if ctx.json {
        return print_json(&meta);
    }
    println!(
        "key:  {}\nsize: {} ({} bytes)\ntier: {}",
        meta.key,
        HumanBytes(meta.size),
        meta.size,
        meta.tier
    );
    Ok(())
}
