//! Which store or pool a prefix belongs to (`alkblobs.owner`). Each store
//! sweeps its prefix against its own protection only: an embedded store
//! pointed at a fleet pool's prefix, or two embedded stores one after the
//! other at one prefix, would each collect what the other holds. The lease
//! excludes two writers at once; this excludes them for good. A writable
//! open with an owner ([`super::S3Options::owner`]) records it the first
//! time — created exclusively where the service has conditional puts,
//! else written, settled and read back as the lease is — and refuses a
//! prefix recorded as another's with one line naming both.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::{Inner, lease, unsupported};
use crate::{Error, Result};

/// What the owner object says of a prefix: its first line.
async fn recorded(inner: &Arc<Inner>) -> Result<Option<String>> {
    match inner.store.get(&inner.opts.location.owner()).await {
        Ok(g) => {
            let body = g
                .bytes()
                .await
                .map_err(|e| inner.err("read the prefix's owner", e))?;
            Ok(Some(
                String::from_utf8_lossy(&body)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_owned(),
            ))
        }
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(inner.err("read the prefix's owner", e)),
    }
}

fn refused(inner: &Arc<Inner>, theirs: &str, mine: &str) -> Error {
    Error::Config(format!(
        "{}: the prefix belongs to {theirs:?}, not {mine:?} ({}): a prefix is one store's or one pool's, as another's sweep would collect what this one holds. Use a prefix of its own; or, if {theirs:?} is gone for good and this store takes its objects over, delete that object first",
        inner.display,
        inner.opts.location.owner()
    ))
}

/// Records `mine` as the prefix's owner, or checks that it is.
pub(super) async fn claim(inner: &Arc<Inner>, mine: &str) -> Result<()> {
    match recorded(inner).await? {
        Some(theirs) if theirs == mine => return Ok(()),
        Some(theirs) => return Err(refused(inner, &theirs, mine)),
        None => {}
    }
    lease::probe_conditional(inner).await?;
    let path = inner.opts.location.owner();
    let body = PutPayload::from(format!("{mine}\n"));
    if inner.conditional.load(Ordering::Relaxed) {
        let create = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match inner.store.put_opts(&path, body.clone(), create).await {
            Ok(_) => return Ok(()),
            // Another open recorded one first: theirs is the owner.
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => {
                return match recorded(inner).await? {
                    Some(theirs) if theirs == mine => Ok(()),
                    Some(theirs) => Err(refused(inner, &theirs, mine)),
                    None => Err(Error::Unavailable {
                        engine: inner.display.clone(),
                        source: "the prefix's owner object was created and removed meanwhile; open again".into(),
                    }),
                };
            }
            Err(e) if unsupported(&e) => inner.conditional.store(false, Ordering::Relaxed),
            Err(e) => return Err(inner.err("record the prefix's owner", e)),
        }
    }
    inner
        .store
        .put(&path, body)
        .await
        .map_err(|e| inner.err("record the prefix's owner", e))?;
    // Two first opens write within a request's time of each other: wait
    // that out, then both read back the later writer's.
    tokio::time::sleep(lease::SETTLE).await;
    match recorded(inner).await? {
        Some(theirs) if theirs == mine => Ok(()),
        Some(theirs) => Err(refused(inner, &theirs, mine)),
        None => Err(Error::Unavailable {
            engine: inner.display.clone(),
            source: "the prefix's owner object vanished after it was written; open again".into(),
        }),
    }
}
