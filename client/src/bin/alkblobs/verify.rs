//! `verify`: re-hash every blob the store must hold, and name what is
//! corrupt, missing or unrecorded.

use alkblobs::record::Held;
use alkblobs::{VerifyOptions, VerifyReport};
use indicatif::HumanBytes;

use crate::ctx::Ctx;
use crate::exit::{Exit, Fail, Res};
use crate::output::print_json;

pub async fn verify(ctx: &Ctx, opts: VerifyOptions) -> Res {
    let store = if opts.repair_outboards {
        ctx.open_write().await?
    } else {
        ctx.open_read().await?
    };
    let pb = ctx.bar(None, "{spinner} verifying: {msg}");
    let report = store
        .verify_with_options(opts, |p| {
            pb.set_message(format!(
                "{} blobs, {}{}",
                p.checked,
                HumanBytes(p.bytes),
                p.at.map(|k| format!(", at {}", &k.to_string()[..16]))
                    .unwrap_or_default()
            ))
        })
        .await?;
    pb.finish_and_clear();
    if ctx.json {
        print_json(&report)?;
    } else {
        print_text(&report);
        if store.record().is_some() && !report.recorded {
            println!(
                "not recorded in the pool's health (alkblobs_health): that needs sweep access to the pool"
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

fn print_text(report: &VerifyReport) {
    for s in &report.unchecked_sources {
        println!(
            "unchecked {}  ({}: keys only it names were not checked)",
            s.source, s.problem
        );
    }
    // Nothing read, everything missing: most likely the wrong place (a
    // bucket or prefix that holds nothing), said once before the list.
    if report.checked == 0 && report.missing.len() > 1 {
        println!(
            "every one of the {} keys this store must hold is missing: is its large tier's location (bucket, prefix, directory) the pool's?",
            report.missing.len()
        );
    }
    for c in &report.corrupt {
        println!("corrupt  {}  ({}: {})", c.key, c.tier, c.detail);
    }
    for m in &report.missing {
        let recorded = match m.recorded {
            None => "no content".to_owned(),
            Some(Held::Kv) => "recorded as a kv entry, not readable".to_owned(),
            Some(Held::LargeObject | Held::LargeObjectLost) => {
                "recorded, its large object is gone".to_owned()
            }
            Some(Held::File { generation: 0 }) => {
                "recorded as published, the tier does not hold it".to_owned()
            }
            Some(Held::File { generation }) => format!(
                "recorded as published at object generation {generation}, the tier holds no object of that generation"
            ),
            Some(Held::InFlight | Held::Deleting) => "recorded, being put or deleted".to_owned(),
        };
        if m.referenced_by.is_empty() {
            println!("missing  {}  ({recorded})", m.key);
        } else {
            println!(
                "missing  {}  ({recorded}; referenced by {})",
                m.key,
                m.referenced_by.join(", ")
            );
        }
    }
    for m in &report.malformed {
        println!(
            "malformed {}  (not a 32-byte key; held by {})",
            m.value,
            m.referenced_by.join(", ")
        );
    }
    let slice = if report.whole {
        ""
    } else if report.skipped > 0 {
        " (not whole: this node cannot read the pool's large tier)"
    } else if !report.unchecked_sources.is_empty() {
        " (not whole: some references could not be read)"
    } else {
        " (a slice)"
    };
    println!(
        "verified {} blobs ({}){slice}: {} corrupt, {} missing",
        report.checked,
        HumanBytes(report.bytes),
        report.corrupt.len(),
        report.missing.len()
    );
    if !report.unrecorded.is_empty() {
        println!(
            "unrecorded: {} objects of the large tier that no record names (alkblobs verify --json lists them); the pool's next audit stages them (alkblobs_request_audit) and they are deleted a delete window later",
            report.unrecorded.len()
        );
    }
    if !report.abandoned_uploads.is_empty() {
        println!(
            "abandoned uploads: {} large objects ({}) the pool created for puts that ended without committing, that no entry references (alkblobs verify --json lists them); the pool's next sweep unlinks them",
            report.abandoned_uploads.len(),
            HumanBytes(report.abandoned_uploads.iter().map(|u| u.bytes).sum())
        );
    }
    if report.in_flight > 0 || report.forward > 0 {
        println!(
            "not checked: {} puts or deletes in flight, {} forward references to content not put yet",
            report.in_flight, report.forward
        );
    }
    let unusable = report.outboards_missing + report.outboards_damaged;
    if unusable > 0 {
        println!(
            "outboards: {} missing, {} damaged, {}",
            report.outboards_missing,
            report.outboards_damaged,
            if report.outboards_repaired > 0 {
                format!("{} repaired", report.outboards_repaired)
            } else {
                "their blobs' ranges verify by reading them whole (alkblobs verify --repair-outboards)"
                    .to_owned()
            }
        );
    }
}
