//! The agent protocol's messages (JSON lines; `docs/agent-protocol.md`).

use serde::{Deserialize, Serialize};

/// The protocol version hopper speaks.
pub const PROTOCOL: u32 = 1;

/// A message from hopper to the agent (one line on the agent's stdin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request<'a> {
    /// Run one test; `seq` is hopper's number for this request.
    Run {
        /// Echoed in the replies.
        seq: u64,
        /// The test's id, exactly as discovery listed it.
        test: &'a str,
    },
    /// Finish: tear down and exit 0.
    Exit,
}

/// How a test ended, as the agent saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TestOutcome {
    /// It passed.
    Passed,
    /// It failed (or errored in setup or teardown).
    Failed,
    /// It was skipped (or was an expected failure).
    Skipped,
}

/// A failed try of a test that the tool ran again itself.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Rerun {
    /// Its one-line failure message.
    #[serde(default)]
    pub message: Option<String>,
    /// The tail of its output and traceback.
    #[serde(default)]
    pub output: Option<String>,
}

/// A message from the agent to hopper (one line on the agent's stdout).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Reply {
    /// Collection is done; the agent waits for requests.
    Ready {
        /// The protocol version the agent speaks.
        protocol: u32,
        /// How many tests it collected (checked against discovery).
        #[serde(default)]
        tests: Option<u64>,
        /// What the agent changed in the tool's own settings, for the user
        /// (xdist's `-n` turned off): hopper shows each note once.
        #[serde(default)]
        notes: Vec<String>,
    },
    /// The test of request `seq` starts now (its time limit runs from here).
    Started {
        /// The request.
        seq: u64,
    },
    /// The test of request `seq` ended.
    Result {
        /// The request.
        seq: u64,
        /// How it ended.
        outcome: TestOutcome,
        /// How long it ran.
        #[serde(default)]
        duration_ms: u64,
        /// A one-line failure message.
        #[serde(default)]
        message: Option<String>,
        /// The tail of its captured output.
        #[serde(default)]
        output: Option<String>,
        /// The failed tries the tool itself ran before the last
        /// (pytest-rerunfailures): a pass after them is flaky.
        #[serde(default)]
        reruns: Vec<Rerun>,
    },
    /// An error outside any test (a module fixture's teardown, a file that
    /// does not collect, an `after(:context)` hook): it fails the build and
    /// is attached to `group`, never to a test. May come at any time, also
    /// before `ready` and after `exit`.
    Error {
        /// The file or group it belongs to (a pytest node id, an RSpec group id).
        group: String,
        /// When: `setup`, `teardown`, `collection`, `after(:context)`, ...
        phase: String,
        /// One line: what went wrong.
        message: String,
        /// The traceback and what was printed.
        #[serde(default)]
        output: Option<String>,
    },
    /// A whole file or group skipped before any of its tests (a module-level
    /// `pytest.importorskip`): kept as a skip of `group`, with its reason.
    Skipped {
        /// The file or group.
        group: String,
        /// Why it was skipped.
        message: String,
    },
}

impl Request<'_> {
    /// The request as one line (with its newline).
    pub fn line(&self) -> String {
        // Serializing these plain enums cannot fail.
        let mut line = serde_json::to_string(self).unwrap_or_default();
        line.push('\n');
        line
    }
}

impl Reply {
    /// The error outside any test (or the skip of a whole group) this reply
    /// carries, if it is one.
    pub fn outside_error(&self) -> Option<crate::verdicts::outside::OutsideError> {
        match self {
            Reply::Error { group, phase, message, output } => Some(crate::verdicts::outside::OutsideError {
                group: group.clone(),
                phase: phase.clone(),
                message: message.clone(),
                output: output.clone().unwrap_or_default(),
            }),
            Reply::Skipped { group, message } => Some(crate::verdicts::outside::OutsideError {
                group: group.clone(),
                phase: crate::verdicts::outside::SKIPPED.into(),
                message: message.clone(),
                output: String::new(),
            }),
            _ => None,
        }
    }

    /// Parses one line from the agent.
    pub fn parse(line: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_json_lines() {
        assert_eq!(
            Request::Run { seq: 3, test: "t.py::x[a \"b\"]" }.line(),
            "{\"op\":\"run\",\"seq\":3,\"test\":\"t.py::x[a \\\"b\\\"]\"}\n"
        );
        assert_eq!(Request::Exit.line(), "{\"op\":\"exit\"}\n");
    }

    #[test]
    fn replies_parse() {
        assert_eq!(
            Reply::parse(r#"{"event":"ready","protocol":1,"tests":5}"#).unwrap(),
            Reply::Ready { protocol: 1, tests: Some(5), notes: Vec::new() }
        );
        assert_eq!(Reply::parse(r#"{"event":"started","seq":7}"#).unwrap(), Reply::Started { seq: 7 });
        let result = Reply::parse(r#"{"event":"result","seq":7,"outcome":"failed","duration_ms":3,"message":"boom"}"#);
        assert_eq!(
            result.unwrap(),
            Reply::Result {
                seq: 7,
                outcome: TestOutcome::Failed,
                duration_ms: 3,
                message: Some("boom".into()),
                output: None,
                reruns: Vec::new(),
            }
        );
        let rerun = r#"{"event":"result","seq":8,"outcome":"passed","reruns":[{"message":"boom","output":"tb"},{}]}"#;
        let Reply::Result { reruns, .. } = Reply::parse(rerun).unwrap() else { panic!("a result") };
        assert_eq!(
            reruns,
            [Rerun { message: Some("boom".into()), output: Some("tb".into()) }, Rerun { message: None, output: None }]
        );
        assert_eq!(
            Reply::parse(r#"{"event":"error","group":"t.py","phase":"teardown","message":"boom"}"#).unwrap(),
            Reply::Error { group: "t.py".into(), phase: "teardown".into(), message: "boom".into(), output: None }
        );
        assert!(Reply::parse(r#"{"event":"error","phase":"teardown","message":"boom"}"#).is_err(), "no group");
        assert!(Reply::parse(r#"{"event":"result","seq":1,"outcome":"weird"}"#).is_err());
        assert!(Reply::parse("not json").is_err());
    }
}
