//! What `hopper report --html` draws, read back from the page: where each
//! attempt of each unit sits on the timeline.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

/// Where each attempt of each unit ran: `unit → [(worker, slot + 1)]`, in order.
pub type Placements = BTreeMap<String, Vec<(String, u64)>>;

/// Where the page's timeline draws each attempt of each unit.
pub fn drawn(page: &Path) -> Placements {
    let html = std::fs::read_to_string(page).expect("the page was written");
    let start = html.find(r#"id="timeline-data">"#).expect("the page's timeline data") + r#"id="timeline-data">"#.len();
    let end = start + html[start..].find("</script>").expect("the end of the data");
    let data: Value = serde_json::from_str(&html[start..end]).expect("the timeline data is JSON");
    let lanes = data["lanes"].as_array().expect("lanes");
    let mut bars: Vec<(String, u64, String, u64)> = Vec::new();
    for bar in data["bars"].as_array().expect("bars") {
        let unit = bar[4].as_str().expect("a bar's unit").to_owned();
        if unit.is_empty() {
            continue; // a batch's start-up
        }
        let lane = &lanes[bar[0].as_u64().expect("a bar's lane") as usize];
        let attempt = bar[5].as_u64().expect("a bar's attempt");
        let worker = lane["worker"].as_str().expect("a lane's worker").to_owned();
        bars.push((unit, attempt, worker, lane["slot"].as_u64().expect("a lane's slot")));
    }
    bars.sort();
    let mut out = Placements::new();
    for (unit, _, worker, slot) in bars {
        out.entry(unit).or_default().push((worker, slot));
    }
    out
}

/// Each line of a log of `unit worker slot` lines (`slot` from
/// `HOPPER_SLOT`): where the tests said they ran.
pub fn recorded(log: &Path) -> Placements {
    let mut out = Placements::new();
    for line in std::fs::read_to_string(log).expect("the tests wrote slots.log").lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        let [unit, worker, slot] = parts[..] else { panic!("a malformed line in slots.log: {line:?}") };
        let slot: u64 = slot.parse().expect("HOPPER_SLOT is a number");
        out.entry(unit.to_owned()).or_default().push((worker.to_owned(), slot + 1));
    }
    out
}
