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
use crate::ids::{EntryId, RunId, UnitId, WorkerId};
use crate::run_log::RunLog;
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

impl ReserveReply {
    /// The reply of [`UnitQueue::reserve`] for what a reserve call with
    /// [`ReserveLimit::FirstItem`] handed out: its one delivery
    /// ([`ReserveReply::Delivered`]) or its one unit finalized over its
    /// reclaim budget ([`ReserveReply::ReclaimExhausted`], whatever else the
    /// batch says: a `stopped` after it is the next call's reply); with no
    /// item, [`ReserveReply::Corrupt`] when the batch ended `corrupt`, else
    /// [`ReserveReply::Stopped`] when it ended `stopped`, else
    /// [`ReserveReply::None`]. A batch of more than one item is not a
    /// reply of that call: [`QueueError::Corrupt`].
    pub fn from_first_item(run: &RunId, batch: ReserveBatch) -> Result<ReserveReply, QueueError> {
        let ReserveBatch { mut deliveries, mut exhausted, corrupt, stopped } = batch;
        match (deliveries.len(), exhausted.len()) {
            (1, 0) => Ok(deliveries.pop().map_or(ReserveReply::None, ReserveReply::Delivered)),
            (0, 1) => Ok(exhausted.pop().map_or(ReserveReply::None, |unit| ReserveReply::ReclaimExhausted { unit })),
            (0, 0) if corrupt => Ok(ReserveReply::Corrupt),
            (0, 0) if stopped => Ok(ReserveReply::Stopped),
            (0, 0) => Ok(ReserveReply::None),
            (delivered, finalized) => Err(QueueError::Corrupt {
                run: run.clone(),
                detail: format!(
                    "reserve: the backend handed out {delivered} unit(s) and finalized {finalized} over their reclaim budget in a call limited to its first item"
                ),
            }),
        }
    }
}

/// Where one reserve call ends: the limit of [`UnitQueue::reserve_up_to`],
/// the one reserve every backend implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReserveLimit {
    /// After this many units handed out (or earlier, at `NONE`, `STOPPED`
    /// or `CORRUPT`). Units finalized on the way because their reclaim
    /// budget ran out do not count: the call goes on reclaiming after
    /// them. What [`UnitQueue::reserve_batch`] asks for.
    Deliveries(NonZeroUsize),
    /// After the call's first item, whichever it is: one unit handed out,
    /// or one unit finalized over its reclaim budget (or earlier, at
    /// `NONE`, `STOPPED` or `CORRUPT`). What [`UnitQueue::reserve`] asks
    /// for: its reply holds one item, so a call that went on reclaiming
    /// after an exhausted unit would finalize units its caller never hears
    /// of.
    FirstItem,
}

impl ReserveLimit {
    /// The most units the call may hand out.
    pub fn max_deliveries(self) -> NonZeroUsize {
        match self {
            ReserveLimit::Deliveries(max) => max,
            ReserveLimit::FirstItem => NonZeroUsize::MIN,
        }
    }

    /// Whether a unit finalized over its reclaim budget ends the call.
    pub fn ends_at_exhausted(self) -> bool {
        matches!(self, ReserveLimit::FirstItem)
    }
}

/// What [`UnitQueue::reserve_batch`] (or [`UnitQueue::reserve_up_to`]) handed out.
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
///   a transition within the call's `reclaim_after`), however long the entry
///   has waited: a live worker whose slots are all in long tests takes it
///   at its next reserve, and one that dies stops being live within
///   `reclaim_after`. With no other worker live, it still waits
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
/// # Batch forms and single forms
///
/// A worker moves several units at once (a batch per invocation, every unit
/// it holds per heartbeat), so the general forms are the ones a backend
/// implements, and the single forms are conveniences built on them (as
/// sqlx's `Executor` requires its general methods and provides the rest):
///
/// | required                       | provided                       |
/// |--------------------------------|--------------------------------|
/// | [`UnitQueue::reserve_up_to`]   | [`UnitQueue::reserve_batch`] ([`ReserveLimit::Deliveries`]), [`UnitQueue::reserve`] ([`ReserveLimit::FirstItem`]) |
/// | [`UnitQueue::heartbeat_batch`] | [`UnitQueue::heartbeat`]       |
/// | [`UnitQueue::finalize_batch`]  | [`UnitQueue::finalize`]        |
/// | [`UnitQueue::release_batch`]   | [`UnitQueue::release`]         |
///
/// `heartbeat_batch`, `finalize_batch` and `release_batch` reply for each
/// item, in order, what its single form would; each single form is a batch
/// of one item, and a backend whose batch replies another count for one
/// item fails it with [`QueueError::Corrupt`]. `reserve` is not a batch of one delivery
/// ([`UnitQueue::reserve_batch`] with `max` 1 goes on reclaiming past units
/// finalized over their reclaim budget) but a call that ends at its first
/// item of either kind, hence [`ReserveLimit`]. A backend may still
/// override a provided form when its own is cheaper; it must reply the
/// same. `initialize`, `requeue`, `abandon`, `liveness`, `leave` and the
/// unfenced records have no batch form.
///
/// Every queue is a [`RunLog`] too: the reads (counters, units, events,
/// workers, pending deliveries) are that trait's, and code that only reads
/// a run takes a `RunLog`.
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
///     RunLog, RunSpec, Ttl, UnitId, UnitQueue, UnitSpec, WorkerId,
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
pub trait UnitQueue: RunLog {
    /// Creates the run, or confirms it exists with the same units.
    async fn initialize(&self, spec: &RunSpec) -> Result<InitOutcome, QueueError>;

    /// Hands units to `worker` in one call, until `limit` is reached: the
    /// one reserve every backend implements, behind
    /// [`UnitQueue::reserve_batch`] and [`UnitQueue::reserve`] (callers use
    /// those two).
    ///
    /// The call reads the priority stream, then the main stream (each
    /// stream once, for as many entries as it still needs), then reclaims
    /// the oldest delivery idle for at least `reclaim_after` (priority
    /// stream first), whichever worker holds it, until it has handed out
    /// [`ReserveLimit::max_deliveries`] units (see the contract for the
    /// order, retries held back for another worker and groups). A delivery
    /// it hands out is in [`ReserveBatch::deliveries`], in delivery order,
    /// and appends a `delivered` (or `reclaimed`) event. A reclaim past
    /// the run's `max_reclaims` finalizes that unit as failed
    /// (`reclaim_budget_exhausted`, a `finalized` event) and puts it in
    /// [`ReserveBatch::exhausted`]; it does not count as a delivery, and
    /// it ends the call when `limit` is [`ReserveLimit::FirstItem`]. The
    /// call ends early when nothing more can be handed out now (`NONE`:
    /// units may still be in flight), when the run is stopped at its
    /// failure limit ([`ReserveBatch::stopped`]: before reading anything,
    /// or after the reclaim over budget that reached the limit) and when
    /// the run's meta or a unit's state is missing
    /// ([`ReserveBatch::corrupt`]; nothing is handed out by the step that
    /// met it). Backends may do this in one round trip.
    async fn reserve_up_to(
        &self,
        run: &RunId,
        worker: &WorkerId,
        limit: ReserveLimit,
        reclaim_after: Ttl,
    ) -> Result<ReserveBatch, QueueError>;

    /// Reserves up to `max` units in one call (a batch for one invocation).
    /// Stops early at `NONE`, `STOPPED` or `CORRUPT`; units finalized on the
    /// way because their reclaim budget ran out are in
    /// [`ReserveBatch::exhausted`] and do not count toward `max`.
    ///
    /// Provided: [`UnitQueue::reserve_up_to`] with
    /// [`ReserveLimit::Deliveries`]. Backends may do this in one round trip.
    async fn reserve_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        max: NonZeroUsize,
        reclaim_after: Ttl,
    ) -> Result<ReserveBatch, QueueError> {
        self.reserve_up_to(run, worker, ReserveLimit::Deliveries(max), reclaim_after).await
    }

    /// Hands the next unit to `worker` (see the contract for the order):
    /// [`ReserveReply::Delivered`] with the handle every later transition
    /// of it is fenced by; [`ReserveReply::ReclaimExhausted`] when the idle
    /// unit it reclaimed was over its reclaim budget and was finalized as
    /// failed instead (one such unit per call: call `reserve` again);
    /// [`ReserveReply::None`] when there is nothing to hand out now;
    /// [`ReserveReply::Stopped`] when the run has reached its failure limit
    /// (let running units finish, then stop); [`ReserveReply::Corrupt`]
    /// when the run's meta or a unit's state is missing.
    ///
    /// Provided: [`UnitQueue::reserve_up_to`] with
    /// [`ReserveLimit::FirstItem`], its one item (or none) mapped to the
    /// reply by [`ReserveReply::from_first_item`]. A batch of more than one
    /// item is a [`QueueError::Corrupt`].
    async fn reserve(&self, run: &RunId, worker: &WorkerId, reclaim_after: Ttl) -> Result<ReserveReply, QueueError> {
        let batch = self.reserve_up_to(run, worker, ReserveLimit::FirstItem, reclaim_after).await?;
        ReserveReply::from_first_item(run, batch)
    }

    /// Heartbeats several deliveries of one worker (every unit it holds, once
    /// per heartbeat period): each item's idle time is reset, so it is not
    /// reclaimed. The replies are one per item, in order, with the same
    /// state as heartbeating the items one after another. Each item is
    /// fenced on its own: one the worker no longer owns is `STALE` and
    /// changes nothing, the others are still renewed (`OK`); an item
    /// repeated in the batch is renewed each time (`OK` twice). A renewal
    /// keeps the delivery count (the handle stays valid) and appends no
    /// event. The worker record's current unit ends as the last renewed
    /// item's unit, and is untouched when no item is renewed. A run that
    /// is gone replies `CORRUPT` for every item; an empty batch replies
    /// nothing. Backends may do this in one round trip.
    async fn heartbeat_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        deliveries: &[Delivery],
    ) -> Result<Vec<HeartbeatReply>, QueueError>;

    /// Resets the delivery's idle time so it is not reclaimed: `OK` (the
    /// worker record's current unit is now this unit; no event), `STALE`
    /// when the caller no longer owns it (nothing changed) or `CORRUPT`
    /// when the run is gone. Call it more often than the reclaim timeout.
    ///
    /// Provided: [`UnitQueue::heartbeat_batch`] of this one delivery; a
    /// reply that is not exactly one status is a [`QueueError::Corrupt`].
    async fn heartbeat(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
    ) -> Result<HeartbeatReply, QueueError> {
        let replies = self.heartbeat_batch(run, worker, std::slice::from_ref(delivery)).await?;
        only_reply("heartbeat", run, replies)
    }

    /// Records the final outcome of several deliveries of one worker: one
    /// reply per item, in order, with the same events and state as
    /// finalizing them one after another. Each item is fenced on its own:
    /// `OK` records the item's outcome (a `finalized` event, the unit
    /// counted in `finalized` and, when it failed and is not quarantined,
    /// in `failed`; the worker record's current unit is cleared and its
    /// `processed` counted); `STALE` when the caller no longer owns the
    /// delivery (a second finalize of it included) changes nothing;
    /// `CORRUPT` when the run or the unit's state is gone. Every request is
    /// checked first ([`FinalizeRequest::validate`]): one that is invalid
    /// fails the whole call with [`QueueError::Spec`] and nothing is
    /// changed. An empty batch replies nothing. Backends may do this in one
    /// round trip.
    async fn finalize_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        items: &[(Delivery, FinalizeRequest)],
    ) -> Result<Vec<FinalizeReply>, QueueError>;

    /// Records the unit's final outcome: `OK`, `STALE` (the caller no
    /// longer owns the delivery: drop the result; nothing changed) or
    /// `CORRUPT`, as one item of [`UnitQueue::finalize_batch`]. An invalid
    /// request is [`QueueError::Spec`] and changes nothing.
    ///
    /// Provided: [`UnitQueue::finalize_batch`] of this one item (the
    /// request is cloned into it); a reply that is not exactly one status
    /// is a [`QueueError::Corrupt`].
    async fn finalize(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
        request: &FinalizeRequest,
    ) -> Result<FinalizeReply, QueueError> {
        let items = [(delivery.clone(), request.clone())];
        let replies = self.finalize_batch(run, worker, &items).await?;
        only_reply("finalize", run, replies)
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

    /// Hands several deliveries of one worker back at once (a prefetch
    /// handed back), without spending a budget: one reply per item, in
    /// order, with the same events and state as releasing them one after
    /// another. Each item is fenced on its own: `OK` puts the unit on the
    /// priority stream as a new entry (retry index, reclaim count and
    /// tolerance use unchanged), appends a `released` event and clears the
    /// worker record's current unit (`processed` is not counted); `STALE`
    /// when the caller no longer owns the delivery (a second release of it,
    /// in this batch or an earlier call, included) changes nothing;
    /// `CORRUPT` when the run is gone. An empty batch replies nothing.
    /// Backends may do this in one round trip.
    async fn release_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        deliveries: &[Delivery],
    ) -> Result<Vec<ReleaseReply>, QueueError>;

    /// Hands the delivery back at once, without spending a budget: the unit
    /// is put on the priority stream as a new entry (retry index, reclaim
    /// count and tolerance use unchanged), a `released` event is appended and
    /// the worker record's current unit is cleared (`processed` is not
    /// counted). Fenced like every transition: `STALE` when the caller no
    /// longer owns the delivery (a second release of it included).
    ///
    /// Provided: [`UnitQueue::release_batch`] of this one delivery; a reply
    /// that is not exactly one status is a [`QueueError::Corrupt`].
    async fn release(&self, run: &RunId, worker: &WorkerId, delivery: &Delivery) -> Result<ReleaseReply, QueueError> {
        let replies = self.release_batch(run, worker, std::slice::from_ref(delivery)).await?;
        only_reply("release", run, replies)
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
}

/// The one reply of a batch of one item, or [`QueueError::Corrupt`] when
/// the backend replied another count (a provided single form's check).
fn only_reply<T>(op: &'static str, run: &RunId, replies: Vec<T>) -> Result<T, QueueError> {
    let count = replies.len();
    let mut replies = replies.into_iter();
    match (replies.next(), replies.next()) {
        (Some(reply), None) => Ok(reply),
        _ => Err(QueueError::Corrupt {
            run: run.clone(),
            detail: format!("{op}: the backend replied {count} statuses for a batch of one delivery"),
        }),
    }
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

    fn delivery(unit: &str) -> Delivery {
        Delivery {
            unit: UnitId::new(unit).unwrap(),
            kind: "file".into(),
            stream: StreamName::Main,
            entry_id: EntryId::new(1, 0),
            delivery_count: 1,
            retry_index: 0,
            reclaim_count: 0,
            origin: DeliveryOrigin::Fresh,
        }
    }

    #[test]
    fn a_first_item_batch_maps_to_the_reserve_reply_the_backends_gave() {
        let run = RunId::new("r").unwrap();
        let reply = |batch| ReserveReply::from_first_item(&run, batch).unwrap();
        let a = UnitId::new("a").unwrap();
        let one = ReserveBatch { deliveries: vec![delivery("a")], ..ReserveBatch::default() };
        assert_eq!(reply(one), ReserveReply::Delivered(delivery("a")));
        let exhausted = ReserveBatch { exhausted: vec![a.clone()], ..ReserveBatch::default() };
        assert_eq!(reply(exhausted.clone()), ReserveReply::ReclaimExhausted { unit: a.clone() });
        // The failure that stopped the run is this call's item; STOPPED is the next call's reply.
        let stopping = ReserveBatch { stopped: true, ..exhausted };
        assert_eq!(reply(stopping), ReserveReply::ReclaimExhausted { unit: a.clone() });
        assert_eq!(reply(ReserveBatch { corrupt: true, ..ReserveBatch::default() }), ReserveReply::Corrupt);
        assert_eq!(reply(ReserveBatch { stopped: true, ..ReserveBatch::default() }), ReserveReply::Stopped);
        assert_eq!(reply(ReserveBatch::default()), ReserveReply::None);
        for wrong in [
            ReserveBatch { deliveries: vec![delivery("a"), delivery("b")], ..ReserveBatch::default() },
            ReserveBatch { deliveries: vec![delivery("b")], exhausted: vec![a.clone()], ..ReserveBatch::default() },
            ReserveBatch { exhausted: vec![a.clone(), a.clone()], ..ReserveBatch::default() },
        ] {
            let error = ReserveReply::from_first_item(&run, wrong).unwrap_err();
            assert!(matches!(error, QueueError::Corrupt { .. }), "{error}");
        }
    }

    #[test]
    fn a_batch_of_one_must_reply_once() {
        let run = RunId::new("r").unwrap();
        assert_eq!(only_reply("heartbeat", &run, vec![Ack::Stale]).unwrap(), Ack::Stale);
        for wrong in [vec![], vec![Ack::Ok, Ack::Ok]] {
            let error = only_reply("finalize", &run, wrong).unwrap_err();
            assert!(
                matches!(&error, QueueError::Corrupt { detail, .. } if detail.starts_with("finalize: ")),
                "{error}"
            );
        }
    }

    #[test]
    fn reserve_limits_say_how_far_a_call_goes() {
        let three = NonZeroUsize::new(3).unwrap();
        assert_eq!(ReserveLimit::Deliveries(three).max_deliveries(), three);
        assert!(!ReserveLimit::Deliveries(NonZeroUsize::MIN).ends_at_exhausted());
        assert_eq!(ReserveLimit::FirstItem.max_deliveries(), NonZeroUsize::MIN);
        assert!(ReserveLimit::FirstItem.ends_at_exhausted());
    }

    #[test]
    fn finalize_reasons_round_trip() {
        for r in ["retry_budget_exhausted", "reclaim_budget_exhausted", "timeout", "crashed"] {
            assert_eq!(FinalizeReason::from(r).as_str(), r);
        }
    }
}
