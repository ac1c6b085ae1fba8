//! libtest's JSON lines (`cargo test -- -Z unstable-options --format json
//! --report-time`, or nextest's `--message-format libtest-json`).
//!
//! Lines that are not JSON test events (cargo's own `Running ...` lines, a
//! test's stray prints) are skipped, so a whole captured stdout can be read.

use std::time::Duration;

use serde::Deserialize;

use super::case::{CaseStatus, ReportedCase};

#[derive(Deserialize)]
struct Line {
    #[serde(rename = "type")]
    kind: String,
    event: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    exec_time: Option<f64>,
    #[serde(default)]
    stdout: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// Parses libtest JSON lines into the finished tests, in order.
pub fn parse(text: &str) -> Vec<ReportedCase> {
    let mut cases = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| l.starts_with('{')) {
        let Ok(line) = serde_json::from_str::<Line>(line) else { continue };
        if line.kind != "test" {
            continue;
        }
        let status = match line.event.as_str() {
            "ok" => CaseStatus::Passed,
            "failed" => CaseStatus::Failed,
            "ignored" => CaseStatus::Skipped,
            // "started", and "timeout" (a warning that a test is slow, not an end).
            _ => continue,
        };
        let Some(name) = line.name else { continue };
        let mut ids = vec![name.clone()];
        // nextest names a test `<binary-id>$<test name>`.
        if let Some((binary, test)) = name.split_once('$') {
            ids.push(test.to_owned());
            ids.push(format!("{binary}::{test}"));
        }
        // libtest's JSON gives a failure's panic only in its output.
        let message = (status == CaseStatus::Failed).then(|| {
            line.message
                .clone()
                .or_else(|| line.stdout.as_deref().and_then(panic_message))
                .unwrap_or_else(|| "the test failed".to_owned())
        });
        cases.push(ReportedCase {
            outside: None,
            ids,
            status,
            duration: line.exec_time.filter(|t| t.is_finite() && *t >= 0.0).map(Duration::from_secs_f64),
            message,
            output: line.stdout.unwrap_or_default(),
        });
    }
    cases
}

/// The panic message of a failed Rust test in libtest's output: the line
/// after `thread '...' panicked at FILE:LINE:COL:` (the message itself, as
/// `assertion `left == right` failed: parse_fails fails`).
pub fn panic_message(output: &str) -> Option<String> {
    let mut lines = output.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.trim().strip_prefix("thread '") else { continue };
        // Newer Rust names the thread's id too: `thread 'x' (9079) panicked at`.
        let Some((_, at)) = rest.split_once(" panicked at ") else { continue };
        // Before Rust 1.73 the message followed on the same line: `at 'msg', file:line:col`.
        if let Some(old) = at.strip_prefix('\'').and_then(|m| m.rsplit_once("', ")) {
            return Some(old.0.to_owned());
        }
        return lines.next().map(|m| m.trim().to_owned()).filter(|m| !m.is_empty());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_finished_tests_and_skips_noise() {
        let text = r#"     Running unittests src/lib.rs (target/debug/deps/demo-1)
{ "type": "suite", "event": "started", "test_count": 3 }
{ "type": "test", "event": "started", "name": "tests::a" }
{ "type": "test", "name": "tests::a", "event": "ok", "exec_time": 0.5 }
{ "type": "test", "name": "tests::b", "event": "failed", "exec_time": 0.001, "stdout": "thread 'tests::b' panicked at src/lib.rs:9:5:\ndeliberate\n" }
{ "type": "test", "event": "timeout", "name": "tests::c" }
{ "type": "test", "event": "ignored", "name": "tests::c" }
{ "type": "test", "event": "ok", "name": "demo$it::works" }
{ "type": "suite", "event": "failed", "passed": 1, "failed": 1 }
"#;
        let cases = parse(text);
        assert_eq!(cases.len(), 4);
        assert_eq!(cases[0].status, CaseStatus::Passed);
        assert_eq!(cases[0].duration, Some(Duration::from_millis(500)));
        assert_eq!(cases[1].status, CaseStatus::Failed);
        assert!(cases[1].output.contains("deliberate"));
        assert_eq!(cases[1].message.as_deref(), Some("deliberate"), "the panic's message, not a stock phrase");
        assert_eq!(cases[2].status, CaseStatus::Skipped);
        assert_eq!(cases[3].ids, vec!["demo$it::works", "it::works", "demo::it::works"]);
    }

    #[test]
    fn a_failures_message_is_its_panic_message() {
        let out =
            "running 1 test\n\nthread 'tests::parse_fails' panicked at src/lib.rs:21:9:\nassertion `left == right` \
                   failed: parse_fails fails\n  left: 2\n right: 5\nnote: run with `RUST_BACKTRACE=1`\n";
        assert_eq!(panic_message(out).as_deref(), Some("assertion `left == right` failed: parse_fails fails"));
        let with_id = "thread 'tests::x' (9079) panicked at src/lib.rs:21:9:\nboom\n";
        assert_eq!(panic_message(with_id).as_deref(), Some("boom"));
        let old = "thread 'main' panicked at 'boom', src/main.rs:2:5\n";
        assert_eq!(panic_message(old).as_deref(), Some("boom"));
        assert_eq!(panic_message("test result: ok\n"), None);
    }
}
