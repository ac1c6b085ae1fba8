//! The build's timeline: every attempt of every unit as a bar on one of its
//! worker's lanes, rebuilt from the queue's event log.
//!
//! The log says when a unit was delivered to a worker, when its attempt
//! ended (requeued, finalized, abandoned, reclaimed from a dead worker), how
//! long the attempt ran and, when the worker said, which of its slots ran it
//! (hopper's workers say: the `slot` of `requeued` and `finalized` events).
//! An attempt ran for its duration up to its end, on its slot's lane. An
//! attempt with no slot (an older worker's, one lost with its worker, one
//! given up on shutdown) is packed onto as few extra lanes of its worker as
//! overlap requires (in delivery order, each onto the lane that came free
//! last). Units delivered together (one
//! `reserve_batch`: consecutive `delivered` events of one worker at one
//! instant) whose durations fit one after another in their span are a batch:
//! they share one lane, run one after another up to the end, and the time
//! before the first of them is drawn as the invocation's overhead (start-up,
//! collection).

use std::collections::HashMap;

use leasehold_core::{Event, FinalizeReason, Outcome, RunId, RunLog, UnitId, WorkerId};
use serde::Serialize;

use super::event_log::read_events;
use crate::errors::HopperError;

/// Slack allowed when deciding that units delivered together ran one after another.
const SEQUENTIAL_SLACK_MS: u64 = 20;

/// What an attempt's bar shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BarKind {
    /// Passed at the first attempt.
    Passed,
    /// Passed after failing before (flaky).
    Flaky,
    /// Failed, and was retried.
    Retried,
    /// Failed for good.
    Failed,
    /// Skipped by the tool.
    Skipped,
    /// Given up on shutdown.
    Abandoned,
    /// Held by a worker that stopped responding, until another reclaimed it.
    Lost,
    /// A batch's time before its first unit: start-up and collection.
    Overhead,
}

impl BarKind {
    /// Every kind, in legend order.
    pub const ALL: [BarKind; 8] = [
        BarKind::Passed,
        BarKind::Flaky,
        BarKind::Retried,
        BarKind::Failed,
        BarKind::Skipped,
        BarKind::Abandoned,
        BarKind::Lost,
        BarKind::Overhead,
    ];

    /// The name used in the page (CSS class, legend).
    pub fn as_str(self) -> &'static str {
        match self {
            BarKind::Passed => "passed",
            BarKind::Flaky => "flaky",
            BarKind::Retried => "retried",
            BarKind::Failed => "failed",
            BarKind::Skipped => "skipped",
            BarKind::Abandoned => "abandoned",
            BarKind::Lost => "lost",
            BarKind::Overhead => "overhead",
        }
    }

    /// Its colour (`#rrggbb`).
    pub fn colour(self) -> &'static str {
        match self {
            BarKind::Passed => "#2ca02c",
            BarKind::Flaky => "#9467bd",
            BarKind::Retried => "#ff7f0e",
            BarKind::Failed => "#d62728",
            BarKind::Skipped => "#17becf",
            BarKind::Abandoned => "#8c564b",
            BarKind::Lost => "#7f7f7f",
            BarKind::Overhead => "#c7c7c7",
        }
    }
}

/// One attempt of a unit (or a batch's overhead), placed on a lane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Bar {
    /// The lane (index into [`Timeline::lanes`]).
    pub lane: usize,
    /// The unit (empty for overhead).
    pub unit: String,
    /// What it shows.
    pub kind: BarKind,
    /// Start, in milliseconds after the build's start.
    pub start_ms: u64,
    /// End, in milliseconds after the build's start.
    pub end_ms: u64,
    /// Which attempt of the unit (1 = first).
    pub attempt: u32,
    /// A short description (the failure, the reason).
    pub note: String,
}

/// One lane of a worker: what one of its slots did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lane {
    /// The worker.
    pub worker: String,
    /// Its lane number within the worker (1 = first): the slot's index + 1
    /// for a slot's lane, after the worker's slots for packed lanes.
    pub slot: usize,
    /// When its last bar ended (ms after the build's start).
    pub last_end_ms: u64,
    /// Time spent in bars.
    pub busy_ms: u64,
    /// From its last bar's end to the build's end: idle while others still ran.
    pub idle_at_end_ms: u64,
}

/// The whole build on lanes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Timeline {
    /// When the first attempt started (ms since the Unix epoch, store's clock).
    pub started_at_ms: u64,
    /// From the first start to the last end.
    pub span_ms: u64,
    /// Every lane, by worker then slot.
    pub lanes: Vec<Lane>,
    /// Every bar.
    pub bars: Vec<Bar>,
    /// Idle time of all lanes at the end of the build.
    pub idle_at_end_ms: u64,
}

/// One attempt read from the log, with absolute times.
#[derive(Debug, Clone)]
struct Attempt {
    unit: UnitId,
    worker: WorkerId,
    delivered_ms: u64,
    /// Which `reserve_batch` delivered it (consecutive deliveries of one worker at one instant).
    group: usize,
    end_ms: u64,
    duration_ms: u64,
    kind: BarKind,
    attempt: u32,
    note: String,
    /// The worker's slot that ran it, when the event said.
    slot: Option<u32>,
}

struct Open {
    worker: WorkerId,
    delivered_ms: u64,
    group: usize,
}

/// Rebuilds attempts from the log, in log order.
fn attempts(events: impl IntoIterator<Item = Event>) -> Vec<Attempt> {
    let mut open: HashMap<UnitId, Open> = HashMap::new();
    let mut tries: HashMap<UnitId, u32> = HashMap::new();
    let mut failed_before: HashMap<UnitId, bool> = HashMap::new();
    let mut out = Vec::new();
    let mut group = 0usize;
    let mut last_delivery: Option<(WorkerId, u64)> = None;
    let mut close = |open: &mut HashMap<UnitId, Open>,
                     out: &mut Vec<Attempt>,
                     unit: &UnitId,
                     worker: &WorkerId,
                     end_ms: u64,
                     duration_ms: Option<u64>,
                     kind: BarKind,
                     note: String,
                     slot: Option<u32>| {
        let Some(held) = open.remove(unit) else { return };
        if &held.worker != worker && kind != BarKind::Lost {
            // Not this worker's delivery (a stale result): keep it open.
            open.insert(unit.clone(), held);
            return;
        }
        let attempt = tries.entry(unit.clone()).or_insert(0);
        *attempt += 1;
        let span = end_ms.saturating_sub(held.delivered_ms);
        out.push(Attempt {
            unit: unit.clone(),
            worker: held.worker,
            delivered_ms: held.delivered_ms,
            group: held.group,
            end_ms,
            duration_ms: duration_ms.unwrap_or(span).min(span),
            kind,
            attempt: *attempt,
            note,
            slot,
        });
    };
    for event in events {
        if !matches!(event, Event::Delivered { .. }) {
            last_delivery = None;
        }
        match event {
            Event::Delivered { header, .. } => {
                let key = (header.worker_id.clone(), header.at_ms);
                if last_delivery.as_ref() != Some(&key) {
                    group += 1;
                    last_delivery = Some(key);
                }
                open.insert(header.unit_id, Open { worker: header.worker_id, delivered_ms: header.at_ms, group });
            }
            Event::Reclaimed { header, previous_worker_id, .. } => {
                if let Some(previous) = previous_worker_id {
                    let note = format!("its worker stopped responding; reclaimed by {}", header.worker_id);
                    close(
                        &mut open,
                        &mut out,
                        &header.unit_id,
                        &previous,
                        header.at_ms,
                        None,
                        BarKind::Lost,
                        note,
                        None,
                    );
                }
                group += 1;
                open.insert(header.unit_id, Open { worker: header.worker_id, delivered_ms: header.at_ms, group });
            }
            Event::Requeued { header, duration_ms, failure_summary, slot, .. } => {
                failed_before.insert(header.unit_id.clone(), true);
                let note = failure_summary.unwrap_or_default();
                let (unit, worker) = (&header.unit_id, &header.worker_id);
                let ran = Some(duration_ms);
                close(&mut open, &mut out, unit, worker, header.at_ms, ran, BarKind::Retried, note, slot);
            }
            Event::Finalized { header, outcome, duration_ms, reason, failure_summary, errors, slot, .. } => {
                let (unit, worker) = (&header.unit_id, &header.worker_id);
                if reason == Some(FinalizeReason::ReclaimBudgetExhausted) {
                    let note = "reclaimed too often".to_owned();
                    close(&mut open, &mut out, unit, worker, header.at_ms, None, BarKind::Lost, note, None);
                    continue;
                }
                let flaky = failed_before.get(unit).copied().unwrap_or(false);
                let kind = match outcome {
                    Outcome::Passed if flaky => BarKind::Flaky,
                    Outcome::Passed => BarKind::Passed,
                    Outcome::Skipped => BarKind::Skipped,
                    Outcome::Failed => BarKind::Failed,
                };
                let detail = errors.as_ref().and_then(|e| e.get("detail")).and_then(|d| d.as_str()).map(str::to_owned);
                let note = detail.or(failure_summary).unwrap_or_default();
                close(&mut open, &mut out, unit, worker, header.at_ms, Some(duration_ms), kind, note, slot);
            }
            Event::Abandoned { header, elapsed_ms, .. } => {
                let (unit, worker) = (&header.unit_id, &header.worker_id);
                let note = "given up on shutdown".to_owned();
                let ran = Some(elapsed_ms);
                close(&mut open, &mut out, unit, worker, header.at_ms, ran, BarKind::Abandoned, note, None);
            }
            Event::Released { header, .. } => {
                // Handed back with no result and no duration (on a signal, or
                // reserved ahead and never started): nothing to draw.
                if open.get(&header.unit_id).is_some_and(|held| held.worker == header.worker_id) {
                    open.remove(&header.unit_id);
                }
            }
            Event::WorkerError { .. } | Event::StaleRejected { .. } => {}
        }
    }
    out
}

/// A span of a lane: one attempt, or one batch (its units one after another).
struct Block {
    worker: WorkerId,
    /// Where the block may start (its delivery, for a batch's overhead).
    head_ms: u64,
    /// Where its first unit starts.
    start_ms: u64,
    end_ms: u64,
    /// The slot that ran it, when the events say.
    slot: Option<u32>,
    members: Vec<(Attempt, u64, u64)>,
}

/// One `reserve_batch` of a worker (its group) and the slot that ran it.
type GroupKey = (usize, Option<u32>);

fn blocks(attempts: Vec<Attempt>) -> Vec<Block> {
    // Two slots that reserved at the same instant look like one batch; the
    // slots they name tell them apart.
    let mut by_group: Vec<(GroupKey, Vec<Attempt>)> = Vec::new();
    let mut index: HashMap<GroupKey, usize> = HashMap::new();
    for attempt in attempts {
        let key = (attempt.group, attempt.slot);
        let at = *index.entry(key).or_insert_with(|| {
            by_group.push((key, Vec::new()));
            by_group.len() - 1
        });
        by_group[at].1.push(attempt);
    }
    let mut out = Vec::new();
    for (_, members) in by_group {
        let delivered = members.iter().map(|a| a.delivered_ms).min().unwrap_or(0);
        let end = members.iter().map(|a| a.end_ms).max().unwrap_or(delivered);
        let total: u64 = members.iter().map(|a| a.duration_ms).sum();
        let sequential = members.len() > 1 && total <= (end - delivered) + SEQUENTIAL_SLACK_MS;
        if sequential {
            // One invocation: its units ran one after another, ending at its end.
            let mut placed = Vec::with_capacity(members.len());
            let mut cursor = end;
            for attempt in members.into_iter().rev() {
                let stop = attempt.end_ms.min(cursor);
                let start = stop.saturating_sub(attempt.duration_ms).max(delivered);
                cursor = start;
                placed.push((attempt, start, stop));
            }
            placed.reverse();
            let worker = placed[0].0.worker.clone();
            let slot = placed[0].0.slot;
            out.push(Block { worker, head_ms: delivered, start_ms: cursor, end_ms: end, slot, members: placed });
        } else {
            for attempt in members {
                let start = attempt.end_ms.saturating_sub(attempt.duration_ms).max(attempt.delivered_ms);
                out.push(Block {
                    worker: attempt.worker.clone(),
                    head_ms: start,
                    start_ms: start,
                    end_ms: attempt.end_ms,
                    slot: attempt.slot,
                    members: vec![(attempt.clone(), start, attempt.end_ms)],
                });
            }
        }
    }
    out
}

impl Timeline {
    /// Builds the timeline from a run's events (in log order).
    pub fn from_events(events: impl IntoIterator<Item = Event>) -> Self {
        let mut blocks = blocks(attempts(events));
        if blocks.is_empty() {
            return Self::default();
        }
        blocks.sort_by(|a, b| (&a.worker, a.head_ms, a.start_ms).cmp(&(&b.worker, b.head_ms, b.start_ms)));
        let origin = blocks.iter().map(|b| b.head_ms).min().unwrap_or(0);
        let end = blocks.iter().map(|b| b.end_ms).max().unwrap_or(origin);
        let rel = |t: u64| t.saturating_sub(origin);

        // Packed lanes are numbered after each worker's slots.
        let mut slots_of: HashMap<WorkerId, usize> = HashMap::new();
        for block in &blocks {
            if let Some(slot) = block.slot {
                let count = slots_of.entry(block.worker.clone()).or_default();
                *count = (*count).max(slot as usize + 1);
            }
        }
        let mut lanes: Vec<Lane> = Vec::new();
        let mut bars = Vec::new();
        let mut slot_lanes: HashMap<u32, usize> = HashMap::new();
        let mut packed_lanes: Vec<usize> = Vec::new();
        let mut current: Option<WorkerId> = None;
        for block in blocks {
            if current.as_ref() != Some(&block.worker) {
                current = Some(block.worker.clone());
                slot_lanes.clear();
                packed_lanes.clear();
            }
            let new_lane = |lanes: &mut Vec<Lane>, slot: usize| {
                let (worker, last_end_ms, busy_ms, idle_at_end_ms) = (block.worker.to_string(), 0, 0, 0);
                lanes.push(Lane { worker, slot, last_end_ms, busy_ms, idle_at_end_ms });
                lanes.len() - 1
            };
            let lane = match block.slot {
                Some(slot) => *slot_lanes.entry(slot).or_insert_with(|| new_lane(&mut lanes, slot as usize + 1)),
                None => {
                    // The lane that came free last before the block's
                    // delivery: a slot that goes on with its next unit or batch.
                    let free = packed_lanes
                        .iter()
                        .copied()
                        .filter(|l| lanes[*l].last_end_ms <= rel(block.head_ms))
                        .max_by_key(|l| (lanes[*l].last_end_ms, std::cmp::Reverse(*l)));
                    match free {
                        Some(lane) => lane,
                        None => {
                            let number = slots_of.get(&block.worker).copied().unwrap_or(0) + packed_lanes.len() + 1;
                            let lane = new_lane(&mut lanes, number);
                            packed_lanes.push(lane);
                            lane
                        }
                    }
                }
            };
            let head = rel(block.head_ms);
            if head < rel(block.start_ms) {
                bars.push(Bar {
                    lane,
                    unit: String::new(),
                    kind: BarKind::Overhead,
                    start_ms: head,
                    end_ms: rel(block.start_ms),
                    attempt: 0,
                    note: format!("start-up of a batch of {} units", block.members.len()),
                });
                lanes[lane].busy_ms += rel(block.start_ms) - head;
            }
            for (attempt, start, stop) in block.members {
                lanes[lane].busy_ms += stop - start;
                bars.push(Bar {
                    lane,
                    unit: attempt.unit.to_string(),
                    kind: attempt.kind,
                    start_ms: rel(start),
                    end_ms: rel(stop),
                    attempt: attempt.attempt,
                    note: attempt.note,
                });
            }
            lanes[lane].last_end_ms = lanes[lane].last_end_ms.max(rel(block.end_ms));
        }
        let span_ms = rel(end);
        for lane in &mut lanes {
            lane.idle_at_end_ms = span_ms - lane.last_end_ms.min(span_ms);
        }
        // By worker, then slot.
        let mut order: Vec<usize> = (0..lanes.len()).collect();
        order.sort_by(|a, b| (&lanes[*a].worker, lanes[*a].slot).cmp(&(&lanes[*b].worker, lanes[*b].slot)));
        let mut moved_to = vec![0; lanes.len()];
        for (to, from) in order.iter().enumerate() {
            moved_to[*from] = to;
        }
        for bar in &mut bars {
            bar.lane = moved_to[bar.lane];
        }
        let lanes = order.into_iter().map(|from| lanes[from].clone()).collect::<Vec<_>>();
        let idle_at_end_ms = lanes.iter().map(|l| l.idle_at_end_ms).sum();
        Self { started_at_ms: origin, span_ms, lanes, bars, idle_at_end_ms }
    }

    /// Reads the run's whole event log and builds its timeline.
    pub async fn load(queue: &dyn RunLog, run: &RunId) -> Result<Self, HopperError> {
        Ok(Self::from_events(read_events(queue, run).await?))
    }

    /// Bars of units (not overhead).
    pub fn unit_bars(&self) -> impl Iterator<Item = &Bar> {
        self.bars.iter().filter(|b| b.kind != BarKind::Overhead)
    }
}

#[cfg(test)]
mod tests {
    use leasehold_core::{EntryId, StreamName, UnitEventHeader};

    use super::*;

    fn header(unit: &str, worker: &str, at_ms: u64) -> UnitEventHeader {
        UnitEventHeader {
            unit_id: UnitId::new(unit).unwrap(),
            worker_id: WorkerId::new(worker).unwrap(),
            retry_index: 0,
            reclaim_count: 0,
            ownership_generation: 1,
            at_ms,
        }
    }

    fn delivered(unit: &str, worker: &str, at: u64) -> Event {
        Event::Delivered {
            header: header(unit, worker, at),
            stream: StreamName::Main,
            entry_id: EntryId::new(1, 0),
            delivery_count: 1,
        }
    }

    fn finalized(unit: &str, worker: &str, at: u64, ms: u64, outcome: Outcome) -> Event {
        Event::Finalized {
            header: header(unit, worker, at),
            outcome,
            duration_ms: ms,
            reason: None,
            errors: None,
            stream: StreamName::Main,
            entry_id: EntryId::new(1, 0),
            previous_worker_id: None,
            delivery_count: None,
            failure_summary: None,
            slot: None,
        }
    }

    fn requeued(unit: &str, worker: &str, at: u64, ms: u64) -> Event {
        Event::Requeued {
            header: header(unit, worker, at),
            previous_retry_index: 0,
            duration_ms: ms,
            failure_summary: Some("exit code 1".into()),
            errors: None,
            stream: StreamName::Main,
            entry_id: EntryId::new(1, 0),
            new_entry_id: EntryId::new(2, 0),
            slot: None,
        }
    }

    #[test]
    fn parallel_units_get_lanes_and_idle_time_at_the_end() {
        // Two slots of w1 reserve at the same instant; a, then c, on one; b on the other.
        let events = vec![
            delivered("a", "w1", 1000),
            delivered("b", "w1", 1000),
            finalized("a", "w1", 1100, 100, Outcome::Passed),
            delivered("c", "w1", 1100),
            requeued("b", "w1", 1400, 400),
            delivered("b", "w1", 1400),
            finalized("c", "w1", 1300, 200, Outcome::Passed),
            finalized("b", "w1", 1500, 100, Outcome::Passed),
        ];
        let timeline = Timeline::from_events(events);
        assert_eq!(timeline.span_ms, 500);
        assert_eq!(timeline.lanes.len(), 2, "{timeline:#?}");
        let bar = |unit: &str, attempt: u32| {
            timeline.bars.iter().find(|b| b.unit == unit && b.attempt == attempt).unwrap().clone()
        };
        assert_eq!((bar("a", 1).start_ms, bar("a", 1).end_ms), (0, 100));
        assert_eq!(bar("b", 1).kind, BarKind::Retried);
        assert_eq!((bar("b", 1).start_ms, bar("b", 1).end_ms), (0, 400));
        assert_eq!(bar("b", 2).kind, BarKind::Flaky);
        assert_eq!(bar("a", 1).lane, bar("c", 1).lane);
        assert_ne!(bar("a", 1).lane, bar("b", 1).lane);
        // a and c's lane ends at 300, the build at 500.
        assert_eq!(timeline.idle_at_end_ms, 200);
    }

    #[test]
    fn a_batch_is_one_lane_with_its_units_in_a_row_after_its_start_up() {
        let mut events = vec![delivered("x", "w1", 0), delivered("y", "w1", 0), delivered("z", "w1", 0)];
        events.push(finalized("x", "w1", 1000, 100, Outcome::Passed));
        events.push(finalized("y", "w1", 1001, 200, Outcome::Failed));
        events.push(finalized("z", "w1", 1002, 300, Outcome::Passed));
        let timeline = Timeline::from_events(events);
        assert_eq!(timeline.lanes.len(), 1, "{timeline:#?}");
        let spans: Vec<(&str, u64, u64)> =
            timeline.bars.iter().map(|b| (b.kind.as_str(), b.start_ms, b.end_ms)).collect();
        assert_eq!(
            spans,
            vec![("overhead", 0, 402), ("passed", 402, 502), ("failed", 502, 702), ("passed", 702, 1002)]
        );
        assert_eq!(timeline.unit_bars().count(), 3);
    }

    #[test]
    fn batches_stay_on_the_slot_that_reserved_them() {
        // Slot A: batch 1 (x1, x2) then batch 3 (z1); slot B: batch 2 (y1, y2), whose start-up is shorter.
        let mut events = vec![delivered("x1", "w", 0), delivered("x2", "w", 0)];
        events.extend([delivered("y1", "w", 5), delivered("y2", "w", 5)]);
        events.push(finalized("x1", "w", 2000, 10, Outcome::Passed));
        events.push(finalized("x2", "w", 2001, 10, Outcome::Passed));
        events.push(delivered("z1", "w", 2010));
        events.push(delivered("z2", "w", 2010));
        events.push(finalized("y1", "w", 2300, 10, Outcome::Passed));
        events.push(finalized("y2", "w", 2301, 10, Outcome::Passed));
        events.push(finalized("z1", "w", 3800, 10, Outcome::Passed));
        events.push(finalized("z2", "w", 3801, 10, Outcome::Passed));
        let timeline = Timeline::from_events(events);
        let lane_of = |unit: &str| timeline.bars.iter().find(|b| b.unit == unit).unwrap().lane;
        assert_eq!(lane_of("x1"), lane_of("z1"), "{timeline:#?}");
        assert_ne!(lane_of("y1"), lane_of("z1"));
        let overhead: Vec<(u64, u64)> = timeline
            .bars
            .iter()
            .filter(|b| b.kind == BarKind::Overhead && b.lane == lane_of("z1"))
            .map(|b| (b.start_ms, b.end_ms))
            .collect();
        assert_eq!(overhead, vec![(0, 1981), (2010, 3781)], "z's start-up begins at its delivery");
    }

    /// `event` as run on `slot`.
    fn on_slot(mut event: Event, at: u32) -> Event {
        if let Event::Finalized { slot, .. } | Event::Requeued { slot, .. } = &mut event {
            *slot = Some(at);
        }
        event
    }

    #[test]
    fn attempts_that_name_their_slot_are_drawn_on_it() {
        // Packing would put c after a (slot 0 came free last); the events say slot 1 ran it.
        let events = vec![
            delivered("a", "w1", 0),
            delivered("b", "w1", 0),
            on_slot(finalized("a", "w1", 100, 100, Outcome::Passed), 0),
            delivered("c", "w1", 100),
            on_slot(requeued("b", "w1", 150, 150), 1),
            on_slot(finalized("c", "w1", 250, 90, Outcome::Passed), 1),
            delivered("d", "w2", 0),
            on_slot(finalized("d", "w2", 50, 50, Outcome::Passed), 3),
            // A worker that names no slot: its attempts are packed after its slots.
            delivered("e", "w1", 300),
            finalized("e", "w1", 400, 100, Outcome::Passed),
        ];
        let timeline = Timeline::from_events(events);
        let lanes: Vec<(&str, usize)> = timeline.lanes.iter().map(|l| (l.worker.as_str(), l.slot)).collect();
        assert_eq!(lanes, vec![("w1", 1), ("w1", 2), ("w1", 3), ("w2", 4)], "{timeline:#?}");
        let lane_of = |unit: &str| {
            let bar = timeline.bars.iter().find(|b| b.unit == unit).unwrap();
            (timeline.lanes[bar.lane].worker.as_str(), timeline.lanes[bar.lane].slot)
        };
        assert_eq!(lane_of("a"), ("w1", 1));
        assert_eq!(lane_of("b"), ("w1", 2));
        assert_eq!(lane_of("c"), ("w1", 2));
        assert_eq!(lane_of("d"), ("w2", 4));
        assert_eq!(lane_of("e"), ("w1", 3));
    }

    #[test]
    fn two_slots_that_reserved_at_one_instant_are_not_one_batch() {
        // Their durations would fit one after another, as a batch's do.
        let events = vec![
            delivered("f", "w", 0),
            delivered("g", "w", 0),
            on_slot(finalized("f", "w", 100, 40, Outcome::Passed), 0),
            on_slot(finalized("g", "w", 101, 40, Outcome::Passed), 1),
        ];
        let timeline = Timeline::from_events(events);
        let placed: Vec<(usize, u64)> =
            timeline.bars.iter().map(|b| (timeline.lanes[b.lane].slot, b.start_ms)).collect();
        assert_eq!(placed, vec![(1, 0), (2, 1)], "{timeline:#?}");
    }

    #[test]
    fn a_dead_workers_unit_is_lost_until_reclaimed() {
        let events = vec![
            delivered("a", "dead", 0),
            Event::Reclaimed {
                header: header("a", "w2", 5000),
                previous_worker_id: Some(WorkerId::new("dead").unwrap()),
                stream: StreamName::Main,
                entry_id: EntryId::new(1, 0),
                delivery_count: 2,
            },
            finalized("a", "w2", 5100, 100, Outcome::Passed),
        ];
        let timeline = Timeline::from_events(events);
        let kinds: Vec<(&str, &str)> =
            timeline.bars.iter().map(|b| (timeline.lanes[b.lane].worker.as_str(), b.kind.as_str())).collect();
        assert_eq!(kinds, vec![("dead", "lost"), ("w2", "passed")]);
        assert_eq!(timeline.lanes[0].idle_at_end_ms, 100);
    }
}
