//! Persistent agents: a long-lived test process collects once, then runs the
//! tests hopper sends it over a pipe and streams one result per test back
//! (the protocol is `docs/agent-protocol.md`).

pub mod child;
pub(crate) mod outside_errors;
pub mod plugins;
pub mod protocol;
pub mod shards;
pub(crate) mod slot;
pub mod tools;

/// Why an agent could not serve a slot.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The agent program could not be started.
    #[error("could not start the agent `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The agent exited before it said it was ready (a collection error, a bad command).
    #[error("the agent `{command}` exited before it was ready ({status}): {last_line}")]
    DiedBeforeReady {
        /// The command line.
        command: String,
        /// How it ended.
        status: String,
        /// The last line of its error output.
        last_line: String,
    },
    /// The agent speaks another protocol version.
    #[error("the agent speaks protocol version {got}, hopper speaks {want}")]
    Protocol {
        /// The agent's version.
        got: u32,
        /// hopper's version.
        want: u32,
    },
    /// The agent collected another number of tests than discovery did.
    #[error("the agent collected {collected} tests but discovery listed {expected}: the suite changed, or the agent's command differs from the listing's")]
    CollectedOther {
        /// Discovery's count.
        expected: u64,
        /// The agent's count.
        collected: u64,
    },
    /// Fresh agents keep dying without running a test.
    #[error("the agent died {times} times in a row without finishing a test (last: {status}): {last_line}")]
    KeepsDying {
        /// How many times.
        times: u32,
        /// How the last one ended.
        status: String,
        /// The last line of its error output.
        last_line: String,
    },
}
