//! Conformance cases for groups ([`UnitSpec::group`](crate::UnitSpec)): at
//! most a group's limit of its units are handed out at once, across every
//! worker, and the other units are not held up.

use std::num::NonZeroU32;

use super::*;
use crate::queue::{UnitGroup, UnitSpec};

fn group(name: &str, limit: u32) -> UnitGroup {
    UnitGroup { name: name.into(), limit: NonZeroU32::new(limit).expect("a limit of at least 1") }
}

/// A run whose units named `g*` are in group `pg` with `limit`; the others in none.
async fn init_grouped(fx: &Fixture, units: &[&str], limit: u32) -> crate::ids::RunId {
    let mut s = spec(RUN, units, budgets(2, 1.0, 2));
    for u in &mut s.units {
        if u.id.as_str().starts_with('g') {
            u.group = Some(group("pg", limit));
        }
    }
    init_spec(fx, &s).await
}

/// With the group full, the next worker gets the next unit outside it; once
/// the group's unit is finalized, its next unit is handed out first.
pub async fn a_full_group_holds_its_units_back_and_the_others_run(fx: Fixture) {
    let r = init_grouped(&fx, &["g1", "g2", "x", "y"], 1).await;
    let g1 = reserve(&fx, &r, "w1").await;
    assert_eq!(g1.unit.as_str(), "g1");
    assert_eq!(reserve(&fx, &r, "w2").await.unit.as_str(), "x", "g2 waits: the group is full");
    assert_eq!(reserve(&fx, &r, "w3").await.unit.as_str(), "y");
    assert_eq!(reserve_with(&fx, &r, "w3", LONG).await, ReserveReply::None);
    assert_eq!(progress(&fx, &r).await.queued, 1, "g2 is still queued");
    finalize_ok(&fx, &r, "w1", &g1).await;
    let g2 = reserve(&fx, &r, "w3").await;
    assert_eq!((g2.unit.as_str(), g2.stream, g2.retry_index), ("g2", StreamName::Priority, 0));
    assert_eq!(state_of(&fx, &r, "g2").await, unit_state(0, 0, false), "holding back spends nothing");
}

/// The limit counts every worker's deliveries, and a release gives the
/// group's place back.
pub async fn a_group_limit_counts_across_workers_and_a_release_frees_a_place(fx: Fixture) {
    let r = init_grouped(&fx, &["g1", "g2", "g3"], 2).await;
    let g1 = reserve(&fx, &r, "w1").await;
    let g2 = reserve(&fx, &r, "w2").await;
    assert_eq!((g1.unit.as_str(), g2.unit.as_str()), ("g1", "g2"));
    assert_eq!(reserve_with(&fx, &r, "w3", LONG).await, ReserveReply::None, "two of the group run: g3 waits");
    assert_eq!(fx.queue.release(&r, &worker("w1"), &g1).await.unwrap(), Ack::Ok);
    let again = reserve(&fx, &r, "w3").await;
    assert_eq!(again.unit.as_str(), "g1", "the released unit comes back first, in the place it freed");
    assert_eq!(reserve_with(&fx, &r, "w1", LONG).await, ReserveReply::None, "g3 still waits");
    assert_eq!(progress(&fx, &r).await.queued, 1);
    finalize_ok(&fx, &r, "w2", &g2).await;
    assert_eq!(reserve(&fx, &r, "w1").await.unit.as_str(), "g3", "a finalize frees a place for the waiting unit");
}

/// Many units waiting for one place cost each reserve nothing: the units
/// outside the group are handed out at once, and each place freed lets the
/// oldest waiting unit in.
pub async fn units_waiting_for_their_group_do_not_slow_a_reserve(fx: Fixture) {
    let mut names: Vec<String> = (0..200).map(|i| format!("g{i:03}")).collect();
    names.push("x".into());
    let r = init_grouped(&fx, &as_strs(&names), 1).await;
    let first = reserve(&fx, &r, "w1").await;
    assert_eq!(first.unit.as_str(), "g000");
    assert_eq!(reserve(&fx, &r, "w2").await.unit.as_str(), "x");
    let events = event_count(&fx, &r).await;
    for _ in 0..20 {
        assert_eq!(reserve_with(&fx, &r, "w2", LONG).await, ReserveReply::None);
    }
    assert_eq!(event_count(&fx, &r).await, events);
    assert_eq!(progress(&fx, &r).await.queued, 199);
    let (mut held, mut by) = (first, "w1");
    for i in 1..4 {
        finalize_ok(&fx, &r, by, &held).await;
        (held, by) = (reserve(&fx, &r, "w2").await, "w2");
        assert_eq!(held.unit.as_str(), format!("g{i:03}"), "oldest first");
    }
}

/// A requeue frees the group's place, and the retry stays in the group: it
/// comes first (priority stream) and holds the place in turn.
pub async fn a_retry_stays_in_its_group(fx: Fixture) {
    let r = init_grouped(&fx, &["g1", "g2"], 1).await;
    let g1 = reserve(&fx, &r, "w1").await;
    assert!(matches!(requeue_as(&fx, &r, "w1", &g1, "boom").await, RequeueReply::Requeued { .. }));
    let retry = reserve(&fx, &r, "w1").await;
    assert_eq!((retry.unit.as_str(), retry.retry_index), ("g1", 1));
    assert_eq!(reserve_with(&fx, &r, "w2", LONG).await, ReserveReply::None, "g2 waits for the retry of g1");
    finalize_ok(&fx, &r, "w1", &retry).await;
    assert_eq!(reserve(&fx, &r, "w2").await.unit.as_str(), "g2");
}

/// A dead worker's group unit keeps its place until it is reclaimed, and
/// then counts for its new owner: the group never runs over its limit.
pub async fn a_dead_workers_group_unit_counts_until_and_after_its_reclaim(fx: Fixture) {
    let r = init_grouped(&fx, &["g1", "g2"], 1).await;
    let g1 = reserve(&fx, &r, "w1").await;
    fx.time.advance(ms(300)).await;
    let reclaimed = delivered(reserve_with(&fx, &r, "w2", ms(100)).await);
    assert_eq!(reclaimed.unit.as_str(), "g1", "g2 waits; the dead worker's g1 is reclaimed");
    assert!(matches!(reclaimed.origin, DeliveryOrigin::Reclaimed { .. }));
    assert_eq!(reserve_with(&fx, &r, "w3", LONG).await, ReserveReply::None, "g1 runs on w2: g2 still waits");
    assert_all_stale(&fx, &r, "w1", &g1).await;
    finalize_ok(&fx, &r, "w2", &reclaimed).await;
    assert_eq!(reserve(&fx, &r, "w3").await.unit.as_str(), "g2");
}

/// A group unit that ends because a budget ran out (its retries on a
/// requeue, its reclaims on a reserve) gives its place back like any other
/// end, and the places are counted right after every kind of end: the group
/// then holds exactly its limit again.
pub async fn a_unit_ended_by_its_budgets_gives_its_group_place_back(fx: Fixture) {
    let mut s = spec(RUN, &["g1", "g2", "g3", "g4", "g5", "g6"], budgets(0, 1.0, 0));
    for u in &mut s.units {
        u.group = Some(group("pg", 2));
    }
    let r = init_spec(&fx, &s).await;
    let g1 = reserve(&fx, &r, "w1").await;
    let _g2 = reserve(&fx, &r, "w2").await;
    assert_eq!(reserve_with(&fx, &r, "w3", LONG).await, ReserveReply::None, "two run: the group is full");
    // No retries: the requeue finalizes g1, and its place goes to g3.
    assert!(matches!(requeue_as(&fx, &r, "w1", &g1, "boom").await, RequeueReply::Finalized { .. }));
    assert_eq!(delivered(reserve_with(&fx, &r, "w3", LONG).await).unit.as_str(), "g3");
    // w2 and w3 die holding g2 and g3; no reclaims: the reserves that meet
    // them finalize them, and each place freed lets the next unit in.
    fx.time.advance(ms(300)).await;
    let (mut ended, mut running) = (Vec::new(), Vec::new());
    loop {
        match reserve_with(&fx, &r, "w4", ms(100)).await {
            ReserveReply::ReclaimExhausted { unit } => ended.push(unit.as_str().to_owned()),
            ReserveReply::Delivered(d) => running.push(d),
            ReserveReply::None => break,
            other => panic!("{other:?} after {ended:?}"),
        }
    }
    ended.sort();
    let mut units: Vec<&str> = running.iter().map(|d| d.unit.as_str()).collect();
    units.sort();
    assert_eq!((ended.as_slice(), units.as_slice()), (&["g2".to_owned(), "g3".to_owned()][..], &["g4", "g5"][..]));
    // Exactly the limit again: g6 waits until one of them ends.
    assert_eq!(reserve_with(&fx, &r, "w5", LONG).await, ReserveReply::None, "g4 and g5 run: g6 waits");
    finalize_ok(&fx, &r, "w4", &running[0]).await;
    assert_eq!(reserve(&fx, &r, "w5").await.unit.as_str(), "g6");
}

/// A batch passes over the units of a full group (moved behind, each read
/// once by the call) and fills up with the units after them.
pub async fn a_batch_passes_over_a_full_group_once(fx: Fixture) {
    let r = init_grouped(&fx, &["g1", "g2", "g3", "x", "y"], 1).await;
    let first = fx.queue.reserve_batch(&r, &worker("w1"), batch(3), LONG).await.unwrap();
    let units: Vec<&str> = first.deliveries.iter().map(|d| d.unit.as_str()).collect();
    assert_eq!(units, ["g1", "x", "y"], "g2 and g3 wait behind");
    let next = fx.queue.reserve_batch(&r, &worker("w2"), batch(3), LONG).await.unwrap();
    assert!(next.deliveries.is_empty(), "{next:?}");
    assert_eq!(progress(&fx, &r).await, counters(5, 0, 0, 3, 2));
    finalize_ok(&fx, &r, "w1", &first.deliveries[0]).await;
    let last = fx.queue.reserve_batch(&r, &worker("w2"), batch(3), LONG).await.unwrap();
    let units: Vec<&str> = last.deliveries.iter().map(|d| d.unit.as_str()).collect();
    assert_eq!(units.len(), 1, "one place in the group: {units:?}");
    assert!(units[0] == "g2" || units[0] == "g3", "{units:?}");
}

/// `units` gives each unit's group back.
pub async fn units_keep_their_groups(fx: Fixture) {
    let r = init_grouped(&fx, &["g1", "x"], 3).await;
    let units = fx.queue.units(&r).await.unwrap();
    assert_eq!(units[0].group, Some(group("pg", 3)));
    assert_eq!(units[1].group, None);
}

/// The groups are part of the unit list: another worker's list with other
/// groups or limits is a mismatch; one group with two limits, or a bad group
/// name, is refused.
pub async fn groups_are_part_of_the_unit_list(fx: Fixture) {
    init_grouped(&fx, &["g1", "x"], 1).await;
    let mut other = spec(RUN, &["g1", "x"], budgets(2, 1.0, 2));
    other.units[0].group = Some(group("pg", 2));
    assert!(matches!(fx.queue.initialize(&other).await, Err(QueueError::UnitListMismatch { .. })));
    other.units[0].group = None;
    assert!(matches!(fx.queue.initialize(&other).await, Err(QueueError::UnitListMismatch { .. })));

    let mut two_limits = spec("r2", &["a", "b"], lenient());
    two_limits.units[0].group = Some(group("pg", 1));
    two_limits.units[1].group = Some(group("pg", 2));
    let error = fx.queue.initialize(&two_limits).await.unwrap_err();
    assert!(matches!(error, QueueError::Spec(SpecError::GroupLimitMismatch { .. })), "{error:?}");
    let mut bad_name = spec("r2", &["a"], lenient());
    bad_name.units = vec![UnitSpec::new(unit("a"), "test").in_group(group("", 1))];
    let error = fx.queue.initialize(&bad_name).await.unwrap_err();
    assert!(matches!(error, QueueError::Spec(SpecError::BadGroupName { .. })), "{error:?}");
    assert_run_absent(&fx, &run("r2")).await;
}
