//! `explain`: why a key is or is not live — the entry, roots, the staged
//! row and its deadline, the delete window, and a verdict. Exit 0 whether
//! or not the key is live (the answer is the output); a key the pool does
//! not hold is exit 3; a key it records whose content is gone (lost) is
//! exit 4, as for get and stat.

use alkblobs::{Error, Key};
use indicatif::HumanBytes;

use crate::ctx::Ctx;
use crate::exit::Res;
use crate::output::print_json;

pub async fn explain(ctx: &Ctx, key: Key) -> Res {
    let store = ctx.open_read().await?;
    let e = store.explain(&key).await?;
    if ctx.json {
        print_json(&e)?;
    } else {
        println!("key:     {}", e.key);
        match &e.entry {
            Some(m) => println!(
                "entry:   {} ({} bytes) in tier {}",
                HumanBytes(m.size),
                m.size,
                m.tier
            ),
            None if e.lost.is_some() => println!("entry:   LOST: recorded, its content is gone"),
            None => println!("entry:   absent"),
        }
        println!("root:    {}", if e.root { "yes" } else { "no" });
        match &e.staged {
            Some(r) => match r.visible_after_ms {
                Some(v) => println!(
                    "staged:  yes, due at {}",
                    humantime::format_rfc3339_millis(ms_time(v))
                ),
                None => println!("staged:  yes, by a sweep still marking"),
            },
            None => println!("staged:  no"),
        }
        for row in e
            .database
            .iter()
            .filter(|r| r.aspect != "verdict" && r.aspect != "entry")
        {
            println!("{:<8} {}", format!("{}:", row.aspect), row.detail);
        }
        if !e.liveness_sources.is_empty() {
            println!("sources: {}", e.liveness_sources.join(", "));
        }
        println!(
            "window:  {}",
            humantime::format_duration(std::time::Duration::from_secs_f64(e.window_secs))
        );
        println!("verdict: {}", e.verdict);
    }
    if let Some(lost) = e.lost {
        return Err(crate::exit::Fail::new(crate::exit::Exit::Integrity, lost));
    }
    if e.entry.is_none() {
        return Err(Error::NotFound { key }.into());
    }
    Ok(())
}

fn ms_time(ms: i64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64)
}
