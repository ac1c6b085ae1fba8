//! # leasehold-redis
//!
//! The Redis backend of leasehold: [`RedisStore`] implements
//! [`leasehold_core::UnitQueue`], [`leasehold_core::LeaseStore`],
//! [`leasehold_core::Presence`] and [`leasehold_core::BucketLeases`] on one
//! Redis server (`redis://host:port`) or a Redis Cluster
//! (`redis+cluster://host:port,host:port`), with the same replies as the
//! memory backend (the reference semantics; a shared conformance suite and a
//! differential property test hold the two together).
//!
//! ## How it works
//!
//! * Every unit-queue transition is one Lua script call
//!   (`lua/transition/`, one file per part, joined at build time; modelled on
//!   rspec-hopper's `transition.lua`: the same modes, replies and events, plus
//!   `release`). `reserve` reads the priority stream, then cuts a range
//!   from the main queue (queue format 5, `docs/queue-model.md`), then
//!   reclaims, for a whole batch in one call.
//! * Leases are Lua too (`lua/lease_*.lua`): a claim is `SET NX PX` plus an
//!   `INCR` of a per-key fence counter (the fencing token) in one script;
//!   renew and release check owner *and* token (the lease value is
//!   `"owner token"`).
//! * The transitions are a function library (`FUNCTION LOAD` once, then
//!   `FCALL`: its body runs once at load, not at every call); the other
//!   scripts are sent as `EVALSHA`. On `NOSCRIPT`, or a function not found
//!   (a restarted server, a `SCRIPT FLUSH` or `FUNCTION FLUSH`, a
//!   failed-over cluster node), the script or library is loaded and the
//!   call is repeated, also for pipelined script calls.
//! * The connection reconnects by itself ([`redis::aio::ConnectionManager`]
//!   on one server, the cluster client's own connection on a cluster). While
//!   Redis is down calls fail with a clear [`leasehold_core::QueueError::Backend`]
//!   / [`leasehold_core::LeaseError::Backend`]; they succeed again once it is back.
//! * `user.active` events use Redis pub/sub on a connection of their own,
//!   forwarded into a `tokio::sync::broadcast` channel.
//!
//! * Unit timings ([`leasehold_core::TimingsStore`]) are one hash per prefix.
//!
//! ## Keys
//!
//! See [`keys`]. Every key of one run shares the run's hash tag
//! (`<prefix>:hopper:{<run>}:units`, ...), and every key of the lease space
//! shares one tag built from the prefix (`{<prefix>}:sync:lease:<id>`, ...),
//! so all scripts work on Redis Cluster.
//!
//! ## Test support
//!
//! With the `test-support` feature, [`test_support`] starts private
//! `redis-server` processes and a 3-master Redis Cluster on loopback for
//! tests and benchmarks.
#![warn(missing_docs)]

mod buckets;
pub mod bus;
mod config;
mod conn;
pub mod keys;
mod lease;
mod presence;
mod pubsub;
mod queue;
mod reply;
mod scripts;
mod store;
mod timings;
mod wait;

#[cfg(feature = "test-support")]
pub mod test_support;

pub use config::{may_come_back, ConnectError, RedisConfig, DEFAULT_PREFIX};
pub use reply::ReplyError;
pub use store::RedisStore;
