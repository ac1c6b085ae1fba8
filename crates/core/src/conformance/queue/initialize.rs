//! `initialize`: leader election, frozen budgets, unit-list checks.

use super::*;

/// The first `initialize` creates the run; a second with the same units (in
/// another order, with other budgets) is told it already exists and gets the
/// frozen budgets; the run keeps the first caller's order.
pub async fn initialize_first_caller_wins(fx: Fixture) {
    let first = spec(RUN, &["a", "b"], Budgets::default());
    assert_eq!(fx.queue.initialize(&first).await.unwrap(), InitOutcome::Initialized);
    let second = spec(RUN, &["b", "a"], budgets(9, 0.9, 9));
    assert_eq!(
        fx.queue.initialize(&second).await.unwrap(),
        InitOutcome::AlreadyInitialized { budgets: Budgets::default() }
    );
    assert_eq!(
        fx.queue.initialize(&first).await.unwrap(),
        InitOutcome::AlreadyInitialized { budgets: Budgets::default() }
    );
    assert_eq!(fx.queue.budgets(&first.run).await.unwrap(), Some(Budgets::default()));
    assert_eq!(fx.queue.units(&first.run).await.unwrap(), first.units);
    assert_eq!(progress(&fx, &first.run).await, counters(2, 0, 0, 0, 2));
    assert_eq!(event_count(&fx, &first.run).await, 0, "initialize appends no event");
    let d = reserve(&fx, &first.run, "w1").await;
    assert_eq!(d.unit, unit("a"));
}

/// Budgets frozen by the first caller are the ones enforced, whatever later
/// callers pass.
pub async fn initialize_frozen_budgets_are_enforced(fx: Fixture) {
    let frozen = budgets(0, 1.0, 2);
    let r = init(&fx, &["a", "b"], frozen).await;
    let later = spec(RUN, &["a", "b"], budgets(5, 1.0, 5));
    assert_eq!(fx.queue.initialize(&later).await.unwrap(), InitOutcome::AlreadyInitialized { budgets: frozen });
    let d = reserve(&fx, &r, "w1").await;
    assert_eq!(requeue_as(&fx, &r, "w1", &d, "boom").await, RequeueReply::Finalized { retry_index: 0 });
    assert_eq!(fx.queue.budgets(&r).await.unwrap(), Some(frozen));
}

/// Re-initialising a run with another unit list (more, fewer, other ids, other
/// kinds) is `UnitListMismatch` and changes nothing.
pub async fn initialize_unit_list_mismatch_changes_nothing(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    let before = snapshot(&fx, &r).await;
    let mut other_kind = spec(RUN, &["a", "b"], lenient());
    other_kind.units[1].kind = "test".into();
    let others: Vec<(RunSpec, u64)> = vec![
        (spec(RUN, &["a", "b", "c"], budgets(3, 0.5, 3)), 3),
        (spec(RUN, &["a"], lenient()), 1),
        (spec(RUN, &["a", "x"], lenient()), 2),
        (other_kind, 2),
    ];
    for (other, given_units) in others {
        match fx.queue.initialize(&other).await {
            Err(QueueError::UnitListMismatch { run: got_run, existing, given }) => {
                assert_eq!(got_run, r);
                assert_eq!(existing, 2);
                assert_eq!(given, given_units);
            }
            reply => panic!("expected UnitListMismatch for {:?}, got {reply:?}", other.units),
        }
    }
    assert_eq!(snapshot(&fx, &r).await, before);
    finalize_ok(&fx, &r, "w1", &d).await;
}

/// Invalid specs are `QueueError::Spec` and write nothing: afterwards the run
/// does not exist and a valid spec still initialises it.
pub async fn initialize_rejects_invalid_specs(fx: Fixture) {
    type Check = fn(&SpecError) -> bool;
    let good = spec(RUN, &["a", "b"], lenient());
    let mut empty = good.clone();
    empty.units.clear();
    let mut zero_ttl = good.clone();
    zero_ttl.ttl = Duration::ZERO;
    let mut sub_ms_ttl = good.clone();
    sub_ms_ttl.ttl = Duration::from_micros(500);
    let mut long_kind = good.clone();
    long_kind.units[0].kind = "k".repeat(MAX_KIND_LEN + 1);
    let checks: Vec<(RunSpec, Check)> = vec![
        (empty, |e| matches!(e, SpecError::NoUnits { .. })),
        (
            spec(RUN, &["a", "b", "a"], lenient()),
            |e| matches!(e, SpecError::DuplicateUnit { unit, .. } if unit.as_str() == "a"),
        ),
        (spec(RUN, &["a"], budgets(1, f64::NAN, 1)), |e| matches!(e, SpecError::BadTolerance { .. })),
        (spec(RUN, &["a"], budgets(1, -0.1, 1)), |e| matches!(e, SpecError::BadTolerance { .. })),
        (spec(RUN, &["a"], budgets(1, 1.5, 1)), |e| matches!(e, SpecError::BadTolerance { .. })),
        (spec(RUN, &["a"], budgets(1, f64::INFINITY, 1)), |e| matches!(e, SpecError::BadTolerance { .. })),
        (zero_ttl, |e| matches!(e, SpecError::ZeroTtl { .. })),
        (sub_ms_ttl, |e| matches!(e, SpecError::ZeroTtl { .. })),
        (long_kind, |e| matches!(e, SpecError::KindTooLong { .. })),
    ];
    for (bad, expected) in checks {
        match fx.queue.initialize(&bad).await {
            Err(QueueError::Spec(e)) => assert!(expected(&e), "wrong spec error {e:?} for {bad:?}"),
            reply => panic!("expected a spec error for {bad:?}, got {reply:?}"),
        }
        assert_run_absent(&fx, &good.run).await;
        assert_eq!(event_count(&fx, &good.run).await, 0);
    }
    assert_eq!(fx.queue.initialize(&good).await.unwrap(), InitOutcome::Initialized);
    assert_eq!(progress(&fx, &good.run).await, counters(2, 0, 0, 0, 2));
}

/// An invalid spec for a run that exists is still a spec error, and the run
/// is left as it was.
pub async fn initialize_invalid_spec_on_existing_run_changes_nothing(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    reserve(&fx, &r, "w1").await;
    let before = snapshot(&fx, &r).await;
    let nan = spec(RUN, &["a", "b"], budgets(1, f64::NAN, 2));
    assert!(matches!(fx.queue.initialize(&nan).await, Err(QueueError::Spec(SpecError::BadTolerance { .. }))));
    let dup = spec(RUN, &["a", "b", "b"], lenient());
    assert!(matches!(fx.queue.initialize(&dup).await, Err(QueueError::Spec(SpecError::DuplicateUnit { .. }))));
    assert_eq!(snapshot(&fx, &r).await, before);
}

/// Eight concurrent initialisations of one run elect exactly one leader, and
/// every other caller gets the leader's budgets.
pub async fn initialize_concurrent_callers_elect_one_leader(fx: Fixture) {
    let names = unit_names(20);
    let base = spec(RUN, &as_strs(&names), lenient());
    let mut tasks = Vec::new();
    for i in 0..8u32 {
        let queue = fx.queue.clone();
        let mut s = base.clone();
        s.budgets.max_requeues = i;
        tasks.push(tokio::spawn(async move { (i, queue.initialize(&s).await.unwrap()) }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    let leaders: Vec<u32> = outcomes.iter().filter(|(_, o)| *o == InitOutcome::Initialized).map(|(i, _)| *i).collect();
    assert_eq!(leaders.len(), 1, "exactly one leader: {outcomes:?}");
    let frozen = Budgets { max_requeues: leaders[0], ..lenient() };
    for (i, outcome) in &outcomes {
        if *i != leaders[0] {
            assert_eq!(*outcome, InitOutcome::AlreadyInitialized { budgets: frozen });
        }
    }
    assert_eq!(fx.queue.budgets(&base.run).await.unwrap(), Some(frozen));
    assert_eq!(progress(&fx, &base.run).await, counters(20, 0, 0, 0, 20));
    assert_eq!(fx.queue.units(&base.run).await.unwrap(), base.units);
}
