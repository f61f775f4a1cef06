//! `staged`: the one place that shows staged delete candidates.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use alkblobs::{Key, StagedRow};
use futures::TryStreamExt;
use serde::Serialize;

use crate::ctx::Ctx;
use crate::exit::Res;
use crate::output::list;

/// One candidate, as `--json` prints it.
#[derive(Serialize)]
struct StagedLine {
    key: Key,
    staged_at_ms: i64,
    visible_after_ms: Option<i64>,
    due: String,
}

impl From<StagedRow> for StagedLine {
    fn from(r: StagedRow) -> StagedLine {
        StagedLine {
            key: r.key,
            staged_at_ms: r.staged_at_ms,
            visible_after_ms: r.visible_after_ms,
            due: due_text(r.visible_after_ms),
        }
    }
}

fn due_text(visible_after_ms: Option<i64>) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    match visible_after_ms {
        None => "being staged".into(),
        Some(v) if v <= now => "due now".into(),
        Some(v) => {
            let secs = ((v - now) as u64).div_ceil(1000);
            format!(
                "due in {}",
                humantime::format_duration(Duration::from_secs(secs))
            )
        }
    }
}

/// Every staged row, page by page, in key order.
pub async fn staged(ctx: &Ctx) -> Res {
    let store = ctx.open_read().await?;
    let rows = store.staged_all().map_ok(StagedLine::from);
    list(ctx.json, rows, |out, l| {
        writeln!(out, "{}  {}", l.key, l.due)
    })
    .await
}
