//! `hopper-tail`: does the end of a build wait on one slot? 2,000 pytest
//! tests whose durations follow a long tail (most take about 2 ms, the
//! slowest about 0.9 s), listed slowest last, on 2 hopper workers × 2 agent
//! slots sharing a private Redis. No timings from an earlier run, so hopper
//! cannot reorder them: the slots must share the slow tail as it comes.
//!
//! Each test records its agent (pid) and when it began and ended. Figures:
//! * `tail_idle_s`: from the moment the first slot ran out of work to the
//!   end of the last test (target: ≤ the longest single test);
//! * `wall_s` against `ideal_s` = max(sum of durations ÷ slots, longest
//!   test) (target: ≤ 1.05 ×). The wall time counts what no scheduler can
//!   spread: discovery and each agent's start-up and collection
//!   (`startup_s`, `agents_spread_s`), `time.sleep`'s overshoot (`slept_s`
//!   against `sum_s`) and pytest's own work between two tests
//!   (`between_tests_s`);
//! * `slots_busy_share`: of the slots' time from the first test to the
//!   last, the share spent in a test or between two: the rest is a slot
//!   without work, at the start or in the tail, which is what scheduling
//!   can win back.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use leasehold_redis::test_support::{unique_prefix, RedisServer};
use serde_json::json;

use crate::hopper_local::{hopper_binary, round3};
use crate::hopper_pytest::{path_env, python};

/// Tests in the suite.
const TESTS: usize = 2000;
/// Worker processes and slots (agents) in each.
const WORKERS: usize = 2;
const SLOTS_PER_WORKER: usize = 2;

/// Test `i`'s planned duration (seconds): 2 ms × (N ÷ (N − i))^0.8, so the
/// sum is about 20 s and the last test the longest (about 0.87 s).
fn duration_s(i: usize) -> f64 {
    0.002 * (TESTS as f64 / (TESTS - i) as f64).powf(0.8)
}

fn write_suite(dir: &Path, log: &Path) -> Result<()> {
    let mut text = format!("import os, time\n\nLOG = {:?}\n\n", log.display().to_string());
    text.push_str(
        "def _ran(seconds):\n    began = time.time()\n    time.sleep(seconds)\n    with open(LOG, 'a') as f:\n        \
         f.write(f'{os.getpid()} {began} {time.time()}\\n')\n\n",
    );
    for i in 0..TESTS {
        text.push_str(&format!("def test_{i:04}():\n    _ran({:.6})\n\n", duration_s(i)));
    }
    std::fs::write(dir.join("test_tail.py"), text).context("cannot write the suite")
}

/// Runs the benchmark; prints readable lines and returns its JSON figures.
pub async fn run() -> Result<serde_json::Value> {
    tokio::task::spawn_blocking(run_blocking).await.context("benchmark thread panicked")?
}

fn run_blocking() -> Result<serde_json::Value> {
    let hopper = hopper_binary()?;
    let python = python()?;
    let dir = tempfile::tempdir().context("cannot make a temp dir")?;
    let log = dir.path().join("ended.log");
    write_suite(dir.path(), &log)?;
    let server = RedisServer::start().map_err(anyhow::Error::msg).context("cannot start a private redis-server")?;
    let url = server.url();
    let (prefix, build) = (unique_prefix("hopper-tail"), "tail".to_owned());
    let slots = WORKERS * SLOTS_PER_WORKER;
    println!("hopper-tail: {TESTS} long-tailed pytest tests, slowest last, {WORKERS} workers x {SLOTS_PER_WORKER} slots on {url}");

    let started = Instant::now();
    let mut children = Vec::new();
    for w in 0..WORKERS {
        let child = Command::new(&hopper)
            .current_dir(dir.path())
            .env("PATH", path_env(&python))
            .args(["run", "-j", &SLOTS_PER_WORKER.to_string(), "--quiet", "--no-timings", "--queue", &url])
            .args(["--key-prefix", &prefix, "--build", &build, "--worker", &format!("w{w}")])
            .args(["--discover", "pytest", "--"])
            .arg(&python)
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start hopper run")?;
        children.push(child);
    }
    for child in children {
        let output = child.wait_with_output().context("waiting for hopper run")?;
        if !output.status.success() {
            bail!("hopper run failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let report = Command::new(&hopper)
        .current_dir(dir.path())
        .args(["report", "--queue", &url, "--key-prefix", &prefix, "--build", &build, "--slowest", "0"])
        .stdin(Stdio::null())
        .output()
        .context("cannot run hopper report")?;
    let text = String::from_utf8_lossy(&report.stdout);
    if !report.status.success() || !text.contains(&format!("PASSED: {TESTS} units")) {
        bail!("hopper report did not pass the build ({}): {}", report.status, text.trim());
    }

    // Each agent's tests in order: (began, ended).
    let ended = std::fs::read_to_string(&log).context("the tests wrote no log")?;
    let mut by_agent: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for line in ended.lines() {
        let mut fields = line.split(' ');
        let (Some(pid), Some(began), Some(at)) = (fields.next(), fields.next(), fields.next()) else {
            bail!("a malformed log line: {line:?}");
        };
        let began: f64 = began.parse().context("a malformed start time in the log")?;
        let at: f64 = at.parse().context("a malformed end time in the log")?;
        by_agent.entry(pid).or_default().push((began, at));
    }
    let lines: usize = by_agent.values().map(Vec::len).sum();
    if lines != TESTS {
        bail!("{lines} tests ran, not {TESTS}");
    }
    let mut spans = Vec::new();
    let (mut slept, mut between) = (0.0, 0.0);
    for tests in by_agent.values_mut() {
        tests.sort_by(|a, b| a.0.total_cmp(&b.0));
        slept += tests.iter().map(|(b, e)| e - b).sum::<f64>();
        between += tests.windows(2).map(|w| w[1].0 - w[0].1).sum::<f64>();
        let first = tests.first().map_or(0.0, |t| t.0);
        let last = tests.iter().map(|t| t.1).fold(f64::NEG_INFINITY, f64::max);
        spans.push((first, last));
    }
    // The first agent to run out of work, and the build's last test.
    let first_idle = spans.iter().map(|s| s.1).fold(f64::INFINITY, f64::min);
    let end = spans.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
    let tail_idle = end - first_idle;
    // Before the first test: discovery, then each agent's start-up and collection.
    let first_test = spans.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
    let last_agent_began = spans.iter().map(|s| s.0).fold(f64::NEG_INFINITY, f64::max);
    let run_phase = end - first_test;
    // The share of the slots' time, from the first test to the last, spent in
    // a test or between two of them (pytest's own per-test work): what is
    // left is a slot with no work, at the start (agents still collecting)
    // or at the end (the tail).
    let in_tests: f64 = spans.iter().map(|(first, last)| last - first).sum();
    let busy_share = in_tests / (slots as f64 * run_phase);
    let started_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the clock is before 1970")?
        .as_secs_f64()
        - started.elapsed().as_secs_f64();
    let startup = first_test - started_at;
    let agents_spread = last_agent_began - first_test;
    let sum: f64 = (0..TESTS).map(duration_s).sum();
    let longest = duration_s(TESTS - 1);
    let ideal = (sum / slots as f64).max(longest);
    println!(
        "  wall {wall:.2}s, ideal {ideal:.2}s (sum {sum:.2}s / {slots} slots; longest test {longest:.2}s): {:.3}x",
        wall / ideal
    );
    println!(
        "  start-up {startup:.2}s to the first test (the last agent began {agents_spread:.2}s after it); \
         tests ran for {run_phase:.2}s ({:.3}x ideal): {slept:.2}s asleep (planned {sum:.2}s), \
         {between:.2}s between tests; slots busy {:.1}% of it",
        run_phase / ideal,
        busy_share * 100.0
    );
    println!(
        "  tail: {tail_idle:.2}s from the first slot out of work to the last test's end ({} agents; target <= {longest:.2}s)",
        spans.len()
    );
    Ok(json!({
        "bench": "hopper-tail",
        "tests": TESTS,
        "slots": slots,
        "agents": spans.len(),
        "wall_s": round3(wall),
        "ideal_s": round3(ideal),
        "wall_over_ideal": round3(wall / ideal),
        "sum_s": round3(sum),
        "longest_s": round3(longest),
        "tail_idle_s": round3(tail_idle),
        "startup_s": round3(startup),
        "agents_spread_s": round3(agents_spread),
        "run_phase_s": round3(run_phase),
        "run_phase_over_ideal": round3(run_phase / ideal),
        "slept_s": round3(slept),
        "between_tests_s": round3(between),
        "slots_busy_share": round3(busy_share),
    }))
}
