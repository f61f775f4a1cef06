//! `verify`: re-hash every blob.

use indicatif::HumanBytes;

use crate::ctx::Ctx;
use crate::exit::{Exit, Fail, Res};
use crate::output::print_json;

pub async fn verify(ctx: &Ctx) -> Res {
    let store = ctx.open_read().await?;
    let pb = ctx.bar(None, "{spinner} verifying: {msg}");
    let report = store
        .verify_with(|p| pb.set_message(format!("{} blobs, {}", p.checked, HumanBytes(p.bytes))))
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
