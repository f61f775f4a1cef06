//! Group commit of durable puts: rows queue, one caller leads a commit of
//! everything queued (one transaction, one fsync) and hands the lead to a
//! background task while more arrive; each caller is answered after the
//! commit that holds its row.

#[allow(unused_imports)]
use super::*;

/// The group-commit queue: rows waiting, and whether a commit is being led.
#[derive(Default)]
pub(super) struct Group {
    pending: Vec<PendingPut>,
    /// How many rows the last commit held (see `gather`).
    last: usize,
    leading: bool,
}

/// Hands the lead on when the leading put's future ends.
pub(super) struct LeadGuard<'a>(&'a SqliteBackend);

impl Drop for LeadGuard<'_> {
    fn drop(&mut self) {
        self.0.hand_off();
    }
}

/// A background leader; see [`SqliteBackend::lead_in_background`].
pub(super) struct BackgroundLead {
    engine: std::sync::Weak<Inner>,
    finished: bool,
    /// Set once the commit call released the lead.
    released: Arc<std::sync::atomic::AtomicBool>,
}

impl BackgroundLead {
    /// The queue is empty and the lead released: nothing for `drop` to do.
    pub(super) fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for BackgroundLead {
    fn drop(&mut self) {
        if !self.finished
            && !self.released.load(std::sync::atomic::Ordering::Acquire)
            && let Some(inner) = self.engine.upgrade()
        {
            inner.abandon_queue();
        }
    }
}

/// A durable put queued for the next group commit.
pub(super) struct PendingPut {
    key: Key,
    value: Bytes,
    done: tokio::sync::oneshot::Sender<rusqlite::Result<PutOutcome>>,
}

/// Commits every queued put in one transaction and one fsync, answering
/// each caller only after that commit. If the shared transaction fails,
/// each put is retried in a transaction of its own so that every caller
/// gets its own outcome (one bad row never fails its neighbours).
pub(super) fn commit_group(w: &mut Writer, group: Vec<PendingPut>) -> Answers {
    let hook = w.put_hook();
    let batch = (|| {
        let tx = w
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let outs = group
            .iter()
            .map(|p| put_in_tx(&tx, &mut w.next_vid, hook, &p.key, &p.value))
            .collect::<rusqlite::Result<Vec<_>>>()?;
        tx.commit()?;
        Ok::<_, rusqlite::Error>(outs)
    })();
    match batch {
        Ok(outs) => group
            .into_iter()
            .zip(outs)
            .map(|(p, out)| (p.done, Ok(out)))
            .collect(),
        Err(_) if group.len() > 1 => group
            .into_iter()
            .map(|p| {
                let one = (|| {
                    let tx = w
                        .conn
                        .transaction_with_behavior(TransactionBehavior::Immediate)?;
                    let out = put_in_tx(&tx, &mut w.next_vid, hook, &p.key, &p.value)?;
                    tx.commit()?;
                    Ok(out)
                })();
                (p.done, one)
            })
            .collect(),
        Err(e) => group
            .into_iter()
            .map(|p| (p.done, Err(clone_error(&e))))
            .collect(),
    }
}

/// Each caller's channel and its outcome, sent by [`answer_all`].
pub(super) type Answers = Vec<(
    tokio::sync::oneshot::Sender<rusqlite::Result<PutOutcome>>,
    rusqlite::Result<PutOutcome>,
)>;

/// Answers a group's callers (see `lead_in_background` for when).
pub(super) fn answer_all(answers: Answers) {
    for (done, r) in answers {
        let _ = done.send(r);
    }
}

/// rusqlite errors are not `Clone`; keep the code and the message.
pub(super) fn clone_error(e: &rusqlite::Error) -> rusqlite::Error {
    match e {
        rusqlite::Error::SqliteFailure(code, msg) => {
            rusqlite::Error::SqliteFailure(*code, msg.clone().or_else(|| Some(e.to_string())))
        }
        other => rusqlite::Error::ToSqlConversionFailure(other.to_string().into()),
    }
}

impl Inner {
    /// Drops every queued row (its caller gets the "closed before its
    /// commit" error) and releases the lead.
    pub(super) fn abandon_queue(&self) {
        let mut g = self.group();
        g.pending.clear();
        g.leading = false;
    }

    /// Takes everything queued, noting the group's size for `gather`.
    pub(super) fn take_queue(&self) -> Vec<PendingPut> {
        let mut g = self.group();
        g.last = g.pending.len();
        std::mem::take(&mut g.pending)
    }

    /// Releases the lead if nothing is queued; whether it did.
    pub(super) fn release_lead_if_idle(&self) -> bool {
        let mut g = self.group();
        if g.pending.is_empty() {
            g.leading = false;
        }
        !g.leading
    }

    pub(super) fn group(&self) -> std::sync::MutexGuard<'_, Group> {
        // Every critical section is a push, a take or a flag flip.
        self.group.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl SqliteBackend {
    /// See [`Backend::put`] on this engine: queue the row; if no commit is
    /// being led, lead one (commit everything queued, then hand the lead to
    /// a background task if more queued meanwhile); else wait, without
    /// holding a thread, for the leader's answer.
    pub(super) async fn put_grouped(&self, key: Key, value: Bytes) -> Result<PutOutcome> {
        if self.inner.writer.is_none() {
            return Err(Error::ReadOnly {
                engine: self.inner.display.clone(),
                action: "insert an entry",
            });
        }
        let (done, answer) = tokio::sync::oneshot::channel();
        let lead = {
            let mut g = self.inner.group();
            g.pending.push(PendingPut { key, value, done });
            !std::mem::replace(&mut g.leading, true)
        };
        if lead {
            // Gathering pays off where a commit waits for an fsync; relaxed
            // commits take tens of microseconds and lead inline, as before.
            let concurrent = self.durable() && self.inner.group().last > 1;
            match tokio::runtime::Handle::try_current() {
                // Lead on a task of its own whenever leading would suspend
                // this caller's future (`gather` yields; off a multi-thread
                // runtime the commit is awaited on the blocking pool), so
                // that no commit waits for this future to be polled again.
                Ok(handle)
                    if concurrent
                        || handle.runtime_flavor()
                            != tokio::runtime::RuntimeFlavor::MultiThread =>
                {
                    self.lead_in_background(&handle)
                }
                _ => {
                    // Hands the lead on however this future ends (even
                    // cancelled).
                    let _lead = LeadGuard(self);
                    // Our row is queued and no other leader exists, so this
                    // group holds it.
                    self.commit_queued().await;
                }
            }
        }
        match answer.await {
            Ok(r) => r.map_err(|e| self.inner.fail("insert an entry", e)),
            // The group holding our row was dropped unanswered (the engine
            // was closed first): nothing of ours was written.
            Err(_) => Err(Error::engine(
                &self.inner.display,
                "unable to insert an entry: the engine was closed before its commit",
            )),
        }
    }

    /// Commits one group: everything queued now. A failure to reach the
    /// writer (a closed engine) drops the group, which answers its callers.
    /// Commits everything queued now and answers its callers (the leader's
    /// caller holds the engine meanwhile). A failure to reach the writer (a
    /// closed engine) drops the group, which answers its callers.
    pub(super) async fn commit_queued(&self) {
        self.gather().await;
        let group = self.inner.take_queue();
        if group.is_empty() {
            return;
        }
        let _ = self
            .write("insert an entry", move |w| {
                answer_all(commit_group(w, group));
                Ok(())
            })
            .await;
    }

    /// Before a commit, lets the callers of the last group queue again.
    /// Callers that share a commit are answered together and come back
    /// together; a leader that committed at once would take only the first
    /// of them, leave the rest for the next fsync, and the groups would
    /// alternate small and large (8 rows on average for 16 tasks here,
    /// 14 with this). So while fewer rows are queued than the last group
    /// held and the queue still grows, yield to the tasks queueing. A lone
    /// caller (last group of one) never yields: a yield on an otherwise
    /// idle runtime cost ~20 µs here, the whole of a relaxed put.
    pub(super) async fn gather(&self) {
        if !self.durable() {
            return;
        }
        let mut seen = 0;
        for _ in 0..16 {
            let (queued, last) = {
                let g = self.inner.group();
                (g.pending.len(), g.last)
            };
            if queued >= last || queued == seen {
                return;
            }
            seen = queued;
            tokio::task::yield_now().await;
        }
    }

    /// Ends a lead: if rows queued meanwhile, a background task leads on
    /// (commits until the queue is empty); otherwise the next put leads.
    pub(super) fn hand_off(&self) {
        let mut g = self.inner.group();
        if g.pending.is_empty() {
            g.leading = false;
            return;
        }
        drop(g);
        let handle = tokio::runtime::Handle::try_current();
        let Ok(handle) = handle else {
            // No runtime to lead on: answer the queued callers with an error
            // rather than leave them waiting.
            self.inner.abandon_queue();
            return;
        };
        self.lead_in_background(&handle);
    }

    /// Leads on a task of its own: commits until the queue is empty. If the
    /// task is dropped unfinished (its runtime shut down), the rows still
    /// queued are answered with an error and the lead is released.
    ///
    /// The task holds the engine only while it gathers and commits: a
    /// commit's callers are answered on the writer's thread after the commit,
    /// the lead's release when the queue is empty, and the task's last
    /// strong reference are done, so a caller that drops the last handle as
    /// soon as its put returns can reopen the database at once (the instance
    /// lock goes with the engine).
    pub(super) fn lead_in_background(&self, handle: &tokio::runtime::Handle) {
        let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut lead = BackgroundLead {
            engine: Arc::downgrade(&self.inner),
            finished: false,
            released: released.clone(),
        };
        handle.spawn(async move {
            loop {
                // Callers still queued hold the engine; gone, its queue
                // (and their channels) went with it.
                let Some(inner) = lead.engine.upgrade() else {
                    lead.finish();
                    return;
                };
                let db = SqliteBackend { inner };
                db.gather().await;
                let group = db.inner.take_queue();
                let SqliteBackend { inner } = db;
                let display = inner.display.clone();
                let released = released.clone();
                let done = blocking(&display, move || {
                    // On an error the group was dropped unanswered, which
                    // answers its callers.
                    let answers = if group.is_empty() {
                        Vec::new()
                    } else {
                        inner
                            .write_locked("insert an entry", |w| Ok(commit_group(w, group)))
                            .unwrap_or_default()
                    };
                    let done = inner.release_lead_if_idle();
                    if done {
                        // From here the lead may be another's: a late drop
                        // of this task must not abandon its queue.
                        released.store(true, std::sync::atomic::Ordering::Release);
                    }
                    drop(inner);
                    answer_all(answers);
                    Ok(done)
                })
                .await;
                match done {
                    Ok(false) => continue,
                    Ok(true) => lead.finish(),
                    // A panic: `lead`'s drop answers what is queued.
                    Err(_) => {}
                }
                return;
            }
        });
    }
}
