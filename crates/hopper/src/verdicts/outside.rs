//! Errors the tool reports outside any test: a module, class or session
//! fixture's setup or teardown, unittest's `tearDownClass`, a file that does
//! not collect, RSpec's `after(:context)` and suite hooks.
//!
//! Such an error belongs to no test (pytest counts it as "1 error", RSpec as
//! "1 error occurred outside of examples"), yet it makes the tool's run red.
//! So hopper keeps it apart from the tests, attached to the file or group it
//! belongs to: blaming the test that happened to run next would make that
//! test flaky and the build green.
//!
//! A worker records each one in the queue's event log as a `worker_error`
//! event whose message is [`TAG`] followed by the error as JSON, so
//! `hopper report` on another machine reads it back like the local run does,
//! and needs nothing new from the queue's contract. The report counts each
//! distinct error once: an agent replaced after a crash collects its files
//! again, and an RSpec agent runs a group's `after(:context)` once per
//! example, so the same error may be recorded more than once.

use leasehold_core::queue::MAX_SUMMARY_LEN;
use leasehold_core::{QueueError, RunId, UnitQueue, WorkerId};
use serde::{Deserialize, Serialize};

/// The phase of an [`OutsideError`] that is a skip of its whole group (a
/// module-level `pytest.importorskip`), not an error: kept, reported as
/// skipped, and it does not fail the build.
pub const SKIPPED: &str = "skipped";

/// What starts the message of a `worker_error` event that carries an
/// [`OutsideError`]; other worker errors are free text.
pub const TAG: &str = "hopper-outside-error: ";

/// One error outside any test.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OutsideError {
    /// The file or group it belongs to: a pytest node id (`tests/test_a.py`,
    /// `tests/test_a.py::TestX`, or the session's root, `.`), an RSpec group
    /// id (`./spec/a_spec.rb[1]`).
    pub group: String,
    /// When it happened: `setup`, `teardown`, `collection`,
    /// `after(:context)`, `suite` ...
    pub phase: String,
    /// One line: what went wrong.
    pub message: String,
    /// The traceback and what was printed, when known.
    #[serde(default)]
    pub output: String,
}

impl OutsideError {
    /// Whether `other` is the same error: the same group, phase and message
    /// (each agent of a session tears down its own session fixtures, and
    /// their outputs differ in what else each printed).
    pub fn same_as(&self, other: &OutsideError) -> bool {
        self.group == other.group && self.phase == other.phase && self.message == other.message
    }

    /// Whether this is the skip of a whole group, not an error (see [`SKIPPED`]).
    pub fn is_skip(&self) -> bool {
        self.phase == SKIPPED
    }

    /// The `worker_error` message that carries this error: [`TAG`] and the
    /// error as JSON, its output cut (from the front) so the whole fits the
    /// queue's limit.
    pub fn to_event_message(&self) -> String {
        let mut error = self.clone();
        error.message = cut_front(&error.message, 1024);
        error.group = cut_front(&error.group, 1024);
        let mut room = MAX_SUMMARY_LEN;
        loop {
            error.output = cut_front(&error.output, room);
            // Serializing plain strings cannot fail.
            let message = format!("{TAG}{}", serde_json::to_string(&error).unwrap_or_default());
            // JSON escapes make the output weigh more than its bytes: cut until it fits.
            if message.len() <= MAX_SUMMARY_LEN || error.output.is_empty() {
                return message;
            }
            room = error.output.len() / 2;
            if room < 16 {
                error.output.clear();
            }
        }
    }

    /// The error a `worker_error` message carries; `None` for other worker errors.
    pub fn from_event_message(message: &str) -> Option<Self> {
        serde_json::from_str(message.strip_prefix(TAG)?).ok()
    }
}

/// The `worker_error` message a worker records when it ends, after its
/// agents' final teardowns: `hopper report` waits for it from every worker
/// (see [`crate::report::wait_for_end`]), so errors recorded after the last
/// unit was finalized are in the report too.
pub const WORKER_DONE: &str = "hopper-worker-done";

/// Records that `worker` ended (see [`WORKER_DONE`]).
pub async fn record_done(queue: &dyn UnitQueue, run: &RunId, worker: &WorkerId) -> Result<(), QueueError> {
    queue.record_worker_error(run, worker, None, WORKER_DONE).await
}

/// Records `errors` in the run's event log, so that every report of the
/// build (here or on another machine) sees them and fails the build.
pub async fn record(
    queue: &dyn UnitQueue,
    run: &RunId,
    worker: &WorkerId,
    errors: &[OutsideError],
) -> Result<(), QueueError> {
    for error in errors {
        tracing::info!(group = %error.group, phase = %error.phase, message = %error.message, "an error outside any test");
        queue.record_worker_error(run, worker, None, &error.to_event_message()).await?;
    }
    Ok(())
}

/// The last `max` bytes of `text` (whole characters), marked when cut.
fn cut_front(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("[...]{}", &text[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outside_error_travels_in_a_worker_error_message() {
        let error = OutsideError {
            group: "tests/test_a.py".into(),
            phase: "teardown".into(),
            message: "RuntimeError: module fixture \"boom\" é".into(),
            output: "Traceback ...\n".into(),
        };
        let message = error.to_event_message();
        assert!(message.starts_with(TAG), "{message}");
        assert_eq!(OutsideError::from_event_message(&message), Some(error));
        assert_eq!(OutsideError::from_event_message("disk full"), None, "free text is another worker error");
    }

    #[test]
    fn a_long_output_is_cut_to_fit_the_queue() {
        let error = OutsideError {
            group: "g".into(),
            phase: "teardown".into(),
            message: "m".into(),
            output: format!("{}the end", "\"x\"\n".repeat(MAX_SUMMARY_LEN)),
        };
        let message = error.to_event_message();
        assert!(message.len() <= MAX_SUMMARY_LEN, "{}", message.len());
        let back = OutsideError::from_event_message(&message).unwrap();
        assert!(back.output.starts_with("[...]") && back.output.ends_with("the end"), "{}", &back.output[..20]);
        leasehold_core::queue::check_worker_error_message(&message).unwrap();
    }
}
