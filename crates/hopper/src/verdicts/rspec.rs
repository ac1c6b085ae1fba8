//! RSpec's JSON formatter (`--format json --out FILE`).

use std::time::Duration;

use serde::Deserialize;

use super::case::{CaseStatus, ReportedCase};

#[derive(Deserialize)]
struct Document {
    examples: Vec<Example>,
    #[serde(default)]
    summary: Option<Summary>,
    /// What RSpec printed besides the examples: the errors outside of them.
    #[serde(default)]
    messages: Vec<String>,
}

#[derive(Deserialize)]
struct Summary {
    #[serde(default)]
    errors_outside_of_examples_count: u64,
}

#[derive(Deserialize)]
struct Example {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    full_description: Option<String>,
    status: String,
    file_path: String,
    #[serde(default)]
    line_number: Option<u64>,
    #[serde(default)]
    run_time: Option<f64>,
    #[serde(default)]
    exception: Option<Exception>,
    #[serde(default)]
    pending_message: Option<String>,
}

#[derive(Deserialize)]
struct Exception {
    #[serde(default)]
    class: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    backtrace: Option<Vec<String>>,
}

/// Parses RSpec's JSON report into its examples, in report order.
pub fn parse(text: &str) -> Result<Vec<ReportedCase>, serde_json::Error> {
    // rspec may print a warning before the document when it shares stdout.
    let start = text.find('{').unwrap_or(0);
    let document: Document = serde_json::from_str(text[start..].trim())?;
    let outside = outside_errors(&document);
    let cases: Vec<ReportedCase> = document
        .examples
        .into_iter()
        .map(|example| {
            let file = example.file_path.strip_prefix("./").unwrap_or(&example.file_path).to_owned();
            let mut ids = vec![file.clone()];
            if let Some(line) = example.line_number {
                ids.push(format!("{file}:{line}"));
            }
            ids.extend(example.id.clone());
            ids.extend(example.full_description.clone());
            let status = match example.status.as_str() {
                "passed" => CaseStatus::Passed,
                "pending" => CaseStatus::Skipped,
                _ => CaseStatus::Failed,
            };
            let (message, output) = match (&status, example.exception) {
                (CaseStatus::Failed, Some(e)) => {
                    let message = e.message.unwrap_or_else(|| "the example failed".into());
                    let class = e.class.unwrap_or_default();
                    let trace = e.backtrace.unwrap_or_default().join("\n");
                    (Some(message.clone()), format!("{class}: {message}\n{trace}").trim().to_owned())
                }
                (CaseStatus::Failed, None) => (Some(format!("status {}", example.status)), String::new()),
                (CaseStatus::Skipped, _) => (example.pending_message.clone(), String::new()),
                _ => (None, String::new()),
            };
            ReportedCase {
                ids,
                status,
                duration: example.run_time.filter(|t| t.is_finite() && *t >= 0.0).map(Duration::from_secs_f64),
                message,
                output,
                outside: None,
            }
        })
        .chain(outside)
        .collect();
    Ok(cases)
}

/// RSpec's errors outside of examples (`after(:context)`, suite hooks, a
/// file that does not load), as cases of no unit. Its JSON gives their
/// count and their printed messages, not their groups: each is attached to
/// the first spec file its backtrace names.
fn outside_errors(document: &Document) -> Vec<ReportedCase> {
    let count = document.summary.as_ref().map_or(0, |s| s.errors_outside_of_examples_count);
    if count == 0 {
        return Vec::new();
    }
    let mut texts: Vec<&str> =
        document.messages.iter().map(String::as_str).filter(|m| m.contains("error occurred")).collect();
    if texts.is_empty() {
        texts.push("");
    }
    texts
        .into_iter()
        .map(|text| {
            let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
            let phase = ["after(:context)", "before(:suite)", "after(:suite)", "while loading"]
                .into_iter()
                .find(|p| text.contains(p))
                .map_or("outside examples", |p| if p == "while loading" { "collection" } else { p });
            let group = lines
                .iter()
                .find_map(|l| l.strip_prefix("# ").and_then(|l| l.split(':').next()).filter(|f| f.ends_with(".rb")))
                .unwrap_or("suite")
                .to_owned();
            // RSpec prints the exception's class on a line of its own, its message on the next.
            let class = lines.iter().position(|l| {
                l.strip_suffix(':').is_some_and(|c| c.starts_with(char::is_uppercase) && !c.contains(' '))
            });
            let message = match class {
                Some(at) => format!("{} {}", lines[at], lines.get(at + 1).copied().unwrap_or_default()),
                None => lines.first().copied().unwrap_or("an error occurred outside of examples").to_owned(),
            };
            ReportedCase {
                ids: Vec::new(),
                status: CaseStatus::Failed,
                duration: None,
                message: Some(message.clone()),
                output: text.to_owned(),
                outside: Some(super::outside::OutsideError {
                    group,
                    phase: phase.to_owned(),
                    message: message.trim().to_owned(),
                    output: text.to_owned(),
                }),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_examples() {
        let json = r#"{"version":"3.12.0","examples":[
          {"id":"./spec/a_spec.rb[1:1]","description":"works","full_description":"A works","status":"passed",
           "file_path":"./spec/a_spec.rb","line_number":2,"run_time":0.25,"pending_message":null},
          {"id":"./spec/a_spec.rb[1:2]","description":"breaks","full_description":"A breaks","status":"failed",
           "file_path":"./spec/a_spec.rb","line_number":5,"run_time":0.001,"pending_message":null,
           "exception":{"class":"RSpec::Expectations::ExpectationNotMetError","message":"expected 2\n     got 3","backtrace":["./spec/a_spec.rb:6"]}},
          {"id":"./spec/b_spec.rb[1:1]","status":"pending","file_path":"./spec/b_spec.rb","line_number":1,"run_time":0.0}
        ],"summary":{"example_count":3}}"#;
        let cases = parse(json).unwrap();
        assert_eq!(cases.len(), 3);
        assert_eq!(cases[0].ids, vec!["spec/a_spec.rb", "spec/a_spec.rb:2", "./spec/a_spec.rb[1:1]", "A works"]);
        assert_eq!(cases[0].duration, Some(Duration::from_millis(250)));
        assert_eq!(cases[1].status, CaseStatus::Failed);
        assert_eq!(cases[1].message.as_deref(), Some("expected 2\n     got 3"));
        assert!(cases[1].output.contains("./spec/a_spec.rb:6"));
        assert_eq!(cases[2].status, CaseStatus::Skipped);
        assert!(parse("not json").is_err());
        assert!(cases.iter().all(|c| c.outside.is_none()));
    }

    #[test]
    fn errors_outside_of_examples_are_cases_of_no_unit() {
        let json = r#"{"examples":[{"id":"./spec/a_spec.rb[1:1]","status":"passed","file_path":"./spec/a_spec.rb"}],
          "summary":{"example_count":1,"errors_outside_of_examples_count":1},
          "messages":["\nAn error occurred in an `after(:context)` hook.\nFailure/Error: after(:context) { raise \"boom\" }\n\nRuntimeError:\n  boom\n# ./spec/a_spec.rb:2:in `block (2 levels)'\n"]}"#;
        let cases = parse(json).unwrap();
        assert_eq!(cases.len(), 2);
        assert!(cases[1].ids.is_empty());
        let error = cases[1].outside.as_ref().unwrap();
        assert_eq!(error.group, "./spec/a_spec.rb");
        assert_eq!(error.phase, "after(:context)");
        assert_eq!(error.message, "RuntimeError: boom");
    }
}
