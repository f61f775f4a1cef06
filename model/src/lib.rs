//! Models of the fleet GC protocol, for the [`stateright`] model checker.
//!
//! Each action is one SQL function call of the extension (or one step a
//! client takes between two calls), atomic as the call's transaction is:
//! row locks serialise the calls that touch one key, so the interleavings
//! that matter are those *between* calls, which the checker enumerates
//! exhaustively. Every guard of the protocol is a flag of [`Guards`]; the
//! checks in `tests/check.rs` run the models with every guard on (no
//! counterexample; the collecting path is reachable) and with each guard
//! off (the checker finds the loss it prevents).
//!
//! - [`Fleet`]: entries in the database (the kv and `pg-lo` tiers): puts
//!   with their pin rows, pins of present keys, expiry and reaping,
//!   liveness rows with the guard trigger, the mark (the `mark` collector)
//!   or the review queue and its review (the `queue` collector), the
//!   window and the re-arbitrated execution.
//! - [`SharedTier`]: a shared large tier (`local` or `s3`): `pin_new`,
//!   the upload, `local_published`, the two-phase claim with its
//!   tombstones, a claimer whose connection dies after it locked its
//!   tombstones (and that may still send its delete), and the generation
//!   fences that make that late delete harmless on s3.
//!
//! What the models leave out is in `docs/design.md`, "The protocol model".

use stateright::{Model, Property};

/// A pin row of one writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pin {
    /// No row.
    None,
    /// An unexpired row: it protects the key.
    Live,
    /// Past its TTL (the holder stalled, or renewal failed): it protects
    /// nothing, until the sweep reaps it.
    Expired,
}

/// The protocol's guards; [`Guards::ALL`] is the protocol as built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Guards {
    /// `alkblobs_put` commits the pin row with the entry (a shared tier's
    /// `alkblobs_pin_new` before the upload). Off: the entry is visible
    /// first and the pin row written by a later call.
    pub pin_before_publish: bool,
    /// `alkblobs_sweep`'s execution (and `alkblobs_claim_local`) re-checks
    /// pins and liveness rows under `FOR UPDATE` before deleting. Off: it
    /// deletes what the mark staged.
    pub recheck_at_execution: bool,
    /// `alkblobs_pin` pins only a present key (it locks the entry `FOR
    /// SHARE`; a missing key is NotFound). Off: it pins whatever is asked.
    pub pin_checks_presence: bool,
    /// The liveness guard trigger: a row may name only a present key
    /// (AB002 otherwise), locked `FOR KEY SHARE` against an execution.
    pub liveness_guard: bool,
    /// `alkblobs_pin_new` refuses a tombstoned key (55006) and
    /// `alkblobs_local_published` never publishes one.
    pub tombstones_honoured: bool,
    /// A claim that hands a tombstone out again fences the key one past
    /// the tombstone's generation, and a key recorded afresh takes the
    /// fence's generation (`alkblobs.file_fences`, 0.8.0).
    pub generation_fences: bool,
    /// A pin row deleted — released (`alkblobs_unpin`) or reaped when
    /// expired — queues its key for review (the trigger `queue_released`).
    pub released_pins_queue: bool,
    /// A liveness row deleted appends its key to `alkblobs.released` (the
    /// guard's DELETE branch).
    pub deleted_rows_queue: bool,
    /// A sweep call routes appended deletions into the review queue
    /// (`alkblobs.route_released`) instead of dropping them.
    pub deletions_routed: bool,
}

impl Guards {
    /// Every guard on: the protocol as built.
    pub const ALL: Guards = Guards {
        pin_before_publish: true,
        recheck_at_execution: true,
        pin_checks_presence: true,
        liveness_guard: true,
        tombstones_honoured: true,
        generation_fences: true,
        released_pins_queue: true,
        deleted_rows_queue: true,
        deletions_routed: true,
    };
}

/// How a [`Fleet`] pool's sweeps find dead content (`pools.collector`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collector {
    /// Every sweep marks the pool (`AlkblobsSweepMark`).
    Mark,
    /// Events queue the key and a sweep reviews the queue
    /// (`AlkblobsSweepReview`); the audit, which is the mark, is left out
    /// here so that collection must come through the queue.
    Queue,
}

/// A writer of the [`Fleet`] model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Writer {
    /// Holds nothing.
    Idle,
    /// Without pin-before-publish only: its entry is visible, its pin row
    /// not yet written.
    Published,
    /// Its put or pin returned: it holds a guard on the key.
    Holding,
}

/// The key's staged row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Staged {
    /// Not staged.
    None,
    /// Staged by a mark; its window is running.
    Sealed,
    /// Its window has passed: the next execution decides it.
    Due,
}

/// One key of a fleet pool whose entries are in the database, two writers
/// and the sweeper.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FleetState {
    /// The key's entry is visible.
    pub entry: bool,
    /// Each writer's pin row.
    pub pins: [Pin; 2],
    /// Each writer.
    pub writers: [Writer; 2],
    /// A row of a registered liveness table names the key.
    pub live_row: bool,
    /// The key's staged row.
    pub staged: Staged,
    /// The key's row in `alkblobs.review_queue` (the `queue` collector).
    pub queued: bool,
    /// The key's row in `alkblobs.released`: a liveness row deleted, not
    /// yet routed to the queue.
    pub released: bool,
    /// An execution deleted the entry while a live pin or a liveness row
    /// protected it.
    pub lost: bool,
    /// An execution deleted the entry (unprotected).
    pub collected: bool,
}

/// An action of the [`Fleet`] model, named after the call it stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FleetAction {
    /// `alkblobs_put` by writer `w` (the entry and its pin row; without
    /// pin-before-publish, the entry only).
    AlkblobsPut(usize),
    /// Without pin-before-publish: writer `w`'s pin row, after its entry.
    PinRowAfterPublish(usize),
    /// `alkblobs_pin` of the present key by writer `w`.
    AlkblobsPin(usize),
    /// `alkblobs_unpin` by writer `w`.
    AlkblobsUnpin(usize),
    /// Writer `w`'s pin passes its TTL unrenewed (`alkblobs_renew` not
    /// called in time: a stall).
    PinExpires(usize),
    /// The sweep reaps expired pin rows.
    ReapExpired,
    /// Writer `w` inserts a liveness row naming the key.
    LivenessInsert(usize),
    /// The liveness row is deleted.
    LivenessDelete,
    /// `alkblobs_sweep`'s mark stages the key if nothing protects it.
    AlkblobsSweepMark,
    /// `alkblobs_sweep`'s routing of the key's `alkblobs.released` row into
    /// the review queue (`alkblobs.route_released`; in the same call as the
    /// review, before it: here a step of its own, which allows more
    /// interleavings, not fewer).
    AlkblobsRouteReleased,
    /// `alkblobs_sweep`'s review of the key's queue row (`alkblobs.review`):
    /// stages the key if the pool holds it and nothing protects it, and
    /// deletes the row either way.
    AlkblobsSweepReview,
    /// The staged row's window passes.
    WindowElapses,
    /// `alkblobs_sweep`'s execution of the due row.
    AlkblobsSweepExecute,
}

/// The [`Fleet`] model with some guards and one collector.
#[derive(Clone, Debug)]
pub struct Fleet {
    /// Which guards hold.
    pub guards: Guards,
    /// Mark or queue.
    pub collector: Collector,
}

impl FleetState {
    fn protected(&self) -> bool {
        self.live_row || self.pins.contains(&Pin::Live)
    }

    /// An unprotected entry some sweep will find: queued, released (to be
    /// routed), staged, or held by an expired pin row whose reaping will
    /// queue it.
    fn accounted(&self) -> bool {
        !self.entry
            || self.protected()
            || self.queued
            || self.released
            || self.staged != Staged::None
            || self.pins.contains(&Pin::Expired)
    }
}

impl Model for Fleet {
    type State = FleetState;
    type Action = FleetAction;

    fn init_states(&self) -> Vec<FleetState> {
        vec![FleetState {
            entry: false,
            pins: [Pin::None; 2],
            writers: [Writer::Idle; 2],
            live_row: false,
            staged: Staged::None,
            queued: false,
            released: false,
            lost: false,
            collected: false,
        }]
    }

    fn actions(&self, s: &FleetState, actions: &mut Vec<FleetAction>) {
        use FleetAction::*;
        for w in 0..2 {
            match s.writers[w] {
                Writer::Idle => {
                    actions.push(AlkblobsPut(w));
                    actions.push(AlkblobsPin(w));
                }
                Writer::Published => actions.push(PinRowAfterPublish(w)),
                Writer::Holding => {
                    actions.push(AlkblobsUnpin(w));
                    if !s.live_row {
                        actions.push(LivenessInsert(w));
                    }
                }
            }
            if s.pins[w] == Pin::Live {
                actions.push(PinExpires(w));
            }
        }
        if s.pins.contains(&Pin::Expired) {
            actions.push(ReapExpired);
        }
        if s.live_row {
            actions.push(LivenessDelete);
        }
        match (s.staged, self.collector) {
            (Staged::None, Collector::Mark) => actions.push(AlkblobsSweepMark),
            (Staged::None, Collector::Queue) => {}
            (Staged::Sealed, _) => actions.push(WindowElapses),
            (Staged::Due, _) => actions.push(AlkblobsSweepExecute),
        }
        if self.collector == Collector::Queue && s.queued {
            actions.push(AlkblobsSweepReview);
        }
        if s.released {
            actions.push(AlkblobsRouteReleased);
        }
    }

    fn next_state(&self, s: &FleetState, a: FleetAction) -> Option<FleetState> {
        use FleetAction::*;
        let g = self.guards;
        let mut n = s.clone();
        match a {
            AlkblobsPut(w) => {
                // (No queue row: the put's pin protects the key, and its
                // release or reaping queues it.)
                n.entry = true;
                // A put restarts the key's window.
                n.staged = Staged::None;
                if g.pin_before_publish {
                    n.pins[w] = Pin::Live;
                    n.writers[w] = Writer::Holding;
                } else {
                    n.writers[w] = Writer::Published;
                }
            }
            PinRowAfterPublish(w) => {
                n.pins[w] = Pin::Live;
                n.writers[w] = Writer::Holding;
            }
            AlkblobsPin(w) => {
                if g.pin_checks_presence && !s.entry {
                    return None; // NotFound: nothing changes
                }
                n.pins[w] = Pin::Live;
                n.writers[w] = Writer::Holding;
                n.staged = Staged::None;
            }
            AlkblobsUnpin(w) => {
                n.pins[w] = Pin::None;
                n.writers[w] = Writer::Idle;
                n.queued |= self.queues(g.released_pins_queue);
            }
            PinExpires(w) => n.pins[w] = Pin::Expired,
            ReapExpired => {
                for p in &mut n.pins {
                    if *p == Pin::Expired {
                        *p = Pin::None;
                    }
                }
                n.queued |= self.queues(g.released_pins_queue);
            }
            LivenessInsert(_) => {
                if g.liveness_guard && !s.entry {
                    return None; // AB002
                }
                n.live_row = true;
            }
            LivenessDelete => {
                n.live_row = false;
                n.released |= self.queues(g.deleted_rows_queue);
            }
            AlkblobsRouteReleased => {
                n.released = false;
                n.queued |= g.deletions_routed;
            }
            AlkblobsSweepReview => {
                n.queued = false;
                if s.entry && !s.protected() && s.staged == Staged::None {
                    n.staged = Staged::Sealed;
                }
            }
            AlkblobsSweepMark => {
                if !s.entry || s.protected() {
                    return None;
                }
                n.staged = Staged::Sealed;
            }
            WindowElapses => n.staged = Staged::Due,
            AlkblobsSweepExecute => {
                n.staged = Staged::None;
                if !(g.recheck_at_execution && s.protected()) && s.entry {
                    n.lost |= s.protected();
                    n.collected |= !s.protected();
                    n.entry = false;
                }
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no protected entry is deleted", |_, s: &FleetState| !s.lost),
            Property::always(
                "a writer holding a live pin finds its entry",
                |_, s: &FleetState| {
                    (0..2).all(|w| {
                        !(s.writers[w] == Writer::Holding && s.pins[w] == Pin::Live) || s.entry
                    })
                },
            ),
            Property::always(
                "no liveness row names an absent key",
                |_, s: &FleetState| !s.live_row || s.entry,
            ),
            Property::sometimes("unprotected content is collected", |_, s: &FleetState| {
                s.collected
            }),
            // The queue's completeness (vacuous under the mark): with no
            // audit, a key no event queued would never be collected.
            Property::always(
                "every unprotected entry is queued, staged or awaiting its reaping",
                |m: &Fleet, s: &FleetState| m.collector == Collector::Mark || s.accounted(),
            ),
        ]
    }
}

impl Fleet {
    /// Whether an event whose enqueue is `guard` queues its key.
    fn queues(&self, guard: bool) -> bool {
        self.collector == Collector::Queue && guard
    }
}

/// The highest object generation the [`SharedTier`] model explores.
pub const MAX_GENERATION: u8 = 2;

/// The key's row in `alkblobs.files`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Record {
    /// The object generation it names.
    pub generation: u8,
    /// `published`: liveness rows may name it.
    pub published: bool,
    /// `deleting_since` is set: a claim committed its deletion.
    pub tombstone: bool,
    /// The claimer whose phase 2 holds the row `FOR UPDATE`.
    pub locked_by: Option<u8>,
}

/// The writer of the [`SharedTier`] model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SharedWriter {
    /// Holds nothing.
    Idle,
    /// `alkblobs_pin_new` committed: pin row and record, generation `g`.
    Recorded(u8),
    /// Its object of generation `g` is uploaded.
    Uploaded(u8),
    /// `alkblobs_local_published` marked it: the put returned, and the
    /// writer holds generation `g`.
    Holding(u8),
}

/// A claimer (a sweeping instance) of the [`SharedTier`] model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Claimer {
    /// Not claiming.
    Idle,
    /// Phase 1 (`alkblobs_claim_local`) handed it the tombstone of
    /// generation `g`.
    Handed(u8),
    /// Phase 2 (`alkblobs_local_deleting_generations`) locked the
    /// tombstone of generation `g`; `sent` once its delete went out.
    Locked {
        /// The tombstone's generation.
        generation: u8,
        /// Its `DeleteObject` went out.
        sent: bool,
    },
    /// Its connection died while it held the lock and before its delete
    /// went out: stopped (SIGSTOP, a long pause), it may still send that
    /// delete for generation `g` whenever it resumes.
    Stalled(u8),
}

/// One key of a pool with a shared large tier: one writer, two claimers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SharedState {
    /// The key's record, if any.
    pub record: Option<Record>,
    /// The key's fence: the generation a new record gets.
    pub fence: u8,
    /// The objects in the bucket, one bit per generation.
    pub objects: u8,
    /// The writer's pin row.
    pub pin: Pin,
    /// The writer.
    pub writer: SharedWriter,
    /// The claimers.
    pub claimers: [Claimer; 2],
    /// A claim deleted an object (unprotected).
    pub collected: bool,
}

/// An action of the [`SharedTier`] model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SharedAction {
    /// `alkblobs_pin_new` by the writer.
    AlkblobsPinNew,
    /// The writer's upload (a HEAD, then the object if it is missing).
    Upload,
    /// `alkblobs_local_published` by the writer.
    AlkblobsLocalPublished,
    /// `alkblobs_unpin` by the writer.
    AlkblobsUnpin,
    /// The writer's pin passes its TTL.
    PinExpires,
    /// `alkblobs_claim_local` by claimer `c` (phase 1).
    AlkblobsClaimLocal(u8),
    /// `alkblobs_local_deleting_generations` by claimer `c` (phase 2's lock).
    AlkblobsLocalDeletingGenerations(u8),
    /// Claimer `c`'s `DeleteObject` (up to its generation).
    DeleteObject(u8),
    /// `alkblobs_local_deleted` by claimer `c`, and its commit.
    AlkblobsLocalDeleted(u8),
    /// Claimer `c`'s connection dies (its transaction rolls back).
    ConnectionDies(u8),
}

/// The [`SharedTier`] model with some guards.
#[derive(Clone, Debug)]
pub struct SharedTier {
    /// Which guards hold.
    pub guards: Guards,
}

fn bit(g: u8) -> u8 {
    1 << g
}

impl Model for SharedTier {
    type State = SharedState;
    type Action = SharedAction;

    fn init_states(&self) -> Vec<SharedState> {
        vec![SharedState {
            record: None,
            fence: 0,
            objects: 0,
            pin: Pin::None,
            writer: SharedWriter::Idle,
            claimers: [Claimer::Idle; 2],
            collected: false,
        }]
    }

    fn actions(&self, s: &SharedState, actions: &mut Vec<SharedAction>) {
        use SharedAction::*;
        match s.writer {
            SharedWriter::Idle => actions.push(AlkblobsPinNew),
            SharedWriter::Recorded(_) => actions.push(Upload),
            SharedWriter::Uploaded(_) => actions.push(AlkblobsLocalPublished),
            SharedWriter::Holding(_) => actions.push(AlkblobsUnpin),
        }
        if s.pin == Pin::Live {
            actions.push(PinExpires);
        }
        // The sweep lease: one claimer claims at a time (a stalled one's
        // lease went with its connection).
        let busy = s
            .claimers
            .iter()
            .any(|c| matches!(c, Claimer::Handed(_) | Claimer::Locked { .. }));
        for c in 0..2u8 {
            match s.claimers[c as usize] {
                Claimer::Idle if !busy => actions.push(AlkblobsClaimLocal(c)),
                Claimer::Idle => {}
                Claimer::Handed(_) => {
                    actions.push(AlkblobsLocalDeletingGenerations(c));
                    actions.push(ConnectionDies(c));
                }
                Claimer::Locked { sent: false, .. } => {
                    actions.push(DeleteObject(c));
                    actions.push(ConnectionDies(c));
                }
                Claimer::Locked { sent: true, .. } => {
                    actions.push(AlkblobsLocalDeleted(c));
                    actions.push(ConnectionDies(c));
                }
                Claimer::Stalled(_) => actions.push(DeleteObject(c)),
            }
        }
    }

    fn next_state(&self, s: &SharedState, a: SharedAction) -> Option<SharedState> {
        use SharedAction::*;
        let g = self.guards;
        let mut n = s.clone();
        match a {
            AlkblobsPinNew => {
                let generation = match s.record {
                    Some(r) if r.tombstone && g.tombstones_honoured => return None, // 55006
                    Some(r) if r.locked_by.is_some() => return None, // waits for the claim
                    Some(r) => r.generation,
                    None if g.generation_fences => s.fence,
                    None => 0,
                };
                if s.record.is_none() {
                    n.record = Some(Record {
                        generation,
                        published: false,
                        tombstone: false,
                        locked_by: None,
                    });
                }
                n.pin = Pin::Live;
                n.writer = SharedWriter::Recorded(generation);
            }
            Upload => {
                let SharedWriter::Recorded(generation) = s.writer else {
                    return None;
                };
                n.objects |= bit(generation);
                n.writer = SharedWriter::Uploaded(generation);
            }
            AlkblobsLocalPublished => {
                let SharedWriter::Uploaded(generation) = s.writer else {
                    return None;
                };
                match s.record {
                    Some(r) if r.locked_by.is_some() => return None, // waits
                    Some(r) if s.pin == Pin::Live && (!r.tombstone || !g.tombstones_honoured) => {
                        n.record = Some(Record {
                            published: true,
                            ..r
                        });
                        n.writer = SharedWriter::Holding(generation);
                    }
                    // Collected meanwhile, or the pin lapsed: put again.
                    _ => {
                        n.writer = SharedWriter::Idle;
                        n.pin = Pin::None;
                    }
                }
            }
            AlkblobsUnpin => {
                n.writer = SharedWriter::Idle;
                n.pin = Pin::None;
            }
            PinExpires => n.pin = Pin::Expired,
            AlkblobsClaimLocal(c) => {
                let c = c as usize;
                match s.record {
                    // A tombstone its claimer left: handed out again.
                    Some(r) if r.tombstone => {
                        if r.locked_by.is_some() {
                            return None; // SKIP LOCKED
                        }
                        if g.generation_fences {
                            n.fence = s.fence.max(r.generation + 1);
                        }
                        n.claimers[c] = Claimer::Handed(r.generation);
                    }
                    Some(r) => {
                        if r.locked_by.is_some() || (g.recheck_at_execution && s.pin == Pin::Live) {
                            return None;
                        }
                        n.record = Some(Record {
                            tombstone: true,
                            published: false,
                            ..r
                        });
                        n.claimers[c] = Claimer::Handed(r.generation);
                    }
                    // Objects nobody recorded (a writer's upload after its
                    // record was collected): a tombstone of the fence's
                    // generation covers every one of them.
                    None if s.objects != 0 => {
                        let generation = if g.generation_fences { s.fence } else { 0 };
                        n.record = Some(Record {
                            generation,
                            published: false,
                            tombstone: true,
                            locked_by: None,
                        });
                        n.claimers[c] = Claimer::Handed(generation);
                    }
                    None => return None,
                }
            }
            AlkblobsLocalDeletingGenerations(c) => {
                match s.record {
                    Some(r) if r.tombstone && r.locked_by.is_none() => {
                        n.record = Some(Record {
                            locked_by: Some(c),
                            ..r
                        });
                        n.claimers[c as usize] = Claimer::Locked {
                            generation: r.generation,
                            sent: false,
                        };
                    }
                    Some(r) if r.tombstone => return None, // waits for the other
                    // Gone, or recorded afresh: nothing to delete.
                    _ => n.claimers[c as usize] = Claimer::Idle,
                }
            }
            DeleteObject(c) => {
                let generation = match s.claimers[c as usize] {
                    Claimer::Locked { generation, .. } | Claimer::Stalled(generation) => generation,
                    _ => return None,
                };
                // Every generation up to the tombstone's, never a later one.
                let upto = (bit(generation) << 1) - 1;
                if s.objects & upto != 0 {
                    n.collected = true;
                }
                n.objects &= !upto;
                n.claimers[c as usize] = match s.claimers[c as usize] {
                    Claimer::Locked { generation, .. } => Claimer::Locked {
                        generation,
                        sent: true,
                    },
                    _ => Claimer::Idle,
                };
            }
            AlkblobsLocalDeleted(c) => {
                n.record = None;
                n.claimers[c as usize] = Claimer::Idle;
            }
            ConnectionDies(c) => {
                if let Some(r) = s.record
                    && r.locked_by == Some(c)
                {
                    n.record = Some(Record {
                        locked_by: None,
                        ..r
                    });
                }
                n.claimers[c as usize] = match s.claimers[c as usize] {
                    Claimer::Locked {
                        generation,
                        sent: false,
                    } => Claimer::Stalled(generation),
                    _ => Claimer::Idle,
                };
            }
        }
        Some(n)
    }

    fn within_boundary(&self, s: &SharedState) -> bool {
        s.fence <= MAX_GENERATION
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "a writer holding a live pin finds its object",
                |_, s: &SharedState| match s.writer {
                    SharedWriter::Holding(g) if s.pin == Pin::Live => s.objects & bit(g) != 0,
                    _ => true,
                },
            ),
            Property::always(
                "a published record names an object that exists",
                |_, s: &SharedState| match s.record {
                    Some(r) if r.published && !r.tombstone => s.objects & bit(r.generation) != 0,
                    _ => true,
                },
            ),
            Property::sometimes("a dead object is collected", |_, s: &SharedState| {
                s.collected
            }),
            Property::sometimes(
                "a stalled claimer's tombstone is handed out again and the key re-put",
                |_, s: &SharedState| {
                    s.claimers.iter().any(|c| matches!(c, Claimer::Stalled(_)))
                        && matches!(s.writer, SharedWriter::Holding(_))
                },
            ),
        ]
    }
}
