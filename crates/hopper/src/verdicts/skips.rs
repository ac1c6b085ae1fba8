//! A skip's reason, kept with its unit.
//!
//! A skipped, xfailed or pending test used to reach the report as a bare
//! "skipped": its reason (`not today`, `xfail: known bug`, RSpec's pending
//! message, libtest's `#[ignore = "too slow"]`) was dropped on the way.
//! The reason now rides in the finalize request's `errors` payload, as
//! `{"skip_reason": ...}`, so every report of the build reads it back.

use leasehold_core::{FinalizeRequest, Outcome};

/// The key of the reason in a skipped unit's `errors` payload.
pub const SKIP_REASON: &str = "skip_reason";

/// The key of an unexpected pass's reason in a passed unit's `errors`.
pub const XPASS_REASON: &str = "xpass_reason";

/// The finalize request of a unit with `outcome`, its skip reason kept, or,
/// for a pass, the reason of the xfail mark it passed despite (pytest's
/// "xpassed", whose reason starts `xpass`).
pub fn finalize_request(outcome: Outcome, duration_ms: u64, reason: Option<&str>) -> FinalizeRequest {
    let mut request = FinalizeRequest::new(outcome, duration_ms);
    let key = match outcome {
        Outcome::Skipped => SKIP_REASON,
        Outcome::Passed if reason.is_some_and(is_xpass) => XPASS_REASON,
        _ => return request,
    };
    if let Some(reason) = reason.map(str::trim).filter(|r| !r.is_empty()) {
        // Far below the payload's limit: a reason is a line.
        let reason: String = reason.chars().take(1024).collect();
        request.errors = Some(serde_json::json!({ key: reason }));
    }
    request
}

/// Whether a pass's reason says it passed despite an xfail mark.
pub fn is_xpass(reason: &str) -> bool {
    reason.strip_prefix("xpass").is_some_and(|rest| rest.is_empty() || rest.starts_with(':'))
}

/// Whether a finalized pass's `errors` say it passed despite an xfail mark.
pub fn xpassed(errors: Option<&serde_json::Value>) -> bool {
    xpass_reason(errors).is_some()
}

/// The reason of a pass despite an xfail mark, from its `errors`.
pub fn xpass_reason(errors: Option<&serde_json::Value>) -> Option<String> {
    errors?.get(XPASS_REASON)?.as_str().map(str::to_owned)
}

/// The word an expected failure's reason starts with (`xfail: known bug`),
/// from the pytest agent and from pytest's JUnit alike.
pub const XFAIL: &str = "xfail";

/// Whether a skip `reason` is an expected failure's (pytest counts those
/// apart, as `xfailed`).
pub fn is_xfail(reason: &str) -> bool {
    reason.strip_prefix(XFAIL).is_some_and(|rest| rest.is_empty() || rest.starts_with(':'))
}

/// The skip reason of an expected failure whose own reason is `reason`
/// (`xfail: known bug`); `xfail` alone when it gave none.
pub fn xfail_reason(reason: Option<&str>) -> String {
    match reason.map(str::trim).filter(|r| !r.is_empty()) {
        Some(reason) => format!("{XFAIL}: {reason}"),
        None => XFAIL.to_owned(),
    }
}

/// An expected failure's own reason, from its skip reason (`known bug` of
/// `xfail: known bug`); `None` for a skip that is no expected failure, and
/// `Some("")` for one that gave no reason.
pub fn xfail_own_reason(reason: &str) -> Option<&str> {
    is_xfail(reason).then(|| reason[XFAIL.len()..].trim_start_matches(':').trim())
}

/// The skip reason in a finalized event's `errors` payload.
pub fn reason_of(errors: Option<&serde_json::Value>) -> Option<String> {
    errors?.get(SKIP_REASON)?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_unexpected_pass_keeps_its_reason_and_a_plain_pass_none() {
        use leasehold_core::Outcome;
        let xpass = super::finalize_request(Outcome::Passed, 1, Some("xpass: flaky on 3.11"));
        assert!(super::xpassed(xpass.errors.as_ref()));
        let plain = super::finalize_request(Outcome::Passed, 1, Some("anything"));
        assert_eq!(plain.errors, None);
        assert!(!super::is_xpass("xpassed_test"));
    }

    #[test]
    fn an_xfail_without_a_reason_says_xfail_alone() {
        assert_eq!(xfail_reason(Some("known bug")), "xfail: known bug");
        assert_eq!(xfail_reason(Some("  ")), "xfail");
        assert_eq!(xfail_reason(None), "xfail");
        assert_eq!(xfail_own_reason("xfail: known bug"), Some("known bug"));
        assert_eq!(xfail_own_reason("xfail"), Some(""));
        assert_eq!(xfail_own_reason("xfail: "), Some(""), "as an older agent wrote it");
        assert_eq!(xfail_own_reason("xfailed once"), None);
        assert_eq!(xfail_own_reason("not today"), None);
    }

    use super::*;

    #[test]
    fn a_skips_reason_rides_in_the_errors_payload() {
        let request = finalize_request(Outcome::Skipped, 3, Some("xfail: known bug"));
        assert_eq!(reason_of(request.errors.as_ref()).as_deref(), Some("xfail: known bug"));
        assert!(finalize_request(Outcome::Passed, 3, Some("x")).errors.is_none(), "only skips carry one");
        assert!(finalize_request(Outcome::Skipped, 3, Some("  ")).errors.is_none());
        request.validate().unwrap();
    }
}
