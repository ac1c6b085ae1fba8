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
        let message = (status == CaseStatus::Failed)
            .then(|| line.message.clone().unwrap_or_else(|| "the test failed".to_owned()));
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
        assert_eq!(cases[2].status, CaseStatus::Skipped);
        assert_eq!(cases[3].ids, vec!["demo$it::works", "it::works", "demo::it::works"]);
    }
}
