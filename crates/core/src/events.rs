//! The run's append-only event log.
//!
//! Events serialise to the seed's JSON shape: a `type` tag and flat fields,
//! unit events sharing the [`UnitEventHeader`] fields.

use serde::{Deserialize, Serialize};

use crate::ids::{EntryId, UnitId, WorkerId};
use crate::queue::{FinalizeReason, Outcome, StreamName};

/// The position of an event in the log (ordered; values differ per backend).
pub type EventId = EntryId;

/// One event with its position in the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// Position in the log.
    pub id: EventId,
    /// The event.
    pub event: Event,
}

/// Fields every unit event carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitEventHeader {
    /// The unit.
    pub unit_id: UnitId,
    /// The worker that made the transition.
    pub worker_id: WorkerId,
    /// The unit's retry index after the transition.
    pub retry_index: u32,
    /// The unit's reclaim count after the transition.
    pub reclaim_count: u32,
    /// `1 + retry_index + reclaim_count`: which ownership of the unit this is.
    pub ownership_generation: u32,
    /// When it happened (milliseconds since the Unix epoch, store's clock).
    pub at_ms: u64,
}

/// An entry of the event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A unit was handed to a worker from a stream.
    Delivered {
        /// Common fields.
        #[serde(flatten)]
        header: UnitEventHeader,
        /// The stream it was read from.
        stream: StreamName,
        /// Its entry.
        entry_id: EntryId,
        /// Deliveries of this entry so far.
        delivery_count: u32,
    },
    /// An idle unit of another (presumably dead) worker was taken over.
    Reclaimed {
        /// Common fields (reclaim_count already incremented).
        #[serde(flatten)]
        header: UnitEventHeader,
        /// The worker that held it, when known.
        previous_worker_id: Option<WorkerId>,
        /// Its stream.
        stream: StreamName,
        /// Its entry.
        entry_id: EntryId,
        /// Deliveries of this entry so far.
        delivery_count: u32,
    },
    /// A failed unit was put on the priority stream for another attempt.
    Requeued {
        /// Common fields (retry_index already incremented).
        #[serde(flatten)]
        header: UnitEventHeader,
        /// The retry index of the failed attempt.
        previous_retry_index: u32,
        /// How long the failed attempt ran.
        duration_ms: u64,
        /// A short description of the failure.
        failure_summary: Option<String>,
        /// Structured error details from the worker.
        errors: Option<serde_json::Value>,
        /// The stream of the failed delivery.
        stream: StreamName,
        /// The entry of the failed delivery.
        entry_id: EntryId,
        /// The new entry on the priority stream.
        new_entry_id: EntryId,
        /// The worker's slot that ran the failed attempt, when it said
        /// ([`RequeueRequest::slot`](crate::queue::RequeueRequest::slot)).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        slot: Option<u32>,
    },
    /// A unit reached its final outcome.
    Finalized {
        /// Common fields.
        #[serde(flatten)]
        header: UnitEventHeader,
        /// The outcome.
        outcome: Outcome,
        /// How long the final attempt ran (0 when finalized by reclaim).
        duration_ms: u64,
        /// Why, when not a plain result.
        reason: Option<FinalizeReason>,
        /// Structured error details from the worker.
        errors: Option<serde_json::Value>,
        /// The stream of the delivery.
        stream: StreamName,
        /// The entry of the delivery.
        entry_id: EntryId,
        /// Set when finalized by reclaim: the worker that held it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        previous_worker_id: Option<WorkerId>,
        /// Set when finalized by reclaim: deliveries of the entry.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        delivery_count: Option<u32>,
        /// Set when finalized by an exhausted retry budget: the failure.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failure_summary: Option<String>,
        /// The worker's slot that ran the final attempt, when it said
        /// ([`FinalizeRequest::slot`](crate::queue::FinalizeRequest::slot),
        /// or the requeue's over its budget).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        slot: Option<u32>,
    },
    /// A worker gave up a delivery (shutting down); it will be reclaimed.
    Abandoned {
        /// Common fields.
        #[serde(flatten)]
        header: UnitEventHeader,
        /// How long the worker had held it.
        elapsed_ms: u64,
        /// Its stream.
        stream: StreamName,
        /// Its entry.
        entry_id: EntryId,
    },
    /// A worker handed a delivery back without spending a budget; the unit
    /// is on the priority stream again.
    Released {
        /// Common fields (retry index and reclaim count unchanged).
        #[serde(flatten)]
        header: UnitEventHeader,
        /// The stream of the released delivery.
        stream: StreamName,
        /// The entry of the released delivery.
        entry_id: EntryId,
        /// The new entry on the priority stream.
        new_entry_id: EntryId,
    },
    /// A worker reported an error outside any fenced transition.
    WorkerError {
        /// The worker.
        worker_id: WorkerId,
        /// The unit concerned, if any.
        unit_id: Option<UnitId>,
        /// What went wrong.
        message: String,
        /// When it was recorded.
        at_ms: u64,
    },
    /// A worker's transition was fenced off (STALE) and its result dropped.
    StaleRejected {
        /// The worker whose result was dropped.
        worker_id: WorkerId,
        /// The unit.
        unit_id: UnitId,
        /// The stream of the stale delivery.
        stream: StreamName,
        /// The entry of the stale delivery.
        entry_id: EntryId,
        /// The delivery count the worker held.
        delivery_count: u32,
        /// The transition that was refused (heartbeat, finalize, ...).
        transition: String,
        /// When it was recorded.
        at_ms: u64,
    },
}

impl Event {
    /// The seed's name of the event type.
    pub fn type_name(&self) -> &'static str {
        match self {
            Event::Delivered { .. } => "delivered",
            Event::Reclaimed { .. } => "reclaimed",
            Event::Requeued { .. } => "requeued",
            Event::Finalized { .. } => "finalized",
            Event::Abandoned { .. } => "abandoned",
            Event::Released { .. } => "released",
            Event::WorkerError { .. } => "worker_error",
            Event::StaleRejected { .. } => "stale_rejected",
        }
    }

    /// The common fields of a unit event.
    pub fn header(&self) -> Option<&UnitEventHeader> {
        match self {
            Event::Delivered { header, .. }
            | Event::Reclaimed { header, .. }
            | Event::Requeued { header, .. }
            | Event::Finalized { header, .. }
            | Event::Abandoned { header, .. }
            | Event::Released { header, .. } => Some(header),
            Event::WorkerError { .. } | Event::StaleRejected { .. } => None,
        }
    }

    /// The unit the event is about, if any.
    pub fn unit_id(&self) -> Option<&UnitId> {
        match self {
            Event::WorkerError { unit_id, .. } => unit_id.as_ref(),
            Event::StaleRejected { unit_id, .. } => Some(unit_id),
            other => other.header().map(|h| &h.unit_id),
        }
    }

    /// When it happened.
    pub fn at_ms(&self) -> u64 {
        match self {
            Event::WorkerError { at_ms, .. } | Event::StaleRejected { at_ms, .. } => *at_ms,
            other => other.header().map(|h| h.at_ms).unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_serialise_in_the_seed_shape() {
        let event = Event::Delivered {
            header: UnitEventHeader {
                unit_id: UnitId::new("a").unwrap(),
                worker_id: WorkerId::new("w1").unwrap(),
                retry_index: 0,
                reclaim_count: 1,
                ownership_generation: 2,
                at_ms: 7,
            },
            stream: StreamName::Main,
            entry_id: EntryId::new(1, 0),
            delivery_count: 2,
        };
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["type"], "delivered");
        assert_eq!(json["unit_id"], "a");
        assert_eq!(json["ownership_generation"], 2);
        assert_eq!(json["stream"], "units");
        assert_eq!(json["entry_id"], "1-0");
        let back: Event = serde_json::from_value(json).unwrap();
        assert_eq!(back, event);
    }
}
