//! Persistent agents: a long-lived test process collects once, then runs the
//! tests hopper sends it over a pipe and streams one result per test back
//! (the protocol is `docs/agent-protocol.md`).

pub mod child;
pub mod plugins;
pub mod protocol;
pub mod shards;

pub use crate::errors::AgentError;
