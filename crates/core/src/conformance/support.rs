//! Helpers shared by the conformance cases.
//!
//! Everything here panics with a readable message on an unexpected reply: the
//! helpers are for tests, where a panic is a failure with context.

use std::time::Duration;

use super::{Fixture, LONG};
use crate::events::{Event, EventRecord, UnitEventHeader};
use crate::ids::{EntryId, LeaseKey, RunId, UnitId, UserId, WorkerId};
use crate::queue::{
    Budgets, Delivery, DeliveryOrigin, FinalizeRequest, Outcome, Progress, ReserveReply, RunSpec, StreamName, UnitSpec,
    UnitState, WorkerRecord,
};
use crate::ttl::Ttl;

/// The run id most cases use.
pub const RUN: &str = "r1";

/// A run id.
pub fn run(name: &str) -> RunId {
    RunId::new(name).expect("valid run id")
}

/// A worker id.
pub fn worker(name: &str) -> WorkerId {
    WorkerId::new(name).expect("valid worker id")
}

/// A unit id.
pub fn unit(name: &str) -> UnitId {
    UnitId::new(name).expect("valid unit id")
}

/// A lease key.
pub fn key(name: &str) -> LeaseKey {
    LeaseKey::new(name).expect("valid lease key")
}

/// A user id.
pub fn user(name: &str) -> UserId {
    UserId::new(name).expect("valid user id")
}

/// A batch size of `n` (> 0).
pub fn batch(n: usize) -> std::num::NonZeroUsize {
    std::num::NonZeroUsize::new(n).expect("a test's batch size is at least 1")
}

/// A TTL of `n` (> 0) milliseconds.
pub fn ttl_ms(n: u64) -> Ttl {
    Ttl::from_millis(n)
}

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Budgets from their three values.
pub fn budgets(max_requeues: u32, requeue_tolerance: f64, max_reclaims: u32) -> Budgets {
    Budgets { max_requeues, requeue_tolerance, max_reclaims, max_failures: None }
}

/// Generous budgets: one requeue per unit, every unit may be requeued, two reclaims.
pub fn lenient() -> Budgets {
    budgets(1, 1.0, 2)
}

/// A run spec named `run` with the given units (kind `file`) and budgets, and
/// an inactivity TTL of an hour.
pub fn spec(run_name: &str, units: &[&str], budgets: Budgets) -> RunSpec {
    spec_ttl(run_name, units, budgets, Duration::from_secs(3600))
}

/// Like [`spec`], with the given inactivity TTL.
pub fn spec_ttl(run_name: &str, units: &[&str], budgets: Budgets, ttl: Duration) -> RunSpec {
    RunSpec { run: run(run_name), units: units.iter().map(|u| UnitSpec::new(unit(u), "file")).collect(), budgets, ttl }
}

/// `n` unit names `u000`, `u001`, ... (sorted and in initial order alike).
pub fn unit_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("u{i:03}")).collect()
}

/// String slices of `names`, for [`spec`] and [`init`].
pub fn as_strs(names: &[String]) -> Vec<&str> {
    names.iter().map(String::as_str).collect()
}

/// Initialises run [`RUN`] with `units` and `budgets`, asserting this call is
/// the leader, and returns its id.
pub async fn init(fx: &Fixture, units: &[&str], budgets: Budgets) -> RunId {
    init_spec(fx, &spec(RUN, units, budgets)).await
}

/// Initialises the run of `spec`, asserting this call is the leader.
pub async fn init_spec(fx: &Fixture, spec: &RunSpec) -> RunId {
    let outcome = fx.queue.initialize(spec).await.expect("initialize");
    assert_eq!(outcome, crate::queue::InitOutcome::Initialized, "initialize of {}", spec.run);
    spec.run.clone()
}

/// Unwraps a `Delivered` reply, failing the test with the reply otherwise.
pub fn delivered(reply: ReserveReply) -> Delivery {
    match reply {
        ReserveReply::Delivered(d) => d,
        other => panic!("expected a delivery, got {other:?}"),
    }
}

/// Reserves for `w` with the [`LONG`] reclaim timeout and expects a delivery.
pub async fn reserve(fx: &Fixture, run: &RunId, w: &str) -> Delivery {
    delivered(fx.queue.reserve(run, &worker(w), LONG).await.expect("reserve"))
}

/// Reserves for `w` with the given reclaim timeout; the raw reply.
pub async fn reserve_with(fx: &Fixture, run: &RunId, w: &str, reclaim_after: impl Into<Duration>) -> ReserveReply {
    let reclaim_after =
        Ttl::new("reclaim timeout", reclaim_after.into()).expect("a test's reclaim timeout is at least 1 ms");
    fx.queue.reserve(run, &worker(w), reclaim_after).await.expect("reserve")
}

/// The delivery the store hands out first for a freshly initialised unit.
pub fn fresh_delivery(u: &str, kind: &str, stream: StreamName, entry_id: EntryId, retry_index: u32) -> Delivery {
    Delivery {
        unit: unit(u),
        kind: kind.to_owned(),
        stream,
        entry_id,
        delivery_count: 1,
        retry_index,
        reclaim_count: 0,
        origin: DeliveryOrigin::Fresh,
    }
}

/// A made-up delivery handle for a unit (for runs that do not exist).
pub fn ghost_delivery(u: &str) -> Delivery {
    fresh_delivery(u, "file", StreamName::Main, EntryId::new(1, 0), 0)
}

/// A passed result with the given duration.
pub fn passed(duration_ms: u64) -> FinalizeRequest {
    FinalizeRequest::new(Outcome::Passed, duration_ms)
}

/// A requeue request with a summary and a small errors payload.
pub fn failure(summary: &str) -> crate::queue::RequeueRequest {
    crate::queue::RequeueRequest {
        duration_ms: 10,
        failure_summary: Some(summary.to_owned()),
        errors: Some(serde_json::json!([{ "message": summary }])),
        retry_elsewhere: false,
        slot: None,
    }
}

/// The header a unit event must carry (ownership generation derived).
pub fn header(u: &str, w: &str, retry_index: u32, reclaim_count: u32, at_ms: u64) -> UnitEventHeader {
    UnitEventHeader {
        unit_id: unit(u),
        worker_id: worker(w),
        retry_index,
        reclaim_count,
        ownership_generation: 1 + retry_index + reclaim_count,
        at_ms,
    }
}

/// Every event record of `run`, in order.
pub async fn event_records(fx: &Fixture, run: &RunId) -> Vec<EventRecord> {
    fx.queue.events(run, None, 100_000).await.expect("events")
}

/// Every event of `run`, in order.
pub async fn all_events(fx: &Fixture, run: &RunId) -> Vec<Event> {
    event_records(fx, run).await.into_iter().map(|r| r.event).collect()
}

/// The events of `run` after the first `skip`.
pub async fn events_since(fx: &Fixture, run: &RunId, skip: usize) -> Vec<Event> {
    all_events(fx, run).await.into_iter().skip(skip).collect()
}

/// The number of events of `run`.
pub async fn event_count(fx: &Fixture, run: &RunId) -> usize {
    event_records(fx, run).await.len()
}

/// The last event of `run`.
pub async fn last_event(fx: &Fixture, run: &RunId) -> Event {
    all_events(fx, run).await.pop().expect("the run has events")
}

/// The events of one type (`delivered`, `finalized`, ...).
pub fn events_of_type(events: &[Event], type_name: &str) -> Vec<Event> {
    events.iter().filter(|e| e.type_name() == type_name).cloned().collect()
}

/// The type names of `events`, in order.
pub fn type_names(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(Event::type_name).collect()
}

/// The run's progress, which must exist.
pub async fn progress(fx: &Fixture, run: &RunId) -> Progress {
    fx.queue.progress(run).await.expect("progress").expect("the run exists")
}

/// Progress from its counters: total, finalized, requeued units, in flight,
/// queued (none failed for good, not stopped).
pub fn counters(total: u64, finalized: u64, requeued_units: u64, in_flight: u64, queued: u64) -> Progress {
    Progress { total, finalized, requeued_units, in_flight, queued, failed: 0, stopped: false }
}

/// [`counters`] with `failed` units failed for good.
pub fn counters_failed(
    total: u64,
    finalized: u64,
    requeued_units: u64,
    in_flight: u64,
    queued: u64,
    failed: u64,
) -> Progress {
    Progress { failed, ..counters(total, finalized, requeued_units, in_flight, queued) }
}

/// A unit's state, which must exist.
pub async fn state_of(fx: &Fixture, run: &RunId, u: &str) -> UnitState {
    fx.queue.unit_state(run, &unit(u)).await.expect("unit_state").expect("the unit exists")
}

/// A unit state from its fields.
pub fn unit_state(retry_index: u32, reclaim_count: u32, entered_retry: bool) -> UnitState {
    UnitState { retry_index, reclaim_count, entered_retry, quarantined: false }
}

/// The record of worker `w`, which must exist.
pub async fn worker_record(fx: &Fixture, run: &RunId, w: &str) -> WorkerRecord {
    let records = fx.queue.workers(run).await.expect("workers");
    records.into_iter().find(|r| r.worker.as_str() == w).unwrap_or_else(|| panic!("no worker record for {w}"))
}

/// One pending delivery without its idle time (which moves with the clock):
/// unit, stream, entry, worker, delivery count.
pub type PendingRow = (UnitId, StreamName, EntryId, WorkerId, u32);

/// The run's pending deliveries, without idle times.
pub async fn pending_rows(fx: &Fixture, run: &RunId) -> Vec<PendingRow> {
    let pending = fx.queue.pending(run).await.expect("pending");
    pending.into_iter().map(|p| (p.unit, p.stream, p.entry_id, p.worker, p.delivery_count)).collect()
}

/// The pending row a delivery should have while `w` holds it.
pub fn row_of(d: &Delivery, w: &str) -> PendingRow {
    (d.unit.clone(), d.stream, d.entry_id, worker(w), d.delivery_count)
}

/// Everything observable about a run that does not move with the clock.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Counters.
    pub progress: Option<Progress>,
    /// The event log.
    pub events: Vec<EventRecord>,
    /// Each unit's state, in initial order.
    pub states: Vec<(UnitId, Option<UnitState>)>,
    /// Pending deliveries.
    pub pending: Vec<PendingRow>,
    /// Worker records.
    pub workers: Vec<WorkerRecord>,
    /// Frozen budgets.
    pub budgets: Option<Budgets>,
    /// Units in initial order.
    pub units: Vec<UnitSpec>,
}

/// Takes a [`Snapshot`] of `run`.
pub async fn snapshot(fx: &Fixture, run: &RunId) -> Snapshot {
    let units = fx.queue.units(run).await.expect("units");
    let mut states = Vec::with_capacity(units.len());
    for u in &units {
        states.push((u.id.clone(), fx.queue.unit_state(run, &u.id).await.expect("unit_state")));
    }
    Snapshot {
        progress: fx.queue.progress(run).await.expect("progress"),
        events: event_records(fx, run).await,
        states,
        pending: pending_rows(fx, run).await,
        workers: fx.queue.workers(run).await.expect("workers"),
        budgets: fx.queue.budgets(run).await.expect("budgets"),
        units,
    }
}

/// Asserts that `run` has no state at all (never made, or expired).
pub async fn assert_run_absent(fx: &Fixture, run: &RunId) {
    assert_eq!(fx.queue.progress(run).await.unwrap(), None, "progress of {run}");
    assert_eq!(fx.queue.budgets(run).await.unwrap(), None, "budgets of {run}");
    assert!(fx.queue.units(run).await.unwrap().is_empty(), "units of {run}");
    assert!(fx.queue.pending(run).await.unwrap().is_empty(), "pending of {run}");
    assert!(fx.queue.workers(run).await.unwrap().is_empty(), "workers of {run}");
}

/// The single finalized event of unit `u`.
pub fn finalized_event_of(events: &[Event], u: &str) -> Event {
    let mut found: Vec<Event> = events_of_type(events, "finalized")
        .into_iter()
        .filter(|e| e.unit_id().map(UnitId::as_str) == Some(u))
        .collect();
    assert_eq!(found.len(), 1, "exactly one finalized event for {u}: {found:?}");
    found.pop().expect("one event")
}

/// Asserts the log's invariants: ids strictly increase, `at_ms` never goes
/// backwards, and every unit event's generation is `1 + retry + reclaim`.
pub fn assert_log_invariants(records: &[EventRecord]) {
    for pair in records.windows(2) {
        assert!(pair[0].id < pair[1].id, "event ids must increase: {:?} then {:?}", pair[0].id, pair[1].id);
        assert!(
            pair[0].event.at_ms() <= pair[1].event.at_ms(),
            "at_ms must not go backwards: {:?} then {:?}",
            pair[0].event,
            pair[1].event
        );
    }
    for record in records {
        if let Some(h) = record.event.header() {
            assert_eq!(h.ownership_generation, 1 + h.retry_index + h.reclaim_count, "{:?}", record.event);
        }
    }
}

/// Finalizes `d` for `w` as passed and asserts `OK`.
pub async fn finalize_ok(fx: &Fixture, run: &RunId, w: &str, d: &Delivery) {
    let reply = fx.queue.finalize(run, &worker(w), d, &passed(1)).await.expect("finalize");
    assert_eq!(reply, crate::queue::Ack::Ok, "finalize of {} by {w}", d.unit);
}

/// Requeues `d` for `w` with [`failure`]`(summary)`; the raw reply.
pub async fn requeue_as(fx: &Fixture, run: &RunId, w: &str, d: &Delivery, summary: &str) -> crate::queue::RequeueReply {
    fx.queue.requeue(run, &worker(w), d, &failure(summary)).await.expect("requeue")
}

/// Asserts that heartbeat, finalize, requeue and abandon of `d` by `w` all
/// reply `STALE` and that none of them changed anything observable.
pub async fn assert_all_stale(fx: &Fixture, run: &RunId, w: &str, d: &Delivery) {
    use crate::queue::{Ack, RequeueReply};
    let before = snapshot(fx, run).await;
    let wk = worker(w);
    assert_eq!(fx.queue.heartbeat(run, &wk, d).await.expect("heartbeat"), Ack::Stale, "heartbeat by {w}: {d:?}");
    assert_eq!(
        fx.queue.finalize(run, &wk, d, &passed(5)).await.expect("finalize"),
        Ack::Stale,
        "finalize by {w}: {d:?}"
    );
    assert_eq!(
        fx.queue.requeue(run, &wk, d, &failure("late")).await.expect("requeue"),
        RequeueReply::Stale,
        "requeue by {w}: {d:?}"
    );
    assert_eq!(fx.queue.abandon(run, &wk, d, 5).await.expect("abandon"), Ack::Stale, "abandon by {w}: {d:?}");
    assert_eq!(fx.queue.release(run, &wk, d).await.expect("release"), Ack::Stale, "release by {w}: {d:?}");
    let batch = fx.queue.release_batch(run, &wk, &[d.clone(), d.clone()]).await.expect("release_batch");
    assert_eq!(batch, vec![Ack::Stale; 2], "release_batch by {w}: {d:?}");
    let batch = fx.queue.heartbeat_batch(run, &wk, &[d.clone(), d.clone()]).await.expect("heartbeat_batch");
    assert_eq!(batch, vec![Ack::Stale; 2], "heartbeat_batch by {w}: {d:?}");
    assert_eq!(snapshot(fx, run).await, before, "a STALE reply changed the run");
}

/// Asserts that every transition on `run` (which must not exist) replies
/// `CORRUPT` and that none of them made any state.
pub async fn assert_all_corrupt(fx: &Fixture, run: &RunId, w: &str, d: &Delivery) {
    use crate::queue::{Ack, LivenessReply, RequeueReply};
    let wk = worker(w);
    assert_eq!(fx.queue.reserve(run, &wk, LONG).await.expect("reserve"), ReserveReply::Corrupt, "reserve");
    assert_eq!(fx.queue.reserve(run, &wk, ttl_ms(100)).await.expect("reserve"), ReserveReply::Corrupt, "reserve");
    let batch = fx.queue.reserve_batch(run, &wk, batch(3), LONG).await.expect("reserve_batch");
    assert_eq!(
        batch,
        crate::queue::ReserveBatch { deliveries: vec![], exhausted: vec![], corrupt: true, stopped: false }
    );
    assert_eq!(fx.queue.heartbeat(run, &wk, d).await.expect("heartbeat"), Ack::Corrupt, "heartbeat");
    assert_eq!(fx.queue.finalize(run, &wk, d, &passed(5)).await.expect("finalize"), Ack::Corrupt, "finalize");
    assert_eq!(fx.queue.requeue(run, &wk, d, &failure("x")).await.expect("requeue"), RequeueReply::Corrupt, "requeue");
    assert_eq!(fx.queue.abandon(run, &wk, d, 5).await.expect("abandon"), Ack::Corrupt, "abandon");
    assert_eq!(fx.queue.release(run, &wk, d).await.expect("release"), Ack::Corrupt, "release");
    let batch = fx.queue.release_batch(run, &wk, std::slice::from_ref(d)).await.expect("release_batch");
    assert_eq!(batch, vec![Ack::Corrupt], "release_batch");
    let batch = fx.queue.heartbeat_batch(run, &wk, std::slice::from_ref(d)).await.expect("heartbeat_batch");
    assert_eq!(batch, vec![Ack::Corrupt], "heartbeat_batch");
    assert_eq!(fx.queue.liveness(run, &wk, Some(&d.unit)).await.expect("liveness"), LivenessReply::Corrupt);
    assert_eq!(fx.queue.liveness(run, &wk, None).await.expect("liveness"), LivenessReply::Corrupt);
    assert_run_absent(fx, run).await;
    assert!(event_records(fx, run).await.is_empty(), "a CORRUPT reply appended an event");
    assert_eq!(fx.queue.unit_state(run, &d.unit).await.expect("unit_state"), None);
}
