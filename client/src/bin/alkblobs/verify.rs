//! `verify`: re-hash every blob.

use alkblobs::VerifyOptions;
use indicatif::HumanBytes;

use crate::ctx::Ctx;
use crate::exit::{Exit, Fail, Res};
use crate::output::print_json;

pub async fn verify(ctx: &Ctx, repair_outboards: bool) -> Res {
    let store = if repair_outboards {
        ctx.open_write().await?
    } else {
        ctx.open_read().await?
    };
    let pb = ctx.bar(None, "{spinner} verifying: {msg}");
    let opts = VerifyOptions::default().repair_outboards(repair_outboards);
    let report = store
        .verify_with_options(opts, |p| {
            pb.set_message(format!("{} blobs, {}", p.checked, HumanBytes(p.bytes)))
        })
        .await?;
    pb.finish_and_clear();
    if ctx.json {
        print_json(&report)?;
    } else {
        for c in &report.corrupt {
            println!("corrupt  {}  ({}: {})", c.key, c.tier, c.detail);
        }
        for k in &report.missing {
            println!("missing  {k}  (a root with no content)");
        }
        println!(
            "verified {} blobs ({}): {} corrupt, {} missing",
            report.checked,
            HumanBytes(report.bytes),
            report.corrupt.len(),
            report.missing.len()
        );
        let unusable = report.outboards_missing + report.outboards_damaged;
        if unusable > 0 {
            println!(
                "outboards: {} missing, {} damaged, {}",
                report.outboards_missing,
                report.outboards_damaged,
                if report.outboards_repaired > 0 {
                    format!("{} repaired", report.outboards_repaired)
                } else {
                    "their blobs' ranges verify by reading them whole (alkblobs verify --repair-outboards)".to_owned()
                }
            );
        }
    }
    if report.is_clean() {
        return Ok(());
    }
    Err(Fail::new(
        Exit::Integrity,
        format!(
            "{} corrupt and {} missing entries",
            report.corrupt.len(),
            report.missing.len()
        ),
    ))
}
