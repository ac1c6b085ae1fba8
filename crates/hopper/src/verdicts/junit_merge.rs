//! Test cases with several status elements, made readable.
//!
//! pytest 9's subtests write one `<failure>` per failed subtest, and a
//! test whose call failed and whose teardown errored gets a `<failure>` and
//! an `<error>`, all in one `<testcase>`. JUnit's schema allows one, and
//! quick-junit rejects the whole report ("multiple main status elements"),
//! which failed every test of the batch. So before the report is parsed,
//! the status elements of such a case become one, carrying every message
//! and text: a `<failure>` when any was a failure. A teardown error is
//! taken out and returned apart (it is an error outside the test, see
//! [`super::outside`]).
//!
//! This works on the text: in XML, `<` inside text and attribute values is
//! always escaped, so every `<failure`, `<error` or `<skipped` is a tag.

/// One status element of a case, as written.
struct Status {
    tag: &'static str,
    /// Its `message` attribute, still escaped.
    message: Option<String>,
    /// Its text, still escaped.
    text: String,
    /// Where it is in the case's text.
    span: std::ops::Range<usize>,
}

/// The teardown error taken out of case `case` (0-based, in report order):
/// its message and text, unescaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenTeardown {
    /// The case's index.
    pub case: usize,
    /// The `message` attribute.
    pub message: String,
    /// The element's text.
    pub text: String,
}

const STATUS_TAGS: [&str; 3] = ["failure", "error", "skipped"];
const PYTEST_TEARDOWN: &str = "failed on teardown with ";

/// `xml` with every case's status elements merged into one, and the
/// teardown errors taken out of cases that had another status; `None`
/// when no case needed it.
pub fn merge_statuses(xml: &str) -> Option<(String, Vec<TakenTeardown>)> {
    let mut out = String::with_capacity(xml.len());
    let mut taken = Vec::new();
    let mut changed = false;
    let mut rest = xml;
    let mut case = 0;
    while let Some(start) = find_tag(rest, "testcase") {
        let Some(len) = rest[start..].find("</testcase>").map(|l| l + "</testcase>".len()) else { break };
        // A self-closing case ends before any `</testcase>`.
        let head_end = rest[start..].find('>').map_or(len, |e| e + 1);
        let whole = if rest[start..start + head_end].ends_with("/>") { head_end } else { len };
        out.push_str(&rest[..start]);
        let body = &rest[start..start + whole];
        match merge_case(body, case, &mut taken) {
            Some(merged) => {
                changed = true;
                out.push_str(&merged);
            }
            None => out.push_str(body),
        }
        rest = &rest[start + whole..];
        case += 1;
    }
    out.push_str(rest);
    changed.then_some((out, taken))
}

/// Where `<tag` starts in `text` as a whole tag name (`<error` is not `<errors`).
fn find_tag(text: &str, tag: &str) -> Option<usize> {
    let needle = format!("<{tag}");
    let mut from = 0;
    while let Some(at) = text[from..].find(&needle) {
        let at = from + at;
        let next = text[at + needle.len()..].chars().next();
        if next.is_some_and(|c| c.is_whitespace() || c == '>' || c == '/') {
            return Some(at);
        }
        from = at + needle.len();
    }
    None
}

fn statuses(case: &str) -> Vec<Status> {
    let mut found = Vec::new();
    for tag in STATUS_TAGS {
        let mut from = 0;
        while let Some(at) = find_tag(&case[from..], tag) {
            let start = from + at;
            let Some(head) = case[start..].find('>') else { break };
            let head_text = &case[start..start + head + 1];
            let (text, end) = if head_text.ends_with("/>") {
                (String::new(), start + head + 1)
            } else {
                let close = format!("</{tag}>");
                let Some(body) = case[start + head + 1..].find(&close) else { break };
                let text_start = start + head + 1;
                (case[text_start..text_start + body].to_owned(), text_start + body + close.len())
            };
            let message = attribute(head_text, "message");
            found.push(Status { tag, message, text, span: start..end });
            from = end;
        }
    }
    found.sort_by_key(|s| s.span.start);
    found
}

fn attribute(head: &str, name: &str) -> Option<String> {
    let needle = format!(" {name}=\"");
    let at = head.find(&needle)? + needle.len();
    let len = head[at..].find('"')?;
    Some(head[at..at + len].to_owned())
}

fn merge_case(case: &str, index: usize, taken: &mut Vec<TakenTeardown>) -> Option<String> {
    let mut found = statuses(case);
    if found.len() < 2 {
        return None;
    }
    let teardown = found.iter().position(|s| {
        s.tag == "error" && s.message.as_deref().is_some_and(|m| unescape(m).starts_with(PYTEST_TEARDOWN))
    });
    let mut removed = Vec::new();
    if let Some(at) = teardown {
        let error = found.remove(at);
        taken.push(TakenTeardown {
            case: index,
            message: unescape(error.message.as_deref().unwrap_or_default()),
            text: unescape(&error.text),
        });
        removed.push(error.span);
    }
    // Skips next to a failure say nothing more: the case failed.
    let failing: Vec<&Status> = found.iter().filter(|s| s.tag != "skipped").collect();
    let merged = match failing.as_slice() {
        [] => None,
        [only] => Some(case[only.span.clone()].to_owned()),
        many => {
            let tag = if many.iter().any(|s| s.tag == "failure") { "failure" } else { "error" };
            let messages: Vec<&str> = many.iter().filter_map(|s| s.message.as_deref()).collect();
            let texts: Vec<&str> = many.iter().map(|s| s.text.as_str()).filter(|t| !t.is_empty()).collect();
            Some(format!("<{tag} message=\"{}\">{}</{tag}>", messages.join("; "), texts.join("\n\n")))
        }
    };
    let mut spans: Vec<std::ops::Range<usize>> = found.iter().map(|s| s.span.clone()).chain(removed).collect();
    spans.sort_by_key(|s| s.start);
    let mut out = String::with_capacity(case.len());
    let mut at = 0;
    let mut merged = merged.or_else(|| found.first().map(|s| case[s.span.clone()].to_owned()));
    for span in spans {
        out.push_str(&case[at..span.start]);
        // The one status goes where the first was.
        if let Some(text) = merged.take() {
            out.push_str(&text);
        }
        at = span.end;
    }
    out.push_str(&case[at..]);
    Some(out)
}

/// XML's five escapes and numeric references, undone.
fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let Some(end) = rest[at..].find(';') else {
            out.push_str(&rest[at..]);
            return out;
        };
        let entity = &rest[at + 1..at + end];
        let decoded = match entity {
            "lt" => Some('<'),
            "gt" => Some('>'),
            "amp" => Some('&'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| entity.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => out.push(c),
            None => out.push_str(&rest[at..at + end + 1]),
        }
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtests_failures_become_one_failure_with_every_message() {
        let xml = r#"<testsuites><testsuite name="pytest"><testcase classname="t" name="test_sub"><failure message="AssertionError: i is 1">E  i is 1</failure><failure message="AssertionError: i is 2">E  i is 2</failure><failure message="contains 2 failed subtests">contains 2 failed subtests</failure></testcase><testcase classname="t" name="test_ok" /></testsuite></testsuites>"#;
        let (merged, taken) = merge_statuses(xml).unwrap();
        assert!(taken.is_empty());
        assert!(
            merged.contains(r#"<failure message="AssertionError: i is 1; AssertionError: i is 2; contains 2 failed subtests">E  i is 1"#),
            "{merged}"
        );
        assert_eq!(merged.matches("<failure").count(), 1, "{merged}");
        assert!(merged.contains(r#"<testcase classname="t" name="test_ok" />"#), "{merged}");
        assert_eq!(
            merge_statuses(
                r#"<testsuites><testsuite name="p"><testcase name="x"><failure message="m"/></testcase></testsuite></testsuites>"#
            ),
            None
        );
    }

    #[test]
    fn a_teardown_error_next_to_a_failure_is_taken_out() {
        let xml = r#"<testsuites><testsuite name="p"><testcase name="a" /><testcase classname="t" name="b"><failure message="assert 1 == 2">F</failure><error message="failed on teardown with &quot;RuntimeError: boom&quot;">E boom &amp; more</error></testcase></testsuite></testsuites>"#;
        let (merged, taken) = merge_statuses(xml).unwrap();
        assert_eq!(
            taken,
            vec![TakenTeardown {
                case: 1,
                message: "failed on teardown with \"RuntimeError: boom\"".into(),
                text: "E boom & more".into()
            }]
        );
        assert!(
            merged.contains(
                r#"<testcase classname="t" name="b"><failure message="assert 1 == 2">F</failure></testcase>"#
            ),
            "{merged}"
        );
    }
}
