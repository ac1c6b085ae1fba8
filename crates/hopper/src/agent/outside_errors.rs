//! An agent's errors outside any test (`{"event": "error"}`,
//! docs/agent-protocol.md): recorded in the queue as they come, and the
//! agent's final teardown awaited at the build's end, since a session
//! fixture or an `after(:suite)` hook fails only then.

use std::time::Duration;

use leasehold_core::{RunId, UnitQueue, WorkerId};

use super::child::AgentChild;
use super::protocol::{Reply, Request};
use crate::errors::HopperError;
use crate::verdicts::outside::{self, OutsideError};

/// How long an agent's final teardown may take when there is no
/// `--unit-timeout` to bound it.
const TEARDOWN_WAIT: Duration = Duration::from_secs(300);

/// The phase of the error recorded for an agent that did not exit 0 after `exit`.
const EXIT_PHASE: &str = "exit";

/// The group of errors that belong to the whole session (pytest's root
/// node id, as the plugin sends it).
const SESSION_GROUP: &str = "session";

/// Where one worker's outside errors go.
pub(crate) struct OutsideErrors<'a> {
    /// The run's queue.
    pub queue: &'a dyn UnitQueue,
    /// The build.
    pub run: &'a RunId,
    /// This worker.
    pub worker: &'a WorkerId,
}

impl OutsideErrors<'_> {
    /// Records `errors` in the run's event log (see [`outside::record`]).
    pub async fn record(&self, errors: &[OutsideError]) -> Result<(), HopperError> {
        outside::record(self.queue, self.run, self.worker, errors).await?;
        Ok(())
    }

    /// Records what `agent` reported before it was ready (collection errors).
    pub async fn record_early(&self, agent: &mut AgentChild) -> Result<(), HopperError> {
        let errors = agent.take_early_errors();
        self.record(&errors).await
    }

    /// Ends `agent` at the build's end: sends `exit`, then reads its replies
    /// until it exits or closes its stdout, for at most `wait` (the unit time limit,
    /// or [`TEARDOWN_WAIT`]), recording every error it reports on the way
    /// (its final teardown: session fixtures, the last module's, RSpec's
    /// `after(:suite)`). A teardown that does not end in time is an error
    /// too; the agent is then ended with TERM, then KILL after `grace`.
    pub async fn exit_awaiting_teardown(
        &self,
        mut agent: AgentChild,
        wait: Option<Duration>,
        grace: Duration,
    ) -> Result<(), HopperError> {
        self.record_early(&mut agent).await?;
        let wait = wait.unwrap_or(TEARDOWN_WAIT);
        if let Err(error) = agent.send(&Request::Exit).await {
            // It is gone already: nothing more to hear from it.
            tracing::debug!(%error, "could not ask the agent to exit");
        }
        let mut errors = Vec::new();
        let (lines, in_time) = agent.lines_until_exit(wait).await;
        for line in lines {
            match Reply::parse(&line) {
                Ok(reply) => errors.extend(reply.outside_error()),
                Err(error) => tracing::warn!(%error, line, "agent wrote a line that is not the protocol; ignored"),
            }
        }
        if !in_time {
            errors.push(OutsideError {
                group: SESSION_GROUP.into(),
                phase: "teardown".into(),
                message: format!("the final teardown did not end within {:.1}s", wait.as_secs_f64()),
                output: agent.stderr_tail(16 * 1024),
            });
        }
        let end = agent.finish(grace, !in_time).await;
        // The protocol's agents exit 0 after `exit`: any other status is
        // the tool failing after the last test (a `pytest_unconfigure`
        // that raises, an `at_exit` hook), which plain runs report too.
        if !end.signalled && end.code() != Some(0) {
            let output = end.stderr_tail(16 * 1024);
            let last = crate::exec::process::last_line(&output);
            errors.push(OutsideError {
                group: SESSION_GROUP.into(),
                phase: EXIT_PHASE.into(),
                message: format!("the tool failed after its last test ({end}, where an agent exits 0): {last}"),
                output,
            });
        }
        self.record(&errors).await
    }
}
