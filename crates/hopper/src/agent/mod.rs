//! Persistent agents: a long-lived test process collects once, then runs the
//! tests hopper sends it over a pipe and streams one result per test back
//! (the protocol is `docs/agent-protocol.md`). This folder is the process and
//! its protocol only: the agents hopper ships (pytest's plugin, RSpec's
//! agent), how one is started and spoken to, and how a worker's agents share
//! the suite; the slot that feeds an agent is the worker's
//! (`worker::agent_slot`).

pub mod child;
pub(crate) mod outside_errors;
pub mod plugins;
pub mod protocol;
pub mod shards;

pub use crate::errors::AgentError;
