//! Every error of the core contracts, each saying what failed, for which key,
//! and what to do about it.
//!
//! Transition outcomes that are part of the protocol (a fenced-off delivery,
//! a missing run) are *replies* ([`crate::queue::Status`]), not errors: an
//! error means the call could not be carried out at all.

use std::time::Duration;

use crate::ids::{LeaseKey, RunId, UnitId};

/// A boxed error from a backend's transport or server.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An id failed validation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The id is empty.
    #[error("{kind} is empty: give a non-empty {kind}")]
    Empty {
        /// Which kind of id.
        kind: &'static str,
    },
    /// The id is longer than allowed.
    #[error("{kind} is {len} bytes long, over the limit of {max}: use a shorter {kind}")]
    TooLong {
        /// Which kind of id.
        kind: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The id holds a character it may not.
    #[error("{kind} \"{value}\" contains {found:?}, which is not allowed (no control characters; keys also no whitespace or braces)")]
    InvalidChar {
        /// Which kind of id.
        kind: &'static str,
        /// The offending id, escaped.
        value: String,
        /// The first character that is not allowed.
        found: char,
    },
    /// A stream entry id is not of the form `<ms>-<seq>`.
    #[error("entry id \"{value}\" is not of the form <ms>-<seq>")]
    BadEntryId {
        /// The offending value, escaped.
        value: String,
    },
}

/// A run specification, budget or time-to-live is invalid. Nothing was written.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// The unit list is empty.
    #[error("run {run}: the unit list is empty: give at least one unit")]
    NoUnits {
        /// The run.
        run: RunId,
    },
    /// The unit list names a unit twice.
    #[error("run {run}: unit \"{unit}\" appears more than once in the unit list: each unit must be listed once")]
    DuplicateUnit {
        /// The run.
        run: RunId,
        /// The duplicated unit.
        unit: UnitId,
    },
    /// The requeue tolerance is not a finite fraction in [0, 1].
    #[error("requeue tolerance {value} is invalid: give a fraction of the run's units between 0 and 1 (e.g. 0.2)")]
    BadTolerance {
        /// The offending value.
        value: f64,
    },
    /// A time-to-live is zero (or rounds to zero milliseconds).
    #[error("{what} is {ttl:?}: it must be at least 1 ms")]
    ZeroTtl {
        /// Which time-to-live.
        what: &'static str,
        /// The offending value.
        ttl: Duration,
    },
    /// A unit's kind label is too long.
    #[error("unit \"{unit}\": kind label is {len} bytes, over the limit of 256")]
    KindTooLong {
        /// The unit.
        unit: UnitId,
        /// Its length.
        len: usize,
    },
    /// A unit's group name is empty, too long or holds a control character.
    #[error("unit \"{unit}\": group name {name:?} is invalid: give 1 to 256 bytes without control characters")]
    BadGroupName {
        /// The unit.
        unit: UnitId,
        /// The offending name.
        name: String,
    },
    /// Two units of one group give it different limits.
    #[error("group {group:?} has two limits, {first} and {other}: give every unit of a group the same limit")]
    GroupLimitMismatch {
        /// The group.
        group: String,
        /// The limit seen first.
        first: u32,
        /// The other limit.
        other: u32,
    },
    /// A bucket count is zero or over the limit.
    #[error("bucket count {count} is invalid: give 1 to 65536 (the default, 4096, suits up to millions of accounts)")]
    BadBucketCount {
        /// The offending count.
        count: u32,
    },
    /// A balance policy's slack is over its limit.
    #[error("balance slack {slack_pct}% is invalid: give 0 to 100 (10 lets a worker hold 10% over its fair share)")]
    BadBalanceSlack {
        /// The offending slack.
        slack_pct: u32,
    },
    /// A free-text field is over its limit.
    #[error("{what} is {len} bytes, over the limit of {max}: shorten it (keep the tail of long output)")]
    TextTooLong {
        /// Which field.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// A [`crate::LeaseStore`] call failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The arguments were invalid; nothing was changed.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The backend could not carry out the operation.
    #[error("lease store: {op} on {key} failed: {source}")]
    Backend {
        /// The operation.
        op: &'static str,
        /// The key (or `*` for store-wide operations).
        key: String,
        /// The cause.
        #[source]
        source: BoxError,
    },
    /// Stored state is not what the contract allows (written by something else).
    #[error("lease store: state of {key} is corrupt: {detail}")]
    Corrupt {
        /// The key.
        key: String,
        /// What was found.
        detail: String,
    },
}

impl LeaseError {
    /// Wraps a backend error for `op` on `key`.
    pub fn backend(op: &'static str, key: &LeaseKey, source: impl Into<BoxError>) -> Self {
        Self::Backend { op, key: key.to_string(), source: source.into() }
    }
}

/// A [`crate::UnitQueue`] call failed.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The arguments were invalid; nothing was changed.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The run was already initialised with a different unit list.
    #[error("run {run} was already initialised with a different unit list ({existing} units, this call has {given}): use a new run id for a different suite")]
    UnitListMismatch {
        /// The run.
        run: RunId,
        /// Units in the stored run.
        existing: u64,
        /// Units in this call.
        given: u64,
    },
    /// The run was started by a version of the backend that stores it in
    /// another format; this one cannot share it. Nothing was changed.
    #[error("run {run} was started by another version, which stores it in queue format {found} (this one writes format {expected}): every worker of one run must write the same format; finish the run with the version that started it, or use a new run id")]
    IncompatibleRun {
        /// The run.
        run: RunId,
        /// The format the run is stored in.
        found: String,
        /// The format this caller writes.
        expected: String,
    },
    /// The backend could not carry out the operation.
    #[error("unit queue: {op} on run {run} failed: {source}")]
    Backend {
        /// The operation.
        op: &'static str,
        /// The run.
        run: RunId,
        /// The cause.
        #[source]
        source: BoxError,
    },
    /// Stored state of the run is not what the contract allows.
    #[error("unit queue: run {run} is corrupt: {detail}")]
    Corrupt {
        /// The run.
        run: RunId,
        /// What was found.
        detail: String,
    },
}

impl QueueError {
    /// Wraps a backend error for `op` on `run`.
    pub fn backend(op: &'static str, run: &RunId, source: impl Into<BoxError>) -> Self {
        Self::Backend { op, run: run.clone(), source: source.into() }
    }
}

/// The message of `error` and of each of its causes, each printed once, on
/// one line: `a: b: c`. A cause whose text the message already holds (a
/// `{source}` in a `Display`) is not repeated, and runs of whitespace (a
/// tool's multi-line stderr) become one space.
///
/// Every binary and every `last_error` prints causes through this one
/// function, so the same cause reads the same everywhere.
///
/// ```
/// use leasehold_core::errors::error_chain;
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("could not load the run")]
/// struct Load(#[source] std::io::Error);
///
/// let error = Load(std::io::Error::other("connection\nrefused"));
/// assert_eq!(error_chain(&error), "could not load the run: connection refused");
/// ```
pub fn error_chain(error: &dyn std::error::Error) -> String {
    chain_text(error).split_whitespace().collect::<Vec<_>>().join(" ")
}

/// [`error_chain`] for a person at a terminal, as a binary's last word: the
/// same causes, but a message of several lines (a traceback a tool printed)
/// keeps its lines as they were, less trailing whitespace and blank lines.
///
/// ```
/// use leasehold_core::errors::error_report;
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("discovery failed: {detail}")]
/// struct Discover { detail: String }
///
/// let error = Discover { detail: "RuntimeError: boom\n\n  File \"conftest.py\",   line 2".into() };
/// assert_eq!(error_report(&error), "discovery failed: RuntimeError: boom\n  File \"conftest.py\",   line 2");
/// ```
pub fn error_report(error: &dyn std::error::Error) -> String {
    let text = chain_text(error);
    let lines = text.lines().map(str::trim_end).filter(|line| !line.is_empty());
    lines.collect::<Vec<_>>().join("\n")
}

/// `error`'s message and each cause's that it does not already hold, joined by `: `.
fn chain_text(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let text = next.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = next.source();
    }
    message
}

#[cfg(test)]
mod error_chain_tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Wraps(#[source] Repeats);

    #[test]
    fn a_cause_already_in_the_message_is_printed_once() {
        let error = Wraps(Repeats(std::io::Error::other("disk full")));
        assert_eq!(error_chain(&error), "outer: outer: disk full");
        assert_eq!(error_chain(&Repeats(std::io::Error::other("disk full"))), "outer: disk full");
    }
}
