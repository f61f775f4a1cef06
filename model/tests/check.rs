//! The models of `src/lib.rs` checked exhaustively (breadth first): with
//! every guard the invariants hold and the collecting paths are reachable;
//! with each guard removed the checker finds the loss it prevents. One
//! thread, breadth first: each counterexample printed is a shortest one.

use alkblobs_model::{Collector, Fleet, Guards, SharedTier};
use stateright::{Checker, Model, Path};

/// A guard's name, how to remove it, and the property that then fails.
type Case = (&'static str, fn(&mut Guards), &'static str);

/// Removes each case's guard and checks that `check` then finds a
/// counterexample to its property; prints it.
fn each_needed<M, C>(cases: &[Case], check: fn(Guards) -> C)
where
    M: Model,
    M::State: Clone + PartialEq + std::fmt::Debug + std::hash::Hash,
    M::Action: Clone + PartialEq + std::fmt::Debug,
    C: Checker<M>,
{
    for &(guard, remove, property) in cases {
        let mut g = Guards::ALL;
        remove(&mut g);
        let c = check(g);
        let path = c.discovery(property).unwrap_or_else(|| {
            panic!("without {guard}, the checker found no counterexample to {property:?}")
        });
        let steps = up_to_violation(c.model(), path, property);
        eprintln!("without {guard}: {steps:?}");
    }
}

/// The actions of `path` up to the first state where `property` fails:
/// the counterexample, without what the checker explored after it.
fn up_to_violation<M: Model>(
    model: &M,
    path: Path<M::State, M::Action>,
    property: &str,
) -> Vec<M::Action> {
    let holds = model
        .properties()
        .into_iter()
        .find(|p| p.name == property)
        .expect("a property of the model")
        .condition;
    let mut actions = Vec::new();
    for (state, action) in path.into_vec() {
        if !holds(model, &state) {
            return actions;
        }
        actions.extend(action);
    }
    panic!("the counterexample to {property:?} never breaks it");
}

fn fleet(guards: Guards) -> impl Checker<Fleet> {
    fleet_with(guards, Collector::Mark)
}

fn fleet_queue(guards: Guards) -> impl Checker<Fleet> {
    fleet_with(guards, Collector::Queue)
}

fn fleet_with(guards: Guards, collector: Collector) -> impl Checker<Fleet> {
    Fleet { guards, collector }
        .checker()
        .threads(1)
        .spawn_bfs()
        .join()
}

fn shared(guards: Guards) -> impl Checker<SharedTier> {
    SharedTier { guards }
        .checker()
        .threads(1)
        .spawn_bfs()
        .join()
}

#[test]
fn the_fleet_protocol_keeps_every_protected_entry() {
    for collector in [Collector::Mark, Collector::Queue] {
        let (name, c) = (format!("{collector:?}"), fleet_with(Guards::ALL, collector));
        c.assert_properties();
        eprintln!(
            "fleet, {name} collector: {} states, every one checked",
            c.unique_state_count()
        );
        assert!(
            c.unique_state_count() > 50,
            "a model this small checks nothing"
        );
    }
}

#[test]
fn the_shared_tier_protocol_keeps_every_held_object() {
    let c = shared(Guards::ALL);
    c.assert_properties();
    eprintln!(
        "shared tier: {} states, every one checked",
        c.unique_state_count()
    );
    assert!(
        c.unique_state_count() > 50,
        "a model this small checks nothing"
    );
}

/// Each guard of the fleet's entries, removed: the property it keeps fails.
#[test]
fn each_fleet_guard_is_needed() {
    let cases: [Case; 4] = [
        (
            "pin before publish",
            |g| g.pin_before_publish = false,
            "a writer holding a live pin finds its entry",
        ),
        (
            "re-check at execution",
            |g| g.recheck_at_execution = false,
            "no protected entry is deleted",
        ),
        (
            "pin checks presence",
            |g| g.pin_checks_presence = false,
            "a writer holding a live pin finds its entry",
        ),
        (
            "liveness guard",
            |g| g.liveness_guard = false,
            "no liveness row names an absent key",
        ),
    ];
    each_needed(&cases, fleet);
    // And under the queue collector: the same guards keep the same
    // properties.
    each_needed(&cases, fleet_queue);
}

/// Each enqueue of the review queue, removed: an unprotected entry is left
/// that no queue row, staged row or expired pin accounts for (no sweep
/// would ever collect it; the audit, left out of the model, would).
#[test]
fn each_enqueue_is_needed() {
    let cases: [Case; 3] = [
        (
            "released and reaped pins queue their key",
            |g| g.released_pins_queue = false,
            "every unprotected entry is queued, staged or awaiting its reaping",
        ),
        (
            "deleted liveness rows queue their key",
            |g| g.deleted_rows_queue = false,
            "every unprotected entry is queued, staged or awaiting its reaping",
        ),
        (
            "appended deletions are routed to the queue",
            |g| g.deletions_routed = false,
            "every unprotected entry is queued, staged or awaiting its reaping",
        ),
    ];
    each_needed(&cases, fleet_queue);
}

/// Each guard of a shared tier, removed: the property it keeps fails.
#[test]
fn each_shared_tier_guard_is_needed() {
    let cases: [Case; 3] = [
        (
            "generation fences (the stalled claimer)",
            |g| g.generation_fences = false,
            "a writer holding a live pin finds its object",
        ),
        (
            "tombstones honoured by writers (the dedup race)",
            |g| g.tombstones_honoured = false,
            "a writer holding a live pin finds its object",
        ),
        (
            "the claim's re-check",
            |g| g.recheck_at_execution = false,
            "a writer holding a live pin finds its object",
        ),
    ];
    each_needed(&cases, shared);
}
