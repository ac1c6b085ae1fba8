//! # leasehold-core
//!
//! The contracts every leasehold backend implements, and the types they speak:
//!
//! * [`LeaseStore`]: one owner per key at a time, with a strictly increasing
//!   [`FencingToken`] per key, owner-checked renew and release, a live set of
//!   keys that should be owned, a worker registry, tiers and user presence.
//! * [`BucketLeases`]: leases on a fixed number of buckets that keys hash
//!   into, shared fairly by weight among live workers, so a worker's
//!   periodic cost depends on what it owns, not on how many keys exist.
//! * [`UnitQueue`]: the fenced unit queue of a test run (or any batch of work):
//!   at-least-once delivery, heartbeats, retry budgets, reclaim of dead workers'
//!   units and an append-only event log. Backends implement its batch forms;
//!   the single forms are provided on top of them.
//! * [`RunLog`]: the read-only half of every [`UnitQueue`] (counters, units,
//!   the event log, worker records, pending deliveries), for code that only
//!   looks at a run.
//!
//! Backends depend only on this crate (the memory backend `leasehold-mem` is
//! the reference semantics; `leasehold-redis` runs the same contract on Redis).
//! With the `conformance` feature, [`conformance`] holds the shared suite that
//! every backend must pass unchanged.
#![warn(missing_docs)]

pub mod backend_url;
pub mod buckets;
pub mod bus;
pub mod clock;
pub mod duration;
pub mod errors;
pub mod events;
pub mod ids;
pub mod lease;
pub mod notices;
pub mod presence;
pub mod queue;
pub mod run_log;
pub mod timings;
pub mod ttl;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use buckets::{
    BalancePolicy, BucketBinding, BucketChanges, BucketCount, BucketId, BucketLease, BucketLeases, BucketTick,
};
pub use bus::{BusError, BusSubscription, UserBus};
pub use clock::{Clock, ManualClock, SystemClock, TokioClock};
pub use errors::{IdError, LeaseError, QueueError, SpecError};
pub use events::{Event, EventId, EventRecord, UnitEventHeader};
pub use ids::{EntryId, LeaseKey, RunId, UnitId, UserId, WorkerId};
pub use lease::{FencingToken, Lease, LeaseStore};
pub use notices::Notices;
pub use presence::{Presence, Tier, UserActiveSubscription};
pub use queue::{
    AbandonReply, Ack, Budgets, Delivery, DeliveryOrigin, FinalizeReason, FinalizeReply, FinalizeRequest,
    HeartbeatReply, InitOutcome, LivenessReply, Outcome, PendingDelivery, Progress, ReleaseReply, RequeueReply,
    RequeueRequest, ReserveBatch, ReserveLimit, ReserveReply, RunSpec, Status, StreamName, UnitGroup, UnitQueue,
    UnitSpec, UnitState, WorkerRecord,
};
pub use run_log::RunLog;
pub use timings::{NoTimings, PassStreak, TimingsError, TimingsStore};
pub use ttl::Ttl;
