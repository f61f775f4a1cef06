//! `ls`: every key, optionally with size and tier, streamed.

use futures::TryStreamExt;

use crate::ctx::Ctx;
use crate::exit::Res;
use crate::output::list;

pub async fn ls(ctx: &Ctx, long: bool) -> Res {
    let store = ctx.open_read().await?;
    if !long {
        return list(ctx.json, store.list(), |out, k| writeln!(out, "{k}")).await;
    }
    // A key collected between the listing and its stat is skipped: the
    // listing is of what was there, never an error.
    let store = &store;
    let metas = store
        .list()
        .try_filter_map(|k| async move { store.stat(&k).await });
    list(ctx.json, metas, |out, m| {
        writeln!(out, "{}  {:>12}  {}", m.key, m.size, m.tier)
    })
    .await
}
