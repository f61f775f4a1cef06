//! `usage`: entries and bytes per tier, and the database's size on disk;
//! `compact`: give its free space back.

use indicatif::HumanBytes;

use crate::ctx::Ctx;
use crate::exit::Res;
use crate::output::print_json;

pub async fn usage(ctx: &Ctx) -> Res {
    let store = ctx.open_read().await?;
    let u = store.usage().await?;
    if ctx.json {
        return print_json(&u);
    }
    let row = |tier: &str, entries: u64, bytes: u64, engine: &str| {
        println!(
            "{tier:<6} {entries:>10} {:>12}  {engine}",
            HumanBytes(bytes).to_string()
        );
    };
    println!("{:<6} {:>10} {:>12}  engine", "tier", "entries", "bytes");
    row("kv", u.kv.entries, u.kv.bytes, &u.kv.engine);
    if let Some(l) = &u.large {
        row("large", l.entries, l.bytes, &l.engine);
    }
    let outboards = u.large.as_ref().and_then(|l| l.outboard_bytes);
    if let Some(ob) = outboards {
        println!(
            "{:<6} {:>10} {:>12}  (BLAKE3 outboards of large blobs)",
            "",
            "",
            HumanBytes(ob).to_string()
        );
    }
    let total = u.kv.bytes + u.large.as_ref().map_or(0, |l| l.bytes) + outboards.unwrap_or(0);
    println!(
        "total  {:>10} {:>12}",
        u.kv.entries + u.large.as_ref().map_or(0, |l| l.entries),
        HumanBytes(total).to_string()
    );
    for (tier, t) in std::iter::once(("kv", &u.kv)).chain(u.large.iter().map(|l| ("large", l))) {
        if let Some(d) = t.disk {
            println!(
                "{tier} on disk: {} ({} of it free pages)",
                HumanBytes(d.on_disk),
                HumanBytes(d.free)
            );
        }
    }
    println!("roots: {}, staged for deletion: {}", u.roots, u.staged);
    Ok(())
}

pub async fn compact(ctx: &Ctx) -> Res {
    let store = ctx.open_write().await?;
    let done = store.compact().await?;
    if ctx.json {
        return print_json(&done);
    }
    if done.is_empty() {
        println!("nothing to compact: no engine of this store keeps a database of its own");
    }
    for c in &done {
        println!(
            "{}: {} on disk ({} free) -> {}",
            c.engine,
            HumanBytes(c.before.on_disk),
            HumanBytes(c.before.free),
            HumanBytes(c.after.on_disk)
        );
    }
    Ok(())
}
