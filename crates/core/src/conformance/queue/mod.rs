//! Conformance cases for [`UnitQueue`](crate::UnitQueue).
//!
//! Each case follows the seed's `transition.lua` reply by reply, adapted to
//! the trait. Entry ids and timestamps differ between backends, so cases
//! compare them only with each other (taking them from the store's own
//! replies), never with literals.
//!
//! One module per part of the contract; every public `async fn(Fixture)` of
//! them is a case (the build lists them: see the crate's `build.rs`).

pub mod concurrency;
pub mod events;
pub mod fail_fast;
pub mod fences;
pub mod finalize;
pub mod groups;
pub mod initialize;
pub mod reads;
pub mod reclaim;
pub mod release;
pub mod requeue;
pub mod reserve;
pub mod retry_elsewhere;
pub mod single_forms;
pub mod ttl;
pub mod unfenced_events;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use super::support::*;
use super::{Fixture, LONG};
use crate::errors::{QueueError, SpecError};
use crate::events::Event;
use crate::ids::{EntryId, UnitId};
use crate::queue::{
    Ack, Budgets, Delivery, DeliveryOrigin, FinalizeReason, FinalizeRequest, InitOutcome, LivenessReply, Outcome,
    Progress, RequeueReply, RequeueRequest, ReserveBatch, ReserveReply, RunSpec, StreamName, MAX_KIND_LEN,
    MAX_SUMMARY_LEN,
};
