//! A pass after the test tool's own reruns is flaky.
//!
//! pytest-rerunfailures (`--reruns N`, `@pytest.mark.flaky(reruns=N)`) runs a
//! failed test again inside the same pytest, and pytest counts a test that
//! passed on a rerun as passed, "1 rerun". hopper's agent ran it as one
//! attempt, so it reached the build as a plain pass and the failures before
//! it were lost: a flaky test looked sound. The agent now sends each failed
//! try before the last (`reruns` in its result); they ride in the finalize
//! request's `errors` payload as `{"reruns": [{"detail", "output"}, ...]}`,
//! and the report reads each back as a failed attempt on the worker that
//! passed the unit. So the unit is flaky in the text report, the JUnit
//! (a `<flakyFailure>` each) and under `--flaky-result fail`.

use leasehold_core::{FinalizeRequest, Outcome};
use serde_json::{json, Value};

use super::tail;

/// The key of the failed tries in a passed unit's `errors` payload.
pub const RERUNS: &str = "reruns";
/// The reason each of them is reported under.
pub const RERUN_REASON: &str = "rerun";

/// The most failed tries kept for one unit (a test rerun more often than
/// that is flaky all the same), and the bytes of output kept of each: far
/// below the payload's 1 MiB.
const KEPT: usize = 10;
const OUTPUT_KEPT: usize = 4096;
const DETAIL_KEPT: usize = 1024;

/// `request` (a unit's finalize) with the failed tries (detail, output) the
/// tool ran before its final one. Only a pass keeps them: a failure fails
/// the attempt all the same, and its own failure is what the report shows.
pub fn with_reruns<'a>(
    mut request: FinalizeRequest,
    reruns: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> FinalizeRequest {
    if request.outcome != Outcome::Passed {
        return request;
    }
    let tries: Vec<Value> = reruns
        .into_iter()
        .take(KEPT)
        .map(|(detail, output)| json!({ "detail": head(detail, DETAIL_KEPT), "output": tail(output, OUTPUT_KEPT) }))
        .collect();
    if tries.is_empty() {
        return request;
    }
    match &mut request.errors {
        Some(Value::Object(errors)) => {
            errors.insert(RERUNS.into(), Value::Array(tries));
        }
        _ => request.errors = Some(json!({ RERUNS: tries })),
    }
    request
}

/// The failed tries (detail, output) kept in a finalized event's `errors`.
pub fn of(errors: Option<&Value>) -> Vec<(String, String)> {
    let Some(tries) = errors.and_then(|e| e.get(RERUNS)).and_then(Value::as_array) else { return Vec::new() };
    let text = |try_: &Value, field: &str| try_.get(field).and_then(Value::as_str).unwrap_or_default().to_owned();
    tries.iter().map(|t| (text(t, "detail"), text(t, "output"))).collect()
}

fn head(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdicts::skips;

    #[test]
    fn a_passs_failed_tries_ride_in_its_errors_and_read_back() {
        let request = with_reruns(FinalizeRequest::new(Outcome::Passed, 5), [("boom", "trace"), ("bang", "")]);
        request.validate().unwrap();
        assert_eq!(of(request.errors.as_ref()), [("boom".into(), "trace".into()), ("bang".into(), String::new())]);
        assert_eq!(with_reruns(FinalizeRequest::new(Outcome::Passed, 5), []).errors, None, "no rerun, no payload");
    }

    #[test]
    fn only_a_pass_keeps_them_and_a_skip_reason_stays() {
        let failed = with_reruns(FinalizeRequest::new(Outcome::Failed, 5), [("boom", "")]);
        assert!(of(failed.errors.as_ref()).is_empty());
        let skipped = skips::finalize_request(Outcome::Skipped, 5, Some("not today"));
        let skipped = with_reruns(skipped, [("boom", "")]);
        assert_eq!(skips::reason_of(skipped.errors.as_ref()).as_deref(), Some("not today"));
    }

    #[test]
    fn many_long_tries_are_bounded() {
        let long = "é".repeat(10_000);
        let tries = vec![(long.as_str(), long.as_str()); 50];
        let request = with_reruns(FinalizeRequest::new(Outcome::Passed, 5), tries);
        request.validate().unwrap();
        let kept = of(request.errors.as_ref());
        assert_eq!(kept.len(), KEPT);
        assert!(kept.iter().all(|(d, o)| d.len() <= DETAIL_KEPT && o.len() <= OUTPUT_KEPT));
    }
}
