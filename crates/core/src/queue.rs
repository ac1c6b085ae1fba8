//! The fenced unit queue.
//!
//! See [`UnitQueue`] for the contract.

use std::collections::HashSet;
use std::fmt;
use std::num::NonZeroUsize;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::errors::{QueueError, SpecError};
use crate::events::{EventId, EventRecord};
use crate::ids::{EntryId, RunId, UnitId, WorkerId};
use crate::ttl::Ttl;

/// How long a retry marked to go elsewhere waits for its own worker when no
/// other worker is live (or the call's `reclaim_after`, when shorter): a
/// worker that joins the build a moment later may still take it, and a
/// lone worker retries after this short wait. See the contract, "Retry
/// elsewhere".
pub const RETRY_ALONE_AFTER: Duration = Duration::from_secs(1);

/// Longest unit kind label, in bytes.
pub const MAX_KIND_LEN: usize = 256;
/// Longest failure summary or worker error message, in bytes.
pub const MAX_SUMMARY_LEN: usize = 64 * 1024;
/// Largest `errors` payload (serialised JSON), in bytes.
pub const MAX_ERRORS_LEN: usize = 1024 * 1024;
/// Inactivity TTL of a run's event log when events are recorded before the
/// run is initialised (worker errors, stale rejections); a run's own TTL
/// applies once it exists.
pub const ORPHAN_EVENTS_TTL: Duration = Duration::from_secs(24 * 3600);

/// The reply status of a transition, as the seed names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// The transition was applied.
    Ok,
    /// Nothing to do (no unit available).
    None,
    /// The unit reached its final outcome through this transition.
    Finalized,
    /// The unit was put back for another attempt.
    Requeued,
    /// The fence failed: the caller no longer owns this delivery. Nothing changed.
    Stale,
    /// The run's meta or the unit's state is missing. Nothing changed.
    Corrupt,
    /// The run reached its failure limit ([`Budgets::max_failures`]): nothing
    /// more is handed out. Nothing changed.
    Stopped,
}

impl Status {
    /// The seed's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::None => "NONE",
            Status::Finalized => "FINALIZED",
            Status::Requeued => "REQUEUED",
            Status::Stale => "STALE",
            Status::Corrupt => "CORRUPT",
            Status::Stopped => "STOPPED",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The two streams of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum StreamName {
    /// The main stream (`units`): every unit once, in the initial order.
    #[serde(rename = "units")]
    Main,
    /// The priority stream (`units:priority`): requeued units, read first.
    #[serde(rename = "units:priority")]
    Priority,
}

impl StreamName {
    /// The seed's short name.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamName::Main => "units",
            StreamName::Priority => "units:priority",
        }
    }
}

impl fmt::Display for StreamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for StreamName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "units" => Ok(StreamName::Main),
            "units:priority" => Ok(StreamName::Priority),
            other => Err(format!("unknown stream {other:?}")),
        }
    }
}

/// A fleet-wide concurrency group: at most `limit` of its units are handed
/// out at once, across every worker of the run (see "Groups" in the
/// [`UnitQueue`] contract).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct UnitGroup {
    /// The group's name: 1 to 256 bytes, no control characters.
    pub name: String,
    /// How many of its units may be handed out at once.
    pub limit: std::num::NonZeroU32,
}

/// One unit of a run: its id, a free kind label (the seed's `type`) and
/// the group it belongs to, if any.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct UnitSpec {
    /// The unit.
    pub id: UnitId,
    /// A label the runner may use (e.g. `file`, `test`); may be empty.
    pub kind: String,
    /// Its concurrency group; `None` runs it whenever a worker asks.
    #[serde(default)]
    pub group: Option<UnitGroup>,
    /// A quarantined unit: its failures do not count toward the run's
    /// failure limit ([`Budgets::max_failures`]).
    #[serde(default)]
    pub quarantined: bool,
}

impl UnitSpec {
    /// A unit with the given id and kind, in no group.
    pub fn new(id: UnitId, kind: impl Into<String>) -> Self {
        Self { id, kind: kind.into(), group: None, quarantined: false }
    }

    /// The same unit, quarantined (see [`UnitSpec::quarantined`]).
    pub fn quarantine(mut self) -> Self {
        self.quarantined = true;
        self
    }

    /// The same unit in `group`.
    pub fn in_group(mut self, group: UnitGroup) -> Self {
        self.group = Some(group);
        self
    }
}

/// Retry and reclaim budgets, frozen into the run at initialisation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Budgets {
    /// Attempts after the first that one unit may get (per-unit requeue cap).
    pub max_requeues: u32,
    /// Fraction of the run's units that may be requeued at all (first requeues).
    pub requeue_tolerance: f64,
    /// Times one unit may be reclaimed from a dead worker before it fails.
    pub max_reclaims: u32,
    /// Units that may fail for good before the run stops handing out units
    /// (fail fast); `None` is no limit. A run stored without this budget
    /// reads as `None`.
    #[serde(default)]
    pub max_failures: Option<u32>,
}

impl Default for Budgets {
    fn default() -> Self {
        Self { max_requeues: 1, requeue_tolerance: 0.2, max_reclaims: 2, max_failures: None }
    }
}

impl Budgets {
    /// Checks the budgets: the tolerance must be a finite fraction in [0, 1].
    pub fn validate(&self) -> Result<(), SpecError> {
        let t = self.requeue_tolerance;
        if !t.is_finite() || !(0.0..=1.0).contains(&t) {
            return Err(SpecError::BadTolerance { value: t });
        }
        Ok(())
    }

    /// How many distinct units of a run of `total` may be requeued:
    /// `ceil(total × tolerance)`, less an epsilon so `100 × 0.7` is 70, not 71.
    pub fn max_requeued_units(&self, total: u64) -> u64 {
        let cap = (total as f64 * self.requeue_tolerance - 1e-9).ceil();
        if cap <= 0.0 {
            0
        } else {
            cap as u64
        }
    }
}

/// Everything needed to initialise a run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    /// The run.
    pub run: RunId,
    /// Its units, in the order they should be handed out.
    pub units: Vec<UnitSpec>,
    /// Its budgets.
    pub budgets: Budgets,
    /// Inactivity TTL: the run's state is dropped after this long without a transition.
    pub ttl: Duration,
}

impl RunSpec {
    /// Checks the unit list (non-empty, no duplicates, kinds in bounds), the
    /// budgets and the TTL.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.units.is_empty() {
            return Err(SpecError::NoUnits { run: self.run.clone() });
        }
        let mut seen = HashSet::with_capacity(self.units.len());
        let mut limits: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
        for unit in &self.units {
            if unit.kind.len() > MAX_KIND_LEN {
                return Err(SpecError::KindTooLong { unit: unit.id.clone(), len: unit.kind.len() });
            }
            if let Some(group) = &unit.group {
                let name = group.name.as_str();
                if name.is_empty() || name.len() > MAX_KIND_LEN || name.chars().any(char::is_control) {
                    return Err(SpecError::BadGroupName { unit: unit.id.clone(), name: name.to_owned() });
                }
                let limit = group.limit.get();
                if let Some(&first) = limits.get(name).filter(|&&first| first != limit) {
                    return Err(SpecError::GroupLimitMismatch { group: name.to_owned(), first, other: limit });
                }
                limits.insert(name, limit);
            }
            if !seen.insert(&unit.id) {
                return Err(SpecError::DuplicateUnit { run: self.run.clone(), unit: unit.id.clone() });
            }
        }
        self.budgets.validate()?;
        Ttl::new("run inactivity TTL", self.ttl).map(|_| ())
    }

    /// A digest of the unit list (order-insensitive), so a second initialisation
    /// can tell whether it names the same units. Backends store and compare it.
    pub fn fingerprint(&self) -> String {
        let mut units: Vec<&UnitSpec> = self.units.iter().collect();
        units.sort_by(|a, b| a.id.cmp(&b.id).then_with(|| a.kind.cmp(&b.kind)));
        // Each field goes in with its length first, so no two lists hash the
        // same input: ("ab", "") and ("a", "b") differ, whatever a kind holds.
        let mut hash = Sha256::new();
        for unit in units {
            let group = unit.group.as_ref().map(|g| format!("{}:{}", g.limit, g.name));
            let quarantined = unit.quarantined.then_some("quarantined");
            for field in [Some(unit.id.as_str()), Some(unit.kind.as_str()), group.as_deref(), quarantined] {
                // A tag before each field keeps "no group" apart from any group.
                match field {
                    Some(field) => {
                        hash.update([1u8]);
                        hash.update((field.len() as u64).to_le_bytes());
                        hash.update(field.as_bytes());
                    }
                    None => hash.update([0u8]),
                }
            }
        }
        hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// What [`UnitQueue::initialize`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum InitOutcome {
    /// This caller initialised the run (it is the leader).
    Initialized,
    /// The run already existed with the same units; its frozen budgets are
    /// returned (they win over the caller's).
    AlreadyInitialized {
        /// The budgets in force.
        budgets: Budgets,
    },
}

/// Per-unit retry state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UnitState {
    /// Requeues so far.
    pub retry_index: u32,
    /// Reclaims so far.
    pub reclaim_count: u32,
    /// Whether the unit has been requeued at least once (counted against tolerance).
    pub entered_retry: bool,
    /// Whether it is quarantined ([`UnitSpec::quarantined`]): its failures do
    /// not count toward the failure limit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quarantined: bool,
}

/// How a delivery reached its worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryOrigin {
    /// Read from the priority or main stream.
    Fresh,
    /// Taken over from an idle worker.
    Reclaimed {
        /// The worker that held it, when known.
        previous_worker: Option<WorkerId>,
    },
}

/// A unit handed to a worker: the handle every later transition is fenced by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The unit.
    pub unit: UnitId,
    /// Its kind label.
    pub kind: String,
    /// The stream it is pending on.
    pub stream: StreamName,
    /// Its entry on that stream.
    pub entry_id: EntryId,
    /// Deliveries of this entry so far (the fence's second half).
    pub delivery_count: u32,
    /// The unit's retry index.
    pub retry_index: u32,
    /// The unit's reclaim count.
    pub reclaim_count: u32,
    /// How it got here.
    pub origin: DeliveryOrigin,
}

impl Delivery {
    /// `1 + retry_index + reclaim_count`.
    pub fn ownership_generation(&self) -> u32 {
        1 + self.retry_index + self.reclaim_count
    }
}

/// The reply of [`UnitQueue::reserve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveReply {
    /// `OK`: a unit for the caller.
    Delivered(Delivery),
    /// `FINALIZED`: an idle unit was over its reclaim budget and was finalized
    /// as failed (`reclaim_budget_exhausted`). Call `reserve` again.
    ReclaimExhausted {
        /// The unit.
        unit: UnitId,
    },
    /// `NONE`: nothing to hand out now (units may still be in flight).
    None,
    /// `STOPPED`: the run has reached its failure limit; nothing more will
    /// be handed out. Let running units finish, then stop.
    Stopped,
    /// `CORRUPT`: the run's meta or a unit's state is missing.
    Corrupt,
}

impl ReserveReply {
    /// The wire status.
    pub fn status(&self) -> Status {
        match self {
            ReserveReply::Delivered(_) => Status::Ok,
            ReserveReply::ReclaimExhausted { .. } => Status::Finalized,
            ReserveReply::None => Status::None,
            ReserveReply::Stopped => Status::Stopped,
            ReserveReply::Corrupt => Status::Corrupt,
        }
    }
}

/// What [`UnitQueue::reserve_batch`] handed out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReserveBatch {
    /// Units for the caller, in delivery order.
    pub deliveries: Vec<Delivery>,
    /// Units finalized on the way because their reclaim budget ran out.
    pub exhausted: Vec<UnitId>,
    /// Whether a `CORRUPT` reply ended the batch.
    pub corrupt: bool,
    /// Whether a `STOPPED` reply ended the batch (the run reached its failure limit).
    pub stopped: bool,
}

/// The reply of heartbeat, finalize, abandon and release: `OK`, `STALE` or `CORRUPT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ack {
    /// Applied.
    Ok,
    /// The fence failed: the caller no longer owns the delivery. Drop the result.
    Stale,
    /// The run's meta or the unit's state is missing.
    Corrupt,
}

impl Ack {
    /// The wire status.
    pub fn status(self) -> Status {
        match self {
            Ack::Ok => Status::Ok,
            Ack::Stale => Status::Stale,
            Ack::Corrupt => Status::Corrupt,
        }
    }
}

/// The reply of [`UnitQueue::heartbeat`].
pub type HeartbeatReply = Ack;
/// The reply of [`UnitQueue::finalize`].
pub type FinalizeReply = Ack;
/// The reply of [`UnitQueue::abandon`].
pub type AbandonReply = Ack;
/// The reply of [`UnitQueue::release`].
pub type ReleaseReply = Ack;

/// The reply of [`UnitQueue::liveness`]: `OK` or `CORRUPT` (no run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LivenessReply {
    /// Recorded.
    Ok,
    /// The run's meta is missing.
    Corrupt,
}

/// The reply of [`UnitQueue::requeue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequeueReply {
    /// `REQUEUED`: the unit is on the priority stream with this new retry index.
    Requeued {
        /// The unit's retry index now.
        retry_index: u32,
    },
    /// `FINALIZED`: a budget ran out; the unit failed (`retry_budget_exhausted`).
    Finalized {
        /// The unit's retry index (unchanged).
        retry_index: u32,
    },
    /// The fence failed. Nothing changed.
    Stale,
    /// The run's meta or the unit's state is missing.
    Corrupt,
}

impl RequeueReply {
    /// The wire status.
    pub fn status(self) -> Status {
        match self {
            RequeueReply::Requeued { .. } => Status::Requeued,
            RequeueReply::Finalized { .. } => Status::Finalized,
            RequeueReply::Stale => Status::Stale,
            RequeueReply::Corrupt => Status::Corrupt,
        }
    }
}

/// A unit's final outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// It passed.
    Passed,
    /// It failed.
    Failed,
    /// It was skipped.
    Skipped,
}

impl Outcome {
    /// `passed`, `failed` or `skipped`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Failed => "failed",
            Outcome::Skipped => "skipped",
        }
    }
}

/// Why a unit was finalized, when it is not simply its result.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FinalizeReason {
    /// A requeue was refused by the per-unit cap or the run's tolerance.
    RetryBudgetExhausted,
    /// A reclaim was refused by `max_reclaims`.
    ReclaimBudgetExhausted,
    /// The attempt ran over its time limit.
    Timeout,
    /// Anything else the worker says.
    Other(String),
}

impl FinalizeReason {
    /// The stored name.
    pub fn as_str(&self) -> &str {
        match self {
            FinalizeReason::RetryBudgetExhausted => "retry_budget_exhausted",
            FinalizeReason::ReclaimBudgetExhausted => "reclaim_budget_exhausted",
            FinalizeReason::Timeout => "timeout",
            FinalizeReason::Other(s) => s,
        }
    }
}

impl From<&str> for FinalizeReason {
    fn from(s: &str) -> Self {
        match s {
            "retry_budget_exhausted" => FinalizeReason::RetryBudgetExhausted,
            "reclaim_budget_exhausted" => FinalizeReason::ReclaimBudgetExhausted,
            "timeout" => FinalizeReason::Timeout,
            other => FinalizeReason::Other(other.to_owned()),
        }
    }
}

impl fmt::Display for FinalizeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for FinalizeReason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for FinalizeReason {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Ok(FinalizeReason::from(&*s))
    }
}

fn check_text(what: &'static str, text: Option<&str>, max: usize) -> Result<(), SpecError> {
    match text {
        Some(t) if t.len() > max => Err(SpecError::TextTooLong { what, len: t.len(), max }),
        _ => Ok(()),
    }
}

fn check_errors(errors: Option<&serde_json::Value>) -> Result<(), SpecError> {
    if let Some(value) = errors {
        let len = serde_json::to_string(value).map(|s| s.len()).unwrap_or(usize::MAX);
        if len > MAX_ERRORS_LEN {
            return Err(SpecError::TextTooLong { what: "errors payload", len, max: MAX_ERRORS_LEN });
        }
    }
    Ok(())
}

/// The result a worker reports for a delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct FinalizeRequest {
    /// The outcome.
    pub outcome: Outcome,
    /// How long the attempt ran.
    pub duration_ms: u64,
    /// Why, when not a plain result (e.g. [`FinalizeReason::Timeout`]).
    pub reason: Option<FinalizeReason>,
    /// Structured error details (at most 1 MiB of JSON).
    pub errors: Option<serde_json::Value>,
    /// Which of the worker's slots ran the attempt (the worker's own
    /// numbering), kept in the [`Event::Finalized`](crate::Event::Finalized)
    /// event so that a report can draw each attempt where it ran. The queue
    /// only records it.
    pub slot: Option<u32>,
}

impl FinalizeRequest {
    /// A plain outcome with its duration.
    pub fn new(outcome: Outcome, duration_ms: u64) -> Self {
        Self { outcome, duration_ms, reason: None, errors: None, slot: None }
    }

    /// The same request, run on the worker's slot `slot`.
    pub fn on_slot(self, slot: u32) -> Self {
        Self { slot: Some(slot), ..self }
    }

    /// Checks the sizes of the free-form fields.
    pub fn validate(&self) -> Result<(), SpecError> {
        if let Some(FinalizeReason::Other(s)) = &self.reason {
            check_text("finalize reason", Some(s), MAX_KIND_LEN)?;
        }
        check_errors(self.errors.as_ref())
    }
}

/// A failed attempt a worker wants retried.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RequeueRequest {
    /// How long the failed attempt ran.
    pub duration_ms: u64,
    /// A short description of the failure (at most 64 KiB).
    pub failure_summary: Option<String>,
    /// Structured error details (at most 1 MiB of JSON).
    pub errors: Option<serde_json::Value>,
    /// Retry on another worker: the retry is not handed to the requeueing
    /// worker while another live worker may take it (see the contract,
    /// "Retry elsewhere"). `false` lets anyone take it, the caller included.
    pub retry_elsewhere: bool,
    /// Which of the worker's slots ran the failed attempt, kept in the
    /// [`Event::Requeued`](crate::Event::Requeued) event (or the
    /// [`Event::Finalized`](crate::Event::Finalized) one over the budget),
    /// as [`FinalizeRequest::slot`].
    pub slot: Option<u32>,
}

impl RequeueRequest {
    /// Checks the sizes of the free-form fields.
    pub fn validate(&self) -> Result<(), SpecError> {
        check_text("failure summary", self.failure_summary.as_deref(), MAX_SUMMARY_LEN)?;
        check_errors(self.errors.as_ref())
    }
}

/// Counters of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Progress {
    /// Units in the run.
    pub total: u64,
    /// Units finalized.
    pub finalized: u64,
    /// Distinct units requeued at least once.
    pub requeued_units: u64,
    /// Deliveries pending on a worker.
    pub in_flight: u64,
    /// Entries not yet delivered (main and priority streams).
    pub queued: u64,
    /// Units finalized as failed (failed for good), whichever transition did
    /// it, quarantined units not counted: the count the failure limit reads.
    #[serde(default)]
    pub failed: u64,
    /// Whether the run reached its failure limit ([`Budgets::max_failures`]),
    /// so `reserve` replies `STOPPED`.
    #[serde(default)]
    pub stopped: bool,
}

impl Progress {
    /// Whether the run is over: every unit has been finalized, or the run
    /// has stopped at its failure limit and nothing is in flight any more
    /// (the units left will never run).
    pub fn is_complete(&self) -> bool {
        self.finalized >= self.total || (self.stopped && self.in_flight == 0)
    }

    /// Units that will not run because the run stopped: 0 unless stopped.
    pub fn not_run(&self) -> u64 {
        if self.stopped {
            self.total.saturating_sub(self.finalized + self.in_flight)
        } else {
            0
        }
    }
}

/// A worker's record in a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// The worker.
    pub worker: WorkerId,
    /// Its last transition (milliseconds since the Unix epoch, store's clock).
    pub last_seen_ms: u64,
    /// The unit it said it is working on.
    pub current_unit: Option<UnitId>,
    /// Units it finished (finalized or requeued).
    pub processed: u64,
    /// Whether it said it has left the run ([`UnitQueue::leave`]) and has
    /// made no transition since.
    #[serde(default)]
    pub left: bool,
}

impl WorkerRecord {
    /// Whether the worker counts as live at `now_ms` (store's clock) for a
    /// liveness window of `window_ms`: it has not left, and its last
    /// transition is at most `window_ms` old.
    pub fn is_live(&self, now_ms: u64, window_ms: u64) -> bool {
        !self.left && now_ms.saturating_sub(self.last_seen_ms) <= window_ms
    }
}

/// A delivery pending on a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingDelivery {
    /// The unit.
    pub unit: UnitId,
    /// Its stream.
    pub stream: StreamName,
    /// Its entry.
    pub entry_id: EntryId,
    /// The worker holding it.
    pub worker: WorkerId,
    /// Milliseconds since its last delivery or heartbeat.
    pub idle_ms: u64,
    /// Deliveries of the entry so far.
    pub delivery_count: u32,
}

/// Checks a worker error message (see [`UnitQueue::record_worker_error`]):
/// at most [`MAX_SUMMARY_LEN`] bytes.
pub fn check_worker_error_message(message: &str) -> Result<(), SpecError> {
    check_text("worker error message", Some(message), MAX_SUMMARY_LEN)
}

/// The fenced unit queue of a run.
///
/// # Contract
///
/// A run is made by [`UnitQueue::initialize`] and lives until it has seen no
/// successful transition for its inactivity TTL. Workers loop:
/// `reserve` → run the unit (calling `heartbeat` more often than the reclaim
/// timeout) → `finalize` or `requeue` (or `release` when shutting down, or
/// `abandon` when it cannot be handed back cleanly).
///
/// * Every transition on a delivery is **fenced** by (worker, stream, entry,
///   delivery count): it applies only while that delivery is still pending on
///   that worker with that delivery count. Otherwise the reply is `STALE` and
///   nothing changes; the caller must drop its result (and may record it with
///   [`UnitQueue::record_stale_rejected`]). A delivery whose `unit` is not the
///   unit of its entry is not the caller's either: `STALE`.
/// * A transition on a run whose meta is gone, or on a unit whose state is
///   gone, replies `CORRUPT` and changes nothing.
/// * `reserve` reads the priority stream first, then the main stream, then
///   reclaims the oldest delivery (priority stream first) that has been idle
///   at least `reclaim_after`, whichever worker holds it. A reclaim past the
///   run's `max_reclaims` finalizes the unit as failed
///   (`reclaim_budget_exhausted`) and replies `FINALIZED`.
/// * **Fail fast.** Every transition that finalizes a unit as failed
///   (`finalize` with [`Outcome::Failed`], `requeue` or a reclaim over
///   budget) counts it in the run's `failed` ([`Progress::failed`]), unless
///   the unit is quarantined ([`UnitSpec::quarantined`]). Once
///   `failed` reaches the run's [`Budgets::max_failures`], the run is
///   stopped: `reserve` replies `STOPPED` before reading any stream or
///   reclaiming, changes nothing and appends no event, for every worker,
///   including one that joins later; a batch that reaches the limit midway
///   (a reclaim over budget) ends with `stopped`. Deliveries already handed
///   out are still fenced and finalized as usual. A stopped run with nothing
///   in flight is complete ([`Progress::is_complete`]).
/// * `requeue` puts the unit on the priority stream while
///   `retry_index + 1 <= max_requeues` and, for the unit's first requeue,
///   while fewer than `ceil(total × tolerance)` units have been requeued;
///   otherwise it finalizes the unit as failed (`retry_budget_exhausted`).
/// * `release` hands a delivery back at once: the unit goes to the end of the
///   priority stream as a new entry, with its retry index, reclaim count and
///   tolerance use unchanged. It spends no budget: a unit can be released any
///   number of times. Use it for a unit that was never started (prefetched)
///   or whose attempt was stopped by the worker itself (a signal), not for a
///   failure (that is `requeue`).
/// * **Retry elsewhere.** A `requeue` with
///   [`RequeueRequest::retry_elsewhere`] marks the new priority entry with
///   the requeueing worker and the time. `reserve` does not hand a marked
///   entry to that worker while another worker is live (a worker record
///   other than the caller's that has not [left](UnitQueue::leave) and made
///   a transition within the call's `reclaim_after`) and the entry is younger
///   than `reclaim_after` (a live worker that never reserves cannot hold a
///   retry back for longer). With no other worker live, it still waits
///   until it is [`RETRY_ALONE_AFTER`] old (or `reclaim_after`, when
///   shorter), so that a worker joining a moment later can take it; then
///   the lone worker gets its own retry. Such an entry is moved to the end of the
///   priority stream as a new entry, keeping its mark and time, with no event
///   and no budget spent, and the call goes on with the next entry. One call
///   reads each stream once, for as many entries as it still needs: an entry
///   moved by a call is not read again by that call. A marked entry handed
///   out (to another worker, or to its worker once no other is live) is an
///   ordinary delivery; `release` drops the mark.
/// * **Groups.** A unit of a group ([`UnitSpec::group`]) is handed out
///   fresh only while fewer than the group's limit of its units are pending
///   on workers (handed out and not yet finalized, requeued or released; a
///   dead worker's delivery counts until it is reclaimed, and then for its
///   new owner, so a group never runs more than its limit). An entry of a
///   full group met by `reserve` waits aside (still counted as queued, no
///   event, no budget) and the call goes on with the next entry, so the
///   other units are not held up; each place the group frees (a unit of it
///   finalized, requeued or released) puts the group's oldest waiting entry
///   back at the end of the priority stream, read first. Re-initialising a run with other groups or limits is
///   [`QueueError::UnitListMismatch`]; every unit of one group must carry the
///   same limit ([`SpecError::GroupLimitMismatch`]).
/// * Each unit is finalized exactly once; `finalized` reaches `total` exactly
///   when every unit is done.
/// * Each applied transition appends its event (see [`crate::Event`]) in order
///   and renews the run's inactivity TTL.
/// * Invalid arguments are [`QueueError::Spec`] and change nothing; a run
///   re-initialised with other units is [`QueueError::UnitListMismatch`].
///
/// # Example
///
/// A run of two units with one retry per unit: `a` passes, `b` fails, is
/// requeued once and then, out of retries, finalized as failed. (On the
/// memory backend; a Redis store from `leasehold-redis` replies the same.
/// The program `examples/library/queue_consumer.rs` drains a run with two
/// workers on either, picked from a URL.)
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{
///     Ack, Budgets, FinalizeRequest, InitOutcome, Outcome, RequeueReply, RequeueRequest, ReserveReply, RunId,
///     RunSpec, Ttl, UnitId, UnitQueue, UnitSpec, WorkerId,
/// };
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let queue = leasehold_mem::MemoryStore::new();
/// let run = RunId::new("build-42")?;
/// let spec = RunSpec {
///     run: run.clone(),
///     units: vec![UnitSpec::new(UnitId::new("a")?, "test"), UnitSpec::new(UnitId::new("b")?, "test")],
///     budgets: Budgets { max_requeues: 1, requeue_tolerance: 1.0, max_reclaims: 2, max_failures: None },
///     ttl: Duration::from_secs(3600),
/// };
/// // Every worker initializes; the first makes the run, the others join it.
/// assert_eq!(queue.initialize(&spec).await?, InitOutcome::Initialized);
/// assert!(matches!(queue.initialize(&spec).await?, InitOutcome::AlreadyInitialized { .. }));
///
/// let me = WorkerId::new("worker-1")?;
/// let reclaim_after = Ttl::from_secs(30);
/// let ReserveReply::Delivered(a) = queue.reserve(&run, &me, reclaim_after).await? else { panic!("a is queued") };
/// assert_eq!(queue.heartbeat(&run, &me, &a).await?, Ack::Ok);
/// assert_eq!(queue.finalize(&run, &me, &a, &FinalizeRequest::new(Outcome::Passed, 12)).await?, Ack::Ok);
///
/// let failed = RequeueRequest { duration_ms: 7, failure_summary: Some("assertion failed".into()), ..Default::default() };
/// let ReserveReply::Delivered(b) = queue.reserve(&run, &me, reclaim_after).await? else { panic!("b is queued") };
/// assert_eq!(queue.requeue(&run, &me, &b, &failed).await?, RequeueReply::Requeued { retry_index: 1 });
/// // The first delivery of b is no longer anyone's: it is fenced off.
/// assert_eq!(queue.finalize(&run, &me, &b, &FinalizeRequest::new(Outcome::Passed, 1)).await?, Ack::Stale);
///
/// let ReserveReply::Delivered(retry) = queue.reserve(&run, &me, reclaim_after).await? else { panic!("b again") };
/// assert_eq!(retry.retry_index, 1);
/// // Out of retries: the queue finalizes b as failed (retry_budget_exhausted).
/// assert_eq!(queue.requeue(&run, &me, &retry, &failed).await?, RequeueReply::Finalized { retry_index: 1 });
///
/// assert_eq!(queue.reserve(&run, &me, reclaim_after).await?, ReserveReply::None);
/// assert!(queue.progress(&run).await?.expect("the run exists").is_complete());
/// # Ok(())
/// # }
/// ```
#[async_trait]
pub trait UnitQueue: Send + Sync + 'static {
    /// Creates the run, or confirms it exists with the same units.
    async fn initialize(&self, spec: &RunSpec) -> Result<InitOutcome, QueueError>;

    /// Hands the next unit to `worker` (see the contract for the order).
    async fn reserve(&self, run: &RunId, worker: &WorkerId, reclaim_after: Ttl) -> Result<ReserveReply, QueueError>;

    /// Reserves up to `max` units in one call (a batch for one invocation).
    /// Stops early at `NONE`, `STOPPED` or `CORRUPT`. Backends may do this in one round trip.
    async fn reserve_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        max: NonZeroUsize,
        reclaim_after: Ttl,
    ) -> Result<ReserveBatch, QueueError> {
        let mut batch = ReserveBatch::default();
        while batch.deliveries.len() < max.get() {
            match self.reserve(run, worker, reclaim_after).await? {
                ReserveReply::Delivered(d) => batch.deliveries.push(d),
                ReserveReply::ReclaimExhausted { unit } => batch.exhausted.push(unit),
                ReserveReply::None => break,
                ReserveReply::Stopped => {
                    batch.stopped = true;
                    break;
                }
                ReserveReply::Corrupt => {
                    batch.corrupt = true;
                    break;
                }
            }
        }
        Ok(batch)
    }

    /// Resets the delivery's idle time so it is not reclaimed.
    async fn heartbeat(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
    ) -> Result<HeartbeatReply, QueueError>;

    /// Heartbeats several deliveries of one worker (every unit it holds, once
    /// per heartbeat period): the same replies and state as calling
    /// [`UnitQueue::heartbeat`] for each item in order. Each item is fenced
    /// on its own: one the worker no longer owns is `STALE` and changes
    /// nothing, the others are still renewed; an item repeated in the batch
    /// is renewed each time (`OK` twice). The worker record's current unit
    /// ends as the last renewed item's unit, and is untouched when no item
    /// is renewed. A run that is gone replies `CORRUPT` for every item; an
    /// empty batch replies nothing. Backends may do this in one round trip.
    async fn heartbeat_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        deliveries: &[Delivery],
    ) -> Result<Vec<HeartbeatReply>, QueueError> {
        let mut replies = Vec::with_capacity(deliveries.len());
        for delivery in deliveries {
            replies.push(self.heartbeat(run, worker, delivery).await?);
        }
        Ok(replies)
    }

    /// Records the unit's final outcome.
    async fn finalize(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
        request: &FinalizeRequest,
    ) -> Result<FinalizeReply, QueueError>;

    /// Finalizes several deliveries of one worker: the same replies, events
    /// and state as calling [`UnitQueue::finalize`] for each item in order.
    /// Backends may do this in one round trip.
    async fn finalize_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        items: &[(Delivery, FinalizeRequest)],
    ) -> Result<Vec<FinalizeReply>, QueueError> {
        for (_, request) in items {
            request.validate()?;
        }
        let mut replies = Vec::with_capacity(items.len());
        for (delivery, request) in items {
            replies.push(self.finalize(run, worker, delivery, request).await?);
        }
        Ok(replies)
    }

    /// Asks for another attempt of a failed unit (within the budgets).
    async fn requeue(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
        request: &RequeueRequest,
    ) -> Result<RequeueReply, QueueError>;

    /// Records that the worker gave the delivery up; it stays pending and is
    /// reclaimed by another worker after the reclaim timeout.
    async fn abandon(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
        elapsed_ms: u64,
    ) -> Result<AbandonReply, QueueError>;

    /// Hands the delivery back at once, without spending a budget: the unit
    /// is put on the priority stream as a new entry (retry index, reclaim
    /// count and tolerance use unchanged), a `released` event is appended and
    /// the worker record's current unit is cleared (`processed` is not
    /// counted). Fenced like every transition: `STALE` when the caller no
    /// longer owns the delivery (a second release of it included).
    async fn release(&self, run: &RunId, worker: &WorkerId, delivery: &Delivery) -> Result<ReleaseReply, QueueError>;

    /// Releases several deliveries of one worker (a prefetch handed back):
    /// the same replies, events and state as calling [`UnitQueue::release`]
    /// for each in order. Backends may do this in one round trip.
    async fn release_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        deliveries: &[Delivery],
    ) -> Result<Vec<ReleaseReply>, QueueError> {
        let mut replies = Vec::with_capacity(deliveries.len());
        for delivery in deliveries {
            replies.push(self.release(run, worker, delivery).await?);
        }
        Ok(replies)
    }

    /// Refreshes the worker's record (and says what it is working on).
    async fn liveness(
        &self,
        run: &RunId,
        worker: &WorkerId,
        current_unit: Option<&UnitId>,
    ) -> Result<LivenessReply, QueueError>;

    /// Says the worker will make no more transitions in the run (it is done,
    /// or shutting down): from now on it does not count as live for retry
    /// placement (see "Retry elsewhere" in the contract), so a retry it
    /// failed goes back to a worker still running without waiting. The
    /// record's current unit is cleared; any later transition of the worker
    /// makes it live again. Appends no event; renews the run's TTL. `CORRUPT`
    /// when the run does not exist.
    async fn leave(&self, run: &RunId, worker: &WorkerId) -> Result<LivenessReply, QueueError>;

    /// Appends a `worker_error` event. Not fenced; needs no meta.
    async fn record_worker_error(
        &self,
        run: &RunId,
        worker: &WorkerId,
        unit: Option<&UnitId>,
        message: &str,
    ) -> Result<(), QueueError>;

    /// Appends a `stale_rejected` event for a transition that replied `STALE`.
    /// Not fenced; needs no meta.
    async fn record_stale_rejected(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
        transition: &str,
    ) -> Result<(), QueueError>;

    /// The run's counters; `None` when the run does not exist.
    async fn progress(&self, run: &RunId) -> Result<Option<Progress>, QueueError>;

    /// The run's frozen budgets; `None` when the run does not exist.
    async fn budgets(&self, run: &RunId) -> Result<Option<Budgets>, QueueError>;

    /// The run's units in their initial order (empty when the run does not exist).
    async fn units(&self, run: &RunId) -> Result<Vec<UnitSpec>, QueueError>;

    /// A unit's retry state; `None` when the run or unit does not exist.
    async fn unit_state(&self, run: &RunId, unit: &UnitId) -> Result<Option<UnitState>, QueueError>;

    /// Up to `limit` events after `after` (from the start when `None`), in order.
    async fn events(&self, run: &RunId, after: Option<EventId>, limit: usize) -> Result<Vec<EventRecord>, QueueError>;

    /// Waits until the run's event log holds an event after `after`, or
    /// until `timeout` has passed, and returns the id of the newest event
    /// it saw (`after` when none came in time). With `after` = `None` it
    /// waits for an event appended after the call began.
    ///
    /// Every transition that changes a run appends an event (a delivery, a
    /// finalize, a requeue, a release), so this is how a waiting worker
    /// hears that there may be work, or that the run completed, without
    /// polling. It is a wake-up, not a read: callers read what they need
    /// afterwards, and bound every wait, since a change that appends no
    /// event (a unit held back for another worker becoming free to all)
    /// wakes nobody. It returns at once when `after` is older than the
    /// newest event, and does not fail for a run that does not exist (it
    /// waits for the run's first event).
    async fn wait_for_events(
        &self,
        run: &RunId,
        after: Option<EventId>,
        timeout: Duration,
    ) -> Result<Option<EventId>, QueueError>;

    /// The run's worker records, sorted by worker id.
    async fn workers(&self, run: &RunId) -> Result<Vec<WorkerRecord>, QueueError>;

    /// Deliveries pending on workers, in entry order (priority stream first).
    async fn pending(&self, run: &RunId) -> Result<Vec<PendingDelivery>, QueueError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(units: &[&str]) -> RunSpec {
        RunSpec {
            run: RunId::new("r").unwrap(),
            units: units.iter().map(|u| UnitSpec::new(UnitId::new(*u).unwrap(), "file")).collect(),
            budgets: Budgets::default(),
            ttl: Duration::from_secs(60),
        }
    }

    #[test]
    fn tolerance_cap_uses_the_seed_epsilon() {
        let b = Budgets { max_requeues: 1, requeue_tolerance: 0.7, max_reclaims: 1, max_failures: None };
        assert_eq!(b.max_requeued_units(100), 70);
        assert_eq!(b.max_requeued_units(3), 3); // ceil(2.1)
        let zero = Budgets { requeue_tolerance: 0.0, ..b };
        assert_eq!(zero.max_requeued_units(100), 0);
    }

    #[test]
    fn validation_rejects_bad_specs() {
        assert!(matches!(spec(&[]).validate(), Err(SpecError::NoUnits { .. })));
        assert!(matches!(spec(&["a", "a"]).validate(), Err(SpecError::DuplicateUnit { .. })));
        let mut s = spec(&["a"]);
        s.budgets.requeue_tolerance = f64::NAN;
        assert!(matches!(s.validate(), Err(SpecError::BadTolerance { .. })));
        s.budgets.requeue_tolerance = -0.1;
        assert!(matches!(s.validate(), Err(SpecError::BadTolerance { .. })));
        let mut s = spec(&["a"]);
        s.ttl = Duration::ZERO;
        assert!(matches!(s.validate(), Err(SpecError::ZeroTtl { .. })));
        assert!(spec(&["a", "b"]).validate().is_ok());
    }

    #[test]
    fn fingerprint_ignores_order_but_not_content() {
        assert_eq!(spec(&["a", "b"]).fingerprint(), spec(&["b", "a"]).fingerprint());
        assert_ne!(spec(&["a", "b"]).fingerprint(), spec(&["a", "c"]).fingerprint());
        assert_ne!(spec(&["ab"]).fingerprint(), spec(&["a", "b"]).fingerprint());
        let kinds = |a: &str, b: &str| RunSpec {
            units: vec![UnitSpec::new(UnitId::new("u").unwrap(), a), UnitSpec::new(UnitId::new("v").unwrap(), b)],
            ..spec(&["x"])
        };
        assert_ne!(kinds("ab", "").fingerprint(), kinds("a", "b").fingerprint());
        assert_eq!(spec(&["a"]).fingerprint().len(), 64, "a SHA-256 in hex");
    }

    #[test]
    fn finalize_reasons_round_trip() {
        for r in ["retry_budget_exhausted", "reclaim_budget_exhausted", "timeout", "crashed"] {
            assert_eq!(FinalizeReason::from(r).as_str(), r);
        }
    }
}
