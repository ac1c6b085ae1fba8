//! The build as one self-contained HTML page (`--html FILE`): each worker's
//! lanes over time with a bar per attempt coloured by outcome, the idle time
//! at the end of the build, the slowest units, the flaky ones and the
//! failures with their output.
//!
//! Nothing is fetched from the network: the CSS and the script are inline,
//! the timeline's data is a JSON block in the page, and the script draws it
//! as SVG sized to the window. The tables are plain HTML, readable without
//! the script.

use std::fmt::Write as _;
use std::path::Path;

use html_escape::encode_text;
use leasehold_core::Outcome;

use super::run_report::{RunReport, UnitReport};
use crate::errors::HopperError;
use crate::report::timeline::{BarKind, Timeline};

/// Lines of output shown per failure.
const OUTPUT_LINES: usize = 60;

const STYLE: &str = include_str!("html/style.css");
const SCRIPT: &str = include_str!("html/timeline.js");

/// Writes the page for `report` and `timeline` to `path`.
pub fn write_html(path: &Path, report: &RunReport, timeline: &Timeline, slowest: usize) -> Result<(), HopperError> {
    let page = render(report, timeline, slowest);
    let fail = |source| HopperError::Html { path: path.to_owned(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    std::fs::write(path, page).map_err(fail)
}

/// `1.25 s`, `850 ms`, `2 min 03 s`.
pub fn human_ms(ms: u64) -> String {
    match ms {
        0..1000 => format!("{ms} ms"),
        1000..60_000 => format!("{:.2} s", ms as f64 / 1000.0),
        _ => format!("{} min {:02} s", ms / 60_000, (ms % 60_000) / 1000),
    }
}

/// The page.
pub fn render(report: &RunReport, timeline: &Timeline, slowest: usize) -> String {
    let mut page = String::with_capacity(64 * 1024 + timeline.bars.len() * 96);
    let run = encode_text(report.run.as_str());
    let passed = report.passed();
    let verdict = if passed { "PASSED" } else { "FAILED" };
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>hopper build {run}: {verdict}</title><style>{STYLE}</style></head><body>\n"
    );
    let _ = writeln!(
        page,
        "<header><h1>hopper build <code>{run}</code> <span class=\"verdict {}\">{verdict}</span></h1>{}</header>",
        if passed { "passed" } else { "failed" },
        summary(report, timeline)
    );
    let _ = write!(page, "<section id=\"timeline\"><h2>Timeline</h2>{}", legend());
    page.push_str(
        "<p class=\"hint\">One row per slot of each worker; hover a bar for the unit, click it to mark all its \
         attempts. Hatched: idle at the end of the build.</p><div id=\"chart\"></div></section>\n",
    );
    page.push_str(&slowest_table(report, slowest));
    page.push_str(&flaky_table(report));
    page.push_str(&failures(report));
    let _ = write!(
        page,
        "<script type=\"application/json\" id=\"timeline-data\">{}</script>\n<script>{SCRIPT}</script>\n</body></html>\n",
        data_json(timeline)
    );
    page
}

fn summary(report: &RunReport, timeline: &Timeline) -> String {
    let count = |f: &dyn Fn(&UnitReport) -> bool| report.units.iter().filter(|u| f(u)).count();
    let total = report.units.len();
    let passed = count(&|u| u.outcome == Some(Outcome::Passed));
    let skipped = count(&|u| u.outcome == Some(Outcome::Skipped));
    let failed = count(&|u| u.is_failed());
    let flaky = count(&|u| u.is_flaky());
    let unfinished = count(&|u| u.outcome.is_none());
    let workers = {
        let mut names: Vec<&str> = timeline.lanes.iter().map(|l| l.worker.as_str()).collect();
        names.dedup();
        names.len()
    };
    let lanes = timeline.lanes.len();
    let slot_time = timeline.span_ms.saturating_mul(lanes as u64);
    let busy: u64 = timeline.lanes.iter().map(|l| l.busy_ms).sum();
    let percent = |part: u64| if slot_time == 0 { 0.0 } else { 100.0 * part as f64 / slot_time as f64 };
    let worst = timeline.lanes.iter().max_by_key(|l| l.idle_at_end_ms);
    let mut out = String::from("<dl class=\"summary\">");
    let mut item = |name: &str, value: String| {
        let _ = write!(out, "<div><dt>{name}</dt><dd>{value}</dd></div>");
    };
    item("units", total.to_string());
    item("passed", format!("{passed} ({flaky} flaky)"));
    item("failed", failed.to_string());
    if skipped > 0 {
        item("skipped", skipped.to_string());
    }
    if unfinished > 0 {
        item("unfinished", unfinished.to_string());
    }
    item("wall time", human_ms(timeline.span_ms));
    item("workers / slots", format!("{workers} / {lanes}"));
    item("slots busy", format!("{:.0} %", percent(busy)));
    item(
        "idle at the end",
        format!(
            "<span id=\"idle-at-end\">{}</span> ({:.0} % of slot time{})",
            human_ms(timeline.idle_at_end_ms),
            percent(timeline.idle_at_end_ms),
            worst
                .filter(|l| l.idle_at_end_ms > 0)
                .map(|l| format!("; longest: {} #{}, {}", encode_text(&l.worker), l.slot, human_ms(l.idle_at_end_ms)))
                .unwrap_or_default()
        ),
    );
    out.push_str("</dl>");
    out
}

fn legend() -> String {
    let mut out = String::from("<ul class=\"legend\">");
    for kind in BarKind::ALL {
        let _ = write!(
            out,
            "<li><span class=\"swatch\" style=\"background:{}\"></span>{}</li>",
            kind.colour(),
            kind.as_str()
        );
    }
    out.push_str("<li><span class=\"swatch idle\"></span>idle at end</li></ul>");
    out
}

fn slowest_table(report: &RunReport, n: usize) -> String {
    let slow = report.slowest(n);
    let mut out = String::from("<section id=\"slowest\"><h2>Slowest units</h2>");
    if slow.is_empty() {
        out.push_str("<p>No unit finished.</p></section>\n");
        return out;
    }
    out.push_str("<table><thead><tr><th>time</th><th>unit</th><th>outcome</th><th>worker</th></tr></thead><tbody>");
    for unit in slow {
        let _ = write!(
            out,
            "<tr><td class=\"num\">{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
            human_ms(unit.duration_ms),
            encode_text(unit.unit.as_str()),
            outcome_name(unit),
            unit.finalized_by.as_ref().map(|w| encode_text(w.as_str()).into_owned()).unwrap_or_default()
        );
    }
    out.push_str("</tbody></table></section>\n");
    out
}

fn outcome_name(unit: &UnitReport) -> &'static str {
    match unit.outcome {
        Some(Outcome::Passed) if unit.is_flaky() => "flaky",
        Some(Outcome::Passed) => "passed",
        Some(Outcome::Failed) => "failed",
        Some(Outcome::Skipped) => "skipped",
        None => "unfinished",
    }
}

fn flaky_table(report: &RunReport) -> String {
    let flaky: Vec<&UnitReport> = report.flaky().collect();
    let mut out = format!("<section id=\"flaky\"><h2>Flaky units ({})</h2>", flaky.len());
    if flaky.is_empty() {
        out.push_str("<p>None: no unit failed and then passed.</p></section>\n");
        return out;
    }
    out.push_str("<table><thead><tr><th>unit</th><th>failed attempts</th></tr></thead><tbody>");
    for unit in flaky {
        let details: Vec<String> = unit.failed_attempts.iter().map(|a| encode_text(&a.detail).into_owned()).collect();
        let _ = write!(
            out,
            "<tr><td><code>{}</code></td><td>{}×: {}</td></tr>",
            encode_text(unit.unit.as_str()),
            details.len(),
            details.join("; ")
        );
    }
    out.push_str("</tbody></table></section>\n");
    out
}

fn failures(report: &RunReport) -> String {
    let failed: Vec<&UnitReport> = report.failed().collect();
    let unfinished = report.unfinished();
    let mut out = format!("<section id=\"failures\"><h2>Failures ({})</h2>", failed.len());
    if failed.is_empty() {
        out.push_str("<p>None.</p>");
    }
    for unit in failed {
        let last = unit.failed_attempts.last();
        let detail = last.map(|a| a.detail.as_str()).unwrap_or("failed");
        let reason = unit.reason.as_ref().map(|r| format!(", {}", r.as_str())).unwrap_or_default();
        let _ = write!(
            out,
            "<details class=\"failure\" open><summary><code>{}</code>: {} <span class=\"muted\">({} failed \
             attempt(s){})</span></summary>",
            encode_text(unit.unit.as_str()),
            encode_text(detail),
            unit.failed_attempts.len(),
            encode_text(&reason)
        );
        if let Some(attempt) = last.filter(|a| !a.output.is_empty()) {
            let lines: Vec<&str> = attempt.output.lines().collect();
            let tail = lines[lines.len().saturating_sub(OUTPUT_LINES)..].join("\n");
            let _ = write!(out, "<pre>{}</pre>", encode_text(&tail));
        }
        out.push_str("</details>");
    }
    if !unfinished.is_empty() {
        let names: Vec<String> =
            unfinished.iter().map(|u| format!("<code>{}</code>", encode_text(u.as_str()))).collect();
        let _ = write!(out, "<p class=\"unfinished\">Unfinished ({}): {}</p>", unfinished.len(), names.join(", "));
    }
    out.push_str("</section>\n");
    out
}

/// The timeline as compact JSON for the script, safe inside `<script>`.
fn data_json(timeline: &Timeline) -> String {
    let kinds: Vec<serde_json::Value> =
        BarKind::ALL.iter().map(|k| serde_json::json!({ "name": k.as_str(), "colour": k.colour() })).collect();
    let kind_index = |kind: BarKind| BarKind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
    let bars: Vec<serde_json::Value> = timeline
        .bars
        .iter()
        .map(|b| serde_json::json!([b.lane, b.start_ms, b.end_ms, kind_index(b.kind), b.unit, b.attempt, b.note]))
        .collect();
    let data = serde_json::json!({
        "span_ms": timeline.span_ms,
        "started_at_ms": timeline.started_at_ms,
        "lanes": timeline.lanes,
        "kinds": kinds,
        "bars": bars,
    });
    // JSON has `<` only inside strings, where `\u003c` means the same: so no
    // `</script>` or `<!--` can end the block early.
    data.to_string().replace('<', "\\u003c")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_a_person_writes_them() {
        assert_eq!(human_ms(850), "850 ms");
        assert_eq!(human_ms(1250), "1.25 s");
        assert_eq!(human_ms(123_000), "2 min 03 s");
    }
}
