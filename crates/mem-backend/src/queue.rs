//! [`UnitQueue`] in memory: the seed's `transition.lua`, transition by
//! transition, on plain data structures.
//!
//! A run mirrors the seed's keys: two streams with one consumer group each
//! (entries, a read cursor and a pending-entries list), meta, per-unit state,
//! worker records and the attempts log. Replies, event fields and the order of
//! checks (meta, then fence, then unit state) follow the script exactly.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::events::UnitEventHeader;
use leasehold_core::queue::{DeliveryOrigin, ORPHAN_EVENTS_TTL, RETRY_ALONE_AFTER};
use leasehold_core::{
    Ack, Budgets, Delivery, EntryId, Event, EventId, EventRecord, FinalizeReason, FinalizeRequest, InitOutcome,
    LivenessReply, Outcome, PendingDelivery, Progress, QueueError, RequeueReply, RequeueRequest, ReserveBatch,
    ReserveLimit, ReserveReply, RunId, RunLog, RunSpec, StreamName, Ttl, UnitId, UnitQueue, UnitSpec, UnitState,
    WorkerId, WorkerRecord,
};

use crate::MemoryStore;

/// Every run of the store.
#[derive(Debug, Default)]
pub(crate) struct Runs {
    runs: HashMap<RunId, Run>,
    /// When expired runs were last dropped (store's clock, ms).
    swept_at_ms: u64,
}

/// How often `initialize` drops every run past its inactivity TTL. An
/// expired run is invisible anyway (see [`Runs::live`]); this only returns
/// the memory of runs nobody touches again (a long-lived process making
/// many short runs, such as sync-worker's webhook batches).
const SWEEP_EVERY_MS: u64 = 60_000;

impl Runs {
    /// Drops every expired run, at most once per [`SWEEP_EVERY_MS`].
    fn sweep(&mut self, now: u64) {
        if now.saturating_sub(self.swept_at_ms) < SWEEP_EVERY_MS {
            return;
        }
        self.swept_at_ms = now;
        self.runs.retain(|_, r| now <= r.expires_at_ms);
    }

    /// The run, dropping it first when its inactivity TTL has passed.
    fn live(&mut self, run: &RunId, now: u64) -> Option<&mut Run> {
        if self.runs.get(run).is_some_and(|r| now > r.expires_at_ms) {
            self.runs.remove(run);
        }
        self.runs.get_mut(run)
    }

    /// The run with its meta, if both exist.
    fn with_meta(&mut self, run: &RunId, now: u64) -> Option<&mut Run> {
        self.live(run, now).filter(|r| r.meta.is_some())
    }
}

#[derive(Debug)]
struct Meta {
    total: u64,
    finalized: u64,
    /// Units finalized as failed (the fail-fast count).
    failed: u64,
    requeued_units: u64,
    budgets: Budgets,
    ttl_ms: u64,
    fingerprint: String,
}

impl Meta {
    /// Whether the run has reached its failure limit.
    fn stopped(&self) -> bool {
        self.budgets.max_failures.is_some_and(|max| self.failed >= u64::from(max))
    }
}

#[derive(Debug, Clone)]
struct Pending {
    consumer: WorkerId,
    delivery_count: u32,
    last_delivery_ms: u64,
    unit: u32,
}

/// The mark of a retry that should go to another worker: who failed it, and
/// since when (store's clock, ms).
#[derive(Debug, Clone)]
struct Elsewhere {
    avoid: WorkerId,
    since_ms: u64,
}

/// A stream entry: its id, its unit, and a retry-elsewhere mark.
#[derive(Debug, Clone)]
struct Entry {
    id: EntryId,
    unit: u32,
    elsewhere: Option<Elsewhere>,
}

/// A stream with one consumer group: entries, the group's read cursor, its PEL.
#[derive(Debug, Default)]
struct Stream {
    entries: Vec<Entry>,
    next_unread: usize,
    pending: BTreeMap<EntryId, Pending>,
    last_id: EntryId,
}

impl Stream {
    fn append(&mut self, unit: u32, now: u64) -> EntryId {
        self.append_marked(unit, None, now)
    }

    fn append_marked(&mut self, unit: u32, elsewhere: Option<Elsewhere>, now: u64) -> EntryId {
        let id = next_id(&mut self.last_id, now);
        self.entries.push(Entry { id, unit, elsewhere });
        id
    }

    fn unread(&self) -> usize {
        self.entries.len() - self.next_unread
    }

    /// `XREADGROUP ... COUNT n >`: up to `n` unread entries, taken off the
    /// cursor but not yet pending (see [`Stream::deliver`]).
    fn read_unread(&mut self, n: usize) -> Vec<Entry> {
        let end = (self.next_unread + n).min(self.entries.len());
        let read = self.entries[self.next_unread..end].to_vec();
        self.next_unread = end;
        read
    }

    /// The entry becomes pending on `consumer` (its first delivery).
    fn deliver(&mut self, entry: &Entry, consumer: &WorkerId, now: u64) {
        let pending =
            Pending { consumer: consumer.clone(), delivery_count: 1, last_delivery_ms: now, unit: entry.unit };
        self.pending.insert(entry.id, pending);
    }

    /// The fence: the pending entry when owned by `worker` at `delivery_count`.
    fn fence(&self, entry: EntryId, worker: &WorkerId, delivery_count: u32) -> Option<&Pending> {
        self.pending.get(&entry).filter(|p| &p.consumer == worker && p.delivery_count == delivery_count)
    }

    /// Oldest pending entry idle for at least `min_idle_ms`.
    fn idle_candidate(&self, min_idle_ms: u64, now: u64) -> Option<EntryId> {
        self.pending.iter().find(|(_, p)| now.saturating_sub(p.last_delivery_ms) >= min_idle_ms).map(|(id, _)| *id)
    }
}

/// `XADD *`: a new id after `last`, from the current time.
fn next_id(last: &mut EntryId, now: u64) -> EntryId {
    *last = if now > last.ms { EntryId::new(now, 0) } else { EntryId::new(last.ms, last.seq + 1) };
    *last
}

#[derive(Debug)]
struct Run {
    meta: Option<Meta>,
    units: Vec<UnitSpec>,
    states: Vec<UnitState>,
    main: Stream,
    priority: Stream,
    attempts: Vec<EventRecord>,
    attempts_last_id: EntryId,
    workers: BTreeMap<WorkerId, WorkerRecord>,
    /// Entries waiting for a place in their full group, per group, oldest first.
    parked: BTreeMap<String, std::collections::VecDeque<Entry>>,
    expires_at_ms: u64,
}

/// How a transition changes a worker record's current unit.
enum Current<'a> {
    Keep,
    Set(&'a UnitId),
    Clear,
}

impl Run {
    fn empty(now: u64, ttl_ms: u64) -> Self {
        Self {
            meta: None,
            units: Vec::new(),
            states: Vec::new(),
            main: Stream::default(),
            priority: Stream::default(),
            attempts: Vec::new(),
            attempts_last_id: EntryId::default(),
            workers: BTreeMap::new(),
            parked: BTreeMap::new(),
            expires_at_ms: now.saturating_add(ttl_ms),
        }
    }

    fn meta(&self) -> &Meta {
        self.meta.as_ref().expect("callers check meta first")
    }

    fn meta_mut(&mut self) -> &mut Meta {
        self.meta.as_mut().expect("callers check meta first")
    }

    fn stream(&mut self, name: StreamName) -> &mut Stream {
        match name {
            StreamName::Main => &mut self.main,
            StreamName::Priority => &mut self.priority,
        }
    }

    /// `renew_ttls`: every transition that applied pushes the expiry out.
    fn renew(&mut self, now: u64) {
        let ttl = self.meta.as_ref().map_or(ORPHAN_EVENTS_TTL.as_millis() as u64, |m| m.ttl_ms);
        self.expires_at_ms = now.saturating_add(ttl);
    }

    fn append(&mut self, event: Event, now: u64) {
        let id = next_id(&mut self.attempts_last_id, now);
        self.attempts.push(EventRecord { id, event });
    }

    fn header(&self, unit: u32, worker: &WorkerId, now: u64) -> UnitEventHeader {
        let state = self.states[unit as usize];
        UnitEventHeader {
            unit_id: self.units[unit as usize].id.clone(),
            worker_id: worker.clone(),
            retry_index: state.retry_index,
            reclaim_count: state.reclaim_count,
            ownership_generation: 1 + state.retry_index + state.reclaim_count,
            at_ms: now,
        }
    }

    fn touch_worker(&mut self, worker: &WorkerId, current: Current<'_>, processed_delta: u64, now: u64) {
        let record = self.workers.entry(worker.clone()).or_insert_with(|| WorkerRecord {
            worker: worker.clone(),
            last_seen_ms: 0,
            current_unit: None,
            processed: 0,
            left: false,
        });
        record.last_seen_ms = now;
        record.left = false;
        match current {
            Current::Keep => {}
            Current::Set(unit) => record.current_unit = Some(unit.clone()),
            Current::Clear => record.current_unit = None,
        }
        record.processed += processed_delta;
    }

    /// The unit index of a delivery, checked against the stored entry: the
    /// caller's unit id must match, or the delivery is not the caller's.
    fn fenced_unit(&mut self, worker: &WorkerId, delivery: &Delivery) -> Option<u32> {
        let pending = self.stream(delivery.stream).fence(delivery.entry_id, worker, delivery.delivery_count)?;
        let unit = pending.unit;
        (self.units[unit as usize].id == delivery.unit).then_some(unit)
    }

    fn delivery(&self, stream: StreamName, entry: EntryId, unit: u32, count: u32, origin: DeliveryOrigin) -> Delivery {
        let state = self.states[unit as usize];
        let spec = &self.units[unit as usize];
        Delivery {
            unit: spec.id.clone(),
            kind: spec.kind.clone(),
            stream,
            entry_id: entry,
            delivery_count: count,
            retry_index: state.retry_index,
            reclaim_count: state.reclaim_count,
            origin,
        }
    }

    /// XACK, `finalized` event, finalized_count += 1.
    #[allow(clippy::too_many_arguments)]
    fn finalize_entry(
        &mut self,
        stream: StreamName,
        entry: EntryId,
        unit: u32,
        worker: &WorkerId,
        outcome: Outcome,
        duration_ms: u64,
        reason: Option<FinalizeReason>,
        errors: Option<serde_json::Value>,
        extra: FinalizeExtra,
        now: u64,
    ) {
        self.stream(stream).pending.remove(&entry);
        self.unpark(unit, now);
        let header = self.header(unit, worker, now);
        self.append(
            Event::Finalized {
                header,
                outcome,
                duration_ms,
                reason: reason.filter(|r| !r.as_str().is_empty()),
                errors,
                stream,
                entry_id: entry,
                previous_worker_id: extra.previous_worker_id,
                delivery_count: extra.delivery_count,
                failure_summary: extra.failure_summary,
                slot: extra.slot,
            },
            now,
        );
        let counted = outcome == Outcome::Failed && !self.states[unit as usize].quarantined;
        let meta = self.meta_mut();
        meta.finalized += 1;
        if counted {
            meta.failed += 1;
        }
    }

    /// Whether `worker` may not take `entry` now: it failed the unit, and
    /// another worker is live (or, with none, the mark is younger than the
    /// lone worker's wait).
    fn held_back(&self, entry: &Entry, worker: &WorkerId, window_ms: u64, now: u64) -> bool {
        let Some(mark) = &entry.elsewhere else { return false };
        let age = now.saturating_sub(mark.since_ms);
        let alone_ms = window_ms.min(millis(RETRY_ALONE_AFTER));
        &mark.avoid == worker
            && (age < alone_ms || self.workers.values().any(|w| &w.worker != worker && w.is_live(now, window_ms)))
    }

    /// A place of `unit`'s group was freed: the group's oldest parked entry
    /// goes back to the priority stream.
    fn unpark(&mut self, unit: u32, now: u64) {
        let Some(group) = self.units[unit as usize].group.as_ref() else { return };
        if let Some(entry) = self.parked.get_mut(&group.name).and_then(|waiting| waiting.pop_front()) {
            self.priority.append_marked(entry.unit, entry.elsewhere, now);
        }
    }

    /// The unit's group when it already has its limit of units pending.
    fn full_group(&self, unit: u32) -> Option<&str> {
        let group = self.units[unit as usize].group.as_ref()?;
        let in_group = |p: &&Pending| self.units[p.unit as usize].group.as_ref().is_some_and(|g| g.name == group.name);
        let running = self.main.pending.values().chain(self.priority.pending.values()).filter(in_group).count();
        (running >= group.limit.get() as usize).then_some(group.name.as_str())
    }

    /// Fresh deliveries for `worker`, at most `max`: the priority stream,
    /// then the main stream, each read until the call has its units or the
    /// stream has no unread entry. An entry held back for another worker, or
    /// of a full group, goes to the end of the priority stream; once one has,
    /// the priority stream is read one entry at a time, and meeting an entry
    /// this call moved back ends its reading (moving it back once more), as
    /// the Redis script does.
    fn deliver_fresh(&mut self, worker: &WorkerId, max: usize, window_ms: u64, now: u64) -> Vec<Delivery> {
        let mut delivered = Vec::new();
        let mut moved_back = std::collections::HashSet::new();
        for name in [StreamName::Priority, StreamName::Main] {
            let mut wrapped = false;
            while delivered.len() < max && !wrapped {
                let count =
                    if name == StreamName::Priority && !moved_back.is_empty() { 1 } else { max - delivered.len() };
                let entries = self.stream(name).read_unread(count);
                if entries.is_empty() {
                    break;
                }
                for entry in entries {
                    let again = name == StreamName::Priority && moved_back.contains(&entry.id);
                    if let Some(group) = self.full_group(entry.unit).filter(|_| !again).map(str::to_owned) {
                        // Its group is full: it waits for a place.
                        self.parked.entry(group).or_default().push_back(entry);
                        continue;
                    }
                    if again || self.held_back(&entry, worker, window_ms, now) {
                        moved_back.insert(self.priority.append_marked(entry.unit, entry.elsewhere, now));
                        wrapped |= again;
                        continue;
                    }
                    self.stream(name).deliver(&entry, worker, now);
                    // delivery_accounting
                    let header = self.header(entry.unit, worker, now);
                    self.append(Event::Delivered { header, stream: name, entry_id: entry.id, delivery_count: 1 }, now);
                    let unit_id = self.units[entry.unit as usize].id.clone();
                    self.touch_worker(worker, Current::Set(&unit_id), 0, now);
                    self.renew(now);
                    delivered.push(self.delivery(name, entry.id, entry.unit, 1, DeliveryOrigin::Fresh));
                }
            }
        }
        delivered
    }

    fn reclaim(&mut self, worker: &WorkerId, min_idle_ms: u64, now: u64) -> ReserveReply {
        let max_reclaims = self.meta().budgets.max_reclaims;
        for name in [StreamName::Priority, StreamName::Main] {
            let Some(entry) = self.stream(name).idle_candidate(min_idle_ms, now) else { continue };
            // XCLAIM: new owner, delivery count + 1, idle reset.
            let Some(pending) = self.stream(name).pending.get_mut(&entry) else { continue };
            let previous = std::mem::replace(&mut pending.consumer, worker.clone());
            pending.delivery_count += 1;
            pending.last_delivery_ms = now;
            let (unit, count) = (pending.unit, pending.delivery_count);
            let unit_id = self.units[unit as usize].id.clone();

            if self.states[unit as usize].reclaim_count + 1 > max_reclaims {
                let extra = FinalizeExtra {
                    previous_worker_id: Some(previous),
                    delivery_count: Some(count),
                    ..FinalizeExtra::default()
                };
                self.finalize_entry(
                    name,
                    entry,
                    unit,
                    worker,
                    Outcome::Failed,
                    0,
                    Some(FinalizeReason::ReclaimBudgetExhausted),
                    None,
                    extra,
                    now,
                );
                self.touch_worker(worker, Current::Keep, 0, now);
                self.renew(now);
                return ReserveReply::ReclaimExhausted { unit: unit_id };
            }

            self.states[unit as usize].reclaim_count += 1;
            let header = self.header(unit, worker, now);
            self.append(
                Event::Reclaimed {
                    header,
                    previous_worker_id: Some(previous.clone()),
                    stream: name,
                    entry_id: entry,
                    delivery_count: count,
                },
                now,
            );
            self.touch_worker(worker, Current::Set(&unit_id), 0, now);
            self.renew(now);
            let origin = DeliveryOrigin::Reclaimed { previous_worker: Some(previous) };
            return ReserveReply::Delivered(self.delivery(name, entry, unit, count, origin));
        }
        ReserveReply::None
    }

    /// One reserve call up to `limit`: fresh entries first (each stream read
    /// once), then reclaims. With [`ReserveLimit::FirstItem`] a unit
    /// finalized over its reclaim budget ends the call (the seed's single
    /// `reserve`, and the Redis script's `single` flag).
    fn reserve_up_to(&mut self, worker: &WorkerId, limit: ReserveLimit, min_idle_ms: u64, now: u64) -> ReserveBatch {
        let mut batch = ReserveBatch::default();
        if self.meta().stopped() {
            batch.stopped = true;
            return batch;
        }
        let max = limit.max_deliveries().get();
        batch.deliveries = self.deliver_fresh(worker, max, min_idle_ms, now);
        while batch.deliveries.len() < max {
            match self.reclaim(worker, min_idle_ms, now) {
                ReserveReply::Delivered(d) => batch.deliveries.push(d),
                ReserveReply::ReclaimExhausted { unit } => {
                    batch.exhausted.push(unit);
                    if self.meta().stopped() {
                        batch.stopped = true;
                        break;
                    }
                    if limit.ends_at_exhausted() {
                        break;
                    }
                }
                ReserveReply::Stopped => {
                    batch.stopped = true;
                    break;
                }
                ReserveReply::None | ReserveReply::Corrupt => break,
            }
        }
        batch
    }

    /// Records a delivery's final outcome (one item of a finalize batch).
    fn finalize(&mut self, worker: &WorkerId, delivery: &Delivery, request: &FinalizeRequest, now: u64) -> Ack {
        let Some(unit) = self.fenced_unit(worker, delivery) else { return Ack::Stale };
        let extra = FinalizeExtra { slot: request.slot, ..FinalizeExtra::default() };
        self.finalize_entry(
            delivery.stream,
            delivery.entry_id,
            unit,
            worker,
            request.outcome,
            request.duration_ms,
            request.reason.clone(),
            request.errors.clone(),
            extra,
            now,
        );
        self.touch_worker(worker, Current::Clear, 1, now);
        self.renew(now);
        Ack::Ok
    }

    fn requeue(&mut self, worker: &WorkerId, delivery: &Delivery, request: &RequeueRequest, now: u64) -> RequeueReply {
        let Some(unit) = self.fenced_unit(worker, delivery) else { return RequeueReply::Stale };
        let meta = self.meta();
        let state = self.states[unit as usize];
        let over_unit_cap = state.retry_index + 1 > meta.budgets.max_requeues;
        let over_tolerance = !state.entered_retry && meta.requeued_units >= meta.budgets.max_requeued_units(meta.total);
        let summary = request.failure_summary.clone().filter(|s| !s.is_empty());

        if over_unit_cap || over_tolerance {
            let extra = FinalizeExtra { failure_summary: summary, slot: request.slot, ..FinalizeExtra::default() };
            self.finalize_entry(
                delivery.stream,
                delivery.entry_id,
                unit,
                worker,
                Outcome::Failed,
                request.duration_ms,
                Some(FinalizeReason::RetryBudgetExhausted),
                request.errors.clone(),
                extra,
                now,
            );
            self.touch_worker(worker, Current::Clear, 1, now);
            self.renew(now);
            return RequeueReply::Finalized { retry_index: state.retry_index };
        }

        if !state.entered_retry {
            self.states[unit as usize].entered_retry = true;
            self.meta_mut().requeued_units += 1;
        }
        let previous_retry_index = state.retry_index;
        self.states[unit as usize].retry_index += 1;
        self.stream(delivery.stream).pending.remove(&delivery.entry_id);
        let elsewhere = request.retry_elsewhere.then(|| Elsewhere { avoid: worker.clone(), since_ms: now });
        let new_entry_id = self.priority.append_marked(unit, elsewhere, now);
        self.unpark(unit, now);
        let header = self.header(unit, worker, now);
        self.append(
            Event::Requeued {
                header,
                previous_retry_index,
                duration_ms: request.duration_ms,
                failure_summary: summary,
                errors: request.errors.clone(),
                stream: delivery.stream,
                entry_id: delivery.entry_id,
                new_entry_id,
                slot: request.slot,
            },
            now,
        );
        self.touch_worker(worker, Current::Clear, 1, now);
        self.renew(now);
        RequeueReply::Requeued { retry_index: previous_retry_index + 1 }
    }

    /// Hands a delivery back to the priority stream, spending no budget.
    fn release(&mut self, worker: &WorkerId, delivery: &Delivery, now: u64) -> Ack {
        let Some(unit) = self.fenced_unit(worker, delivery) else { return Ack::Stale };
        self.stream(delivery.stream).pending.remove(&delivery.entry_id);
        let new_entry_id = self.priority.append(unit, now);
        self.unpark(unit, now);
        let header = self.header(unit, worker, now);
        self.append(
            Event::Released { header, stream: delivery.stream, entry_id: delivery.entry_id, new_entry_id },
            now,
        );
        self.touch_worker(worker, Current::Clear, 0, now);
        self.renew(now);
        Ack::Ok
    }

    fn progress(&self) -> Progress {
        let meta = self.meta();
        Progress {
            total: meta.total,
            finalized: meta.finalized,
            requeued_units: meta.requeued_units,
            failed: meta.failed,
            stopped: meta.stopped(),
            in_flight: (self.main.pending.len() + self.priority.pending.len()) as u64,
            queued: (self.main.unread() + self.priority.unread() + self.parked.values().map(|p| p.len()).sum::<usize>())
                as u64,
        }
    }
}

/// Fields of a `finalized` event that only some paths set.
#[derive(Default)]
struct FinalizeExtra {
    previous_worker_id: Option<WorkerId>,
    delivery_count: Option<u32>,
    failure_summary: Option<String>,
    slot: Option<u32>,
}

use leasehold_core::duration::millis;

impl MemoryStore {
    /// Runs `f` on the run when it exists with its meta; `None` otherwise.
    fn with_run<T>(&self, run: &RunId, f: impl FnOnce(&mut Run, u64) -> T) -> Option<T> {
        let now = self.now_ms();
        let out = self.inner.runs.lock().with_meta(run, now).map(|r| f(r, now));
        self.inner.changed.notify_waiters();
        out
    }

    /// Appends an unfenced event, creating the run's log when needed.
    fn append_unfenced(&self, run: &RunId, event: impl FnOnce(u64) -> Event) {
        let now = self.now_ms();
        let mut runs = self.inner.runs.lock();
        if runs.live(run, now).is_none() {
            runs.runs.insert(run.clone(), Run::empty(now, millis(ORPHAN_EVENTS_TTL)));
        }
        let r = runs.runs.get_mut(run).expect("inserted above");
        r.append(event(now), now);
        r.renew(now);
        drop(runs);
        self.inner.changed.notify_waiters();
    }

    fn read<T>(&self, run: &RunId, f: impl FnOnce(&Run, u64) -> T) -> Option<T> {
        let now = self.now_ms();
        let mut runs = self.inner.runs.lock();
        runs.live(run, now).map(|r| f(r, now))
    }
}

/// An `Ack` transition: meta, then fence, then `apply`.
fn ack(run: Option<Option<()>>) -> Ack {
    match run {
        None => Ack::Corrupt,
        Some(None) => Ack::Stale,
        Some(Some(())) => Ack::Ok,
    }
}

#[async_trait]
impl UnitQueue for MemoryStore {
    async fn initialize(&self, spec: &RunSpec) -> Result<InitOutcome, QueueError> {
        spec.validate()?;
        let fingerprint = spec.fingerprint();
        let now = self.now_ms();
        let mut runs = self.inner.runs.lock();
        runs.sweep(now);
        if let Some(existing) = runs.with_meta(&spec.run, now) {
            let meta = existing.meta();
            if meta.fingerprint != fingerprint {
                return Err(QueueError::UnitListMismatch {
                    run: spec.run.clone(),
                    existing: meta.total,
                    given: spec.units.len() as u64,
                });
            }
            return Ok(InitOutcome::AlreadyInitialized { budgets: meta.budgets });
        }
        let ttl_ms = millis(spec.ttl);
        // Events recorded before the run existed (worker errors) are kept.
        let mut run = runs.runs.remove(&spec.run).unwrap_or_else(|| Run::empty(now, ttl_ms));
        run.meta = Some(Meta {
            total: spec.units.len() as u64,
            finalized: 0,
            failed: 0,
            requeued_units: 0,
            budgets: spec.budgets,
            ttl_ms,
            fingerprint,
        });
        run.units = spec.units.clone();
        run.states =
            spec.units.iter().map(|u| UnitState { quarantined: u.quarantined, ..UnitState::default() }).collect();
        for i in 0..spec.units.len() {
            run.main.append(i as u32, now);
        }
        run.renew(now);
        runs.runs.insert(spec.run.clone(), run);
        Ok(InitOutcome::Initialized)
    }

    async fn reserve_up_to(
        &self,
        run: &RunId,
        worker: &WorkerId,
        limit: ReserveLimit,
        reclaim_after: Ttl,
    ) -> Result<ReserveBatch, QueueError> {
        let min_idle = reclaim_after.as_millis();
        Ok(self
            .with_run(run, |r, now| r.reserve_up_to(worker, limit, min_idle, now))
            .unwrap_or(ReserveBatch { corrupt: true, ..ReserveBatch::default() }))
    }

    async fn heartbeat_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        deliveries: &[Delivery],
    ) -> Result<Vec<Ack>, QueueError> {
        if deliveries.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self
            .with_run(run, |r, now| {
                let mut renewed = false;
                let replies = deliveries
                    .iter()
                    .map(|delivery| {
                        if r.fenced_unit(worker, delivery).is_none() {
                            return Ack::Stale;
                        }
                        if let Some(p) = r.stream(delivery.stream).pending.get_mut(&delivery.entry_id) {
                            p.last_delivery_ms = now;
                        }
                        r.touch_worker(worker, Current::Set(&delivery.unit), 0, now);
                        renewed = true;
                        Ack::Ok
                    })
                    .collect();
                if renewed {
                    r.renew(now);
                }
                replies
            })
            .unwrap_or_else(|| vec![Ack::Corrupt; deliveries.len()]))
    }

    async fn finalize_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        items: &[(Delivery, FinalizeRequest)],
    ) -> Result<Vec<Ack>, QueueError> {
        for (_, request) in items {
            request.validate()?;
        }
        if items.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self
            .with_run(run, |r, now| {
                items.iter().map(|(delivery, request)| r.finalize(worker, delivery, request, now)).collect()
            })
            .unwrap_or_else(|| vec![Ack::Corrupt; items.len()]))
    }

    async fn requeue(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
        request: &RequeueRequest,
    ) -> Result<RequeueReply, QueueError> {
        request.validate()?;
        Ok(self.with_run(run, |r, now| r.requeue(worker, delivery, request, now)).unwrap_or(RequeueReply::Corrupt))
    }

    async fn abandon(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
        elapsed_ms: u64,
    ) -> Result<Ack, QueueError> {
        Ok(ack(self.with_run(run, |r, now| {
            let unit = r.fenced_unit(worker, delivery)?;
            let header = r.header(unit, worker, now);
            r.append(
                Event::Abandoned { header, elapsed_ms, stream: delivery.stream, entry_id: delivery.entry_id },
                now,
            );
            r.touch_worker(worker, Current::Keep, 0, now);
            r.renew(now);
            Some(())
        })))
    }

    async fn release_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        deliveries: &[Delivery],
    ) -> Result<Vec<Ack>, QueueError> {
        Ok(self
            .with_run(run, |r, now| deliveries.iter().map(|d| r.release(worker, d, now)).collect())
            .unwrap_or_else(|| vec![Ack::Corrupt; deliveries.len()]))
    }

    async fn liveness(
        &self,
        run: &RunId,
        worker: &WorkerId,
        current_unit: Option<&UnitId>,
    ) -> Result<LivenessReply, QueueError> {
        let applied = self.with_run(run, |r, now| {
            let current = current_unit.map_or(Current::Clear, Current::Set);
            r.touch_worker(worker, current, 0, now);
            r.renew(now);
        });
        Ok(if applied.is_some() { LivenessReply::Ok } else { LivenessReply::Corrupt })
    }

    async fn leave(&self, run: &RunId, worker: &WorkerId) -> Result<LivenessReply, QueueError> {
        let applied = self.with_run(run, |r, now| {
            r.touch_worker(worker, Current::Clear, 0, now);
            if let Some(record) = r.workers.get_mut(worker) {
                record.left = true;
            }
            r.renew(now);
        });
        Ok(if applied.is_some() { LivenessReply::Ok } else { LivenessReply::Corrupt })
    }

    async fn record_worker_error(
        &self,
        run: &RunId,
        worker: &WorkerId,
        unit: Option<&UnitId>,
        message: &str,
    ) -> Result<(), QueueError> {
        leasehold_core::queue::check_worker_error_message(message)?;
        self.append_unfenced(run, |at_ms| Event::WorkerError {
            worker_id: worker.clone(),
            unit_id: unit.cloned(),
            message: message.to_owned(),
            at_ms,
        });
        Ok(())
    }

    async fn record_stale_rejected(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
        transition: &str,
    ) -> Result<(), QueueError> {
        self.append_unfenced(run, |at_ms| Event::StaleRejected {
            worker_id: worker.clone(),
            unit_id: delivery.unit.clone(),
            stream: delivery.stream,
            entry_id: delivery.entry_id,
            delivery_count: delivery.delivery_count,
            transition: transition.to_owned(),
            at_ms,
        });
        Ok(())
    }
}

#[async_trait]
impl RunLog for MemoryStore {
    async fn progress(&self, run: &RunId) -> Result<Option<Progress>, QueueError> {
        Ok(self.with_run(run, |r, _| r.progress()))
    }

    async fn budgets(&self, run: &RunId) -> Result<Option<Budgets>, QueueError> {
        Ok(self.with_run(run, |r, _| r.meta().budgets))
    }

    async fn units(&self, run: &RunId) -> Result<Vec<UnitSpec>, QueueError> {
        Ok(self.with_run(run, |r, _| r.units.clone()).unwrap_or_default())
    }

    async fn unit_state(&self, run: &RunId, unit: &UnitId) -> Result<Option<UnitState>, QueueError> {
        Ok(self.with_run(run, |r, _| r.units.iter().position(|u| &u.id == unit).map(|i| r.states[i])).flatten())
    }

    async fn events(&self, run: &RunId, after: Option<EventId>, limit: usize) -> Result<Vec<EventRecord>, QueueError> {
        Ok(self
            .read(run, |r, _| {
                let start = after.map_or(0, |after| r.attempts.partition_point(|e| e.id <= after));
                r.attempts[start..].iter().take(limit).cloned().collect()
            })
            .unwrap_or_default())
    }

    async fn wait_for_events(
        &self,
        run: &RunId,
        after: Option<EventId>,
        timeout: Duration,
    ) -> Result<Option<EventId>, QueueError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let newest = || self.read(run, |r, _| r.attempts.last().map(|e| e.id)).flatten();
        let seen = after.or_else(newest);
        loop {
            // Listening before reading: a change between the two still wakes us.
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let latest = newest();
            if latest > seen {
                return Ok(latest);
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(deadline) => return Ok(after),
            }
        }
    }

    async fn workers(&self, run: &RunId) -> Result<Vec<WorkerRecord>, QueueError> {
        Ok(self.read(run, |r, _| r.workers.values().cloned().collect()).unwrap_or_default())
    }

    async fn pending(&self, run: &RunId) -> Result<Vec<PendingDelivery>, QueueError> {
        Ok(self
            .read(run, |r, now| {
                let mut out = Vec::new();
                for (name, stream) in [(StreamName::Priority, &r.priority), (StreamName::Main, &r.main)] {
                    for (id, p) in &stream.pending {
                        out.push(PendingDelivery {
                            unit: r.units[p.unit as usize].id.clone(),
                            stream: name,
                            entry_id: *id,
                            worker: p.consumer.clone(),
                            idle_ms: now.saturating_sub(p.last_delivery_ms),
                            delivery_count: p.delivery_count,
                        });
                    }
                }
                out
            })
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use leasehold_core::{Budgets, RunId, RunLog, RunSpec, UnitId, UnitQueue, UnitSpec};

    use crate::MemoryStore;

    fn spec(run: &str, ttl: Duration) -> RunSpec {
        RunSpec {
            run: RunId::new(run).unwrap(),
            units: vec![UnitSpec::new(UnitId::new("u").unwrap(), "")],
            budgets: Budgets::default(),
            ttl,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn runs_past_their_ttl_are_dropped_by_a_later_initialize() {
        let store = MemoryStore::new();
        for i in 0..50 {
            store.initialize(&spec(&format!("short-{i}"), Duration::from_secs(1))).await.unwrap();
        }
        store.initialize(&spec("long", Duration::from_secs(3600))).await.unwrap();
        assert_eq!(store.inner.runs.lock().runs.len(), 51);
        tokio::time::advance(Duration::from_secs(120)).await;
        store.initialize(&spec("next", Duration::from_secs(1))).await.unwrap();
        let left: Vec<String> = store.inner.runs.lock().runs.keys().map(|r| r.to_string()).collect();
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(store.progress(&RunId::new("long").unwrap()).await.unwrap().is_some());
    }
}
