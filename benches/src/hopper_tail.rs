//! `hopper-tail`: does the end of a build wait on one slot? 2,000 pytest
//! tests whose durations follow a long tail (most take about 2 ms, the
//! slowest about 0.9 s), listed slowest last, on 2 hopper workers × 2 agent
//! slots sharing a private Redis, in two builds:
//! * `first`: no timings from an earlier run, so hopper cannot reorder the
//!   tests: the slots must share the slow tail as it comes. No scheduler
//!   that hands tests out in their listed order can end before
//!   `in_order_bound_s`: the greedy schedule of the planned durations on
//!   the slots (each test to the first free slot), with no cost between
//!   tests. On this suite it is about 1.12 × `ideal_s`, since the four
//!   slowest tests start together at the very end;
//! * `timed`: the next build of the same suite, with the first build's
//!   timings, so hopper hands the slowest out first.
//!
//! Each test records its agent (pid) and when it began and ended. Figures
//! of each build:
//! * `tail_idle_s`: from the moment the first slot ran out of work to the
//!   end of the last test (target: ≤ the longest single test);
//! * `wall_s` against `ideal_s` = max(sum of durations ÷ slots, longest
//!   test) (target: ≤ 1.05 ×). The wall time counts what no scheduler can
//!   spread: discovery and each agent's start-up and collection
//!   (`startup_s`, `agents_spread_s`), `time.sleep`'s overshoot (`slept_s`
//!   against `sum_s`) and pytest's own work between two tests
//!   (`between_tests_s`), and the end: from the last test's end to the
//!   workers' exit (`shutdown_s`);
//! * `slots_busy_share`: of the slots' time from the first test to the
//!   last, the share spent in a test or between two: the rest is a slot
//!   without work, at the start or in the tail, which is what scheduling
//!   can win back.
//!
//! Before the builds, the same suite runs in one plain pytest process
//! (`plain_pytest_s`), and under pytest-xdist with as many workers as
//! hopper has slots (`xdist_s`), the peer a team would otherwise use.
//! `pytest_bound_s` = `plain_pytest_s` ÷ slots is what a runner would take
//! if it split pytest's own work perfectly over the slots and added nothing
//! (start-up split too, so no runner can reach it); `ideal_s` leaves out
//! pytest's own start-up, its work between tests and `time.sleep`'s
//! overshoot, which on this suite of mostly 2 ms tests is about a fifth of
//! the sum. Each build gives `wall_over_pytest_bound`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use leasehold_redis::test_support::{unique_prefix, RedisServer};
use serde_json::json;

use crate::hopper_local::{hopper_binary, round3};
use crate::hopper_pytest::{path_env, python, timed};

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

/// The planned durations of the suite, in the listed order.
fn durations() -> Vec<f64> {
    (0..TESTS).map(duration_s).collect()
}

/// The end of the greedy schedule of `durations` (in order, each to the
/// slot that frees first) on `slots` slots.
fn greedy_end(durations: &[f64], slots: usize) -> f64 {
    let mut free_at = vec![0.0_f64; slots.max(1)];
    for duration in durations {
        let (first, _) = free_at.iter().enumerate().min_by(|a, b| a.1.total_cmp(b.1)).unwrap_or((0, &0.0));
        free_at[first] += duration;
    }
    free_at.into_iter().fold(0.0, f64::max)
}

/// Runs the benchmark; prints readable lines and returns its JSON figures.
pub async fn run() -> Result<serde_json::Value> {
    tokio::task::spawn_blocking(run_blocking).await.context("benchmark thread panicked")?
}

/// One suite, one Redis, one key prefix (so the second build reads the
/// first one's timings).
struct Bench {
    hopper: std::path::PathBuf,
    python: std::path::PathBuf,
    dir: tempfile::TempDir,
    url: String,
    prefix: String,
}

fn run_blocking() -> Result<serde_json::Value> {
    let dir = tempfile::tempdir().context("cannot make a temp dir")?;
    let server = RedisServer::start().map_err(anyhow::Error::msg).context("cannot start a private redis-server")?;
    let bench = Bench {
        hopper: hopper_binary()?,
        python: python()?,
        dir,
        url: server.url(),
        prefix: unique_prefix("hopper-tail"),
    };
    let slots = WORKERS * SLOTS_PER_WORKER;
    println!(
        "hopper-tail: {TESTS} long-tailed pytest tests, slowest last, {WORKERS} workers x {SLOTS_PER_WORKER} slots on {}",
        bench.url
    );
    let planned = durations();
    let sum: f64 = planned.iter().sum();
    let longest = planned.iter().copied().fold(0.0, f64::max);
    let ideal = (sum / slots as f64).max(longest);
    let in_order_bound = greedy_end(&planned, slots);
    println!(
        "  ideal {ideal:.2}s (sum {sum:.2}s / {slots} slots; longest test {longest:.2}s); \
         in the listed order no schedule ends before {in_order_bound:.2}s ({:.3}x)",
        in_order_bound / ideal
    );
    let plain = bench.pytest_alone("plain", &[])?;
    let xdist = bench.pytest_alone("xdist", &["-n", &slots.to_string()])?;
    let pytest_bound = plain / slots as f64;
    println!(
        "  one plain pytest process: {plain:.2}s ({:.3}x the sum), so {pytest_bound:.2}s per slot ({:.3}x ideal); \
         pytest-xdist -n {slots}: {xdist:.2}s ({:.3}x ideal)",
        plain / sum,
        pytest_bound / ideal,
        xdist / ideal
    );
    println!("  first build (no timings, the listed order):");
    let first = bench.build("first", ideal, longest, pytest_bound)?;
    println!("  timed build (the first build's timings: slowest first):");
    let timed = bench.build("timed", ideal, longest, pytest_bound)?;
    let mut figures = json!({
        "bench": "hopper-tail",
        "tests": TESTS,
        "slots": slots,
        "ideal_s": round3(ideal),
        "in_order_bound_s": round3(in_order_bound),
        "in_order_bound_over_ideal": round3(in_order_bound / ideal),
        "sum_s": round3(sum),
        "longest_s": round3(longest),
        "plain_pytest_s": round3(plain),
        "xdist_s": round3(xdist),
        "pytest_bound_s": round3(pytest_bound),
        "timed": timed,
    });
    // The first build's figures stay at the top level, as before.
    if let (Some(all), serde_json::Value::Object(first)) = (figures.as_object_mut(), first) {
        all.extend(first);
    }
    Ok(figures)
}

impl Bench {
    /// Runs the suite in pytest alone (one process, or pytest-xdist with
    /// `args`), checks that it passed, and returns its wall time.
    fn pytest_alone(&self, name: &str, args: &[&str]) -> Result<f64> {
        write_suite(self.dir.path(), &self.dir.path().join(format!("{name}.log")))?;
        let mut pytest = Command::new(&self.python);
        pytest.current_dir(self.dir.path()).args(["-m", "pytest", "-q", "-p", "no:cacheprovider"]).args(args);
        let (wall, _) = timed(pytest, &format!("pytest {args:?} on the suite"))?;
        Ok(wall.as_secs_f64())
    }

    /// Runs build `build` on every worker, checks its report, and returns
    /// its figures.
    fn build(&self, build: &str, ideal: f64, longest: f64, pytest_bound: f64) -> Result<serde_json::Value> {
        let dir = self.dir.path();
        let log = dir.join(format!("{build}.log"));
        write_suite(dir, &log)?;
        let slots = WORKERS * SLOTS_PER_WORKER;
        let started = Instant::now();
        let started_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .context("the clock is before 1970")?
            .as_secs_f64();
        let mut children = Vec::new();
        for w in 0..WORKERS {
            let child = Command::new(&self.hopper)
                .current_dir(dir)
                .env("PATH", path_env(&self.python))
                .args(["run", "-j", &SLOTS_PER_WORKER.to_string(), "--quiet", "--queue", &self.url])
                .args(["--key-prefix", &self.prefix, "--build", build, "--worker", &format!("w{w}")])
                .args(["--discover", "pytest", "--"])
                .arg(&self.python)
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
        let report = Command::new(&self.hopper)
            .current_dir(dir)
            .args(["report", "--queue", &self.url, "--key-prefix", &self.prefix, "--build", build, "--slowest", "0"])
            .stdin(Stdio::null())
            .output()
            .context("cannot run hopper report")?;
        let text = String::from_utf8_lossy(&report.stdout);
        if !report.status.success() || !text.contains(&format!("PASSED: {TESTS} units")) {
            bail!("hopper report did not pass build {build} ({}): {}", report.status, text.trim());
        }
        let spans = Spans::read(&log)?;
        let figures = spans.figures(started_at, wall, ideal, slots);
        println!(
            "    wall {wall:.2}s: {:.3}x ideal; start-up {:.2}s to the first test (the last agent began {:.2}s after it); \
             tests ran for {:.2}s ({:.3}x ideal): {:.2}s asleep, {:.2}s between tests; slots busy {:.1}% of it; \
             {:.2}s from the last test's end to the workers' exit",
            figures.wall_over_ideal,
            figures.startup,
            figures.agents_spread,
            figures.run_phase,
            figures.run_phase / ideal,
            figures.slept,
            figures.between,
            figures.busy_share * 100.0,
            figures.shutdown,
        );
        println!(
            "    tail: {:.2}s from the first slot out of work to the last test's end ({} agents; target <= {longest:.2}s)",
            figures.tail_idle, figures.agents
        );
        println!("    against pytest's own time split over the slots: {:.3}x", wall / pytest_bound);
        let mut json = figures.json(wall, ideal);
        json["wall_over_pytest_bound"] = json!(round3(wall / pytest_bound));
        Ok(json)
    }
}

/// Each agent's tests, in order: (began, ended), from a suite's log.
struct Spans(Vec<Vec<(f64, f64)>>);

impl Spans {
    fn read(log: &Path) -> Result<Self> {
        let ended = std::fs::read_to_string(log).context("the tests wrote no log")?;
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
        let mut agents: Vec<Vec<(f64, f64)>> = by_agent.into_values().collect();
        for tests in &mut agents {
            tests.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        Ok(Self(agents))
    }

    fn figures(&self, started_at: f64, wall: f64, ideal: f64, slots: usize) -> Figures {
        let (mut slept, mut between) = (0.0, 0.0);
        let mut spans = Vec::new();
        for tests in &self.0 {
            slept += tests.iter().map(|(b, e)| e - b).sum::<f64>();
            between += tests.windows(2).map(|w| w[1].0 - w[0].1).sum::<f64>();
            let first = tests.first().map_or(0.0, |t| t.0);
            let last = tests.iter().map(|t| t.1).fold(f64::NEG_INFINITY, f64::max);
            spans.push((first, last));
        }
        // The first agent to run out of work, and the build's last test.
        let first_idle = spans.iter().map(|s| s.1).fold(f64::INFINITY, f64::min);
        let end = spans.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
        // Before the first test: discovery, then each agent's start-up and collection.
        let first_test = spans.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
        let last_agent_began = spans.iter().map(|s| s.0).fold(f64::NEG_INFINITY, f64::max);
        let run_phase = end - first_test;
        // The share of the slots' time, from the first test to the last,
        // spent in a test or between two of them (pytest's own per-test
        // work): what is left is a slot with no work, at the start (agents
        // still collecting) or at the end (the tail).
        let in_tests: f64 = spans.iter().map(|(first, last)| last - first).sum();
        Figures {
            agents: spans.len(),
            wall_over_ideal: wall / ideal,
            tail_idle: end - first_idle,
            startup: first_test - started_at,
            agents_spread: last_agent_began - first_test,
            run_phase,
            slept,
            between,
            busy_share: in_tests / (slots as f64 * run_phase),
            shutdown: started_at + wall - end,
        }
    }
}

/// One build's figures (seconds unless named otherwise).
struct Figures {
    agents: usize,
    wall_over_ideal: f64,
    tail_idle: f64,
    startup: f64,
    agents_spread: f64,
    run_phase: f64,
    slept: f64,
    between: f64,
    busy_share: f64,
    shutdown: f64,
}

impl Figures {
    fn json(&self, wall: f64, ideal: f64) -> serde_json::Value {
        json!({
            "agents": self.agents,
            "wall_s": round3(wall),
            "wall_over_ideal": round3(self.wall_over_ideal),
            "tail_idle_s": round3(self.tail_idle),
            "startup_s": round3(self.startup),
            "agents_spread_s": round3(self.agents_spread),
            "run_phase_s": round3(self.run_phase),
            "run_phase_over_ideal": round3(self.run_phase / ideal),
            "slept_s": round3(self.slept),
            "between_tests_s": round3(self.between),
            "slots_busy_share": round3(self.busy_share),
            "shutdown_s": round3(self.shutdown),
        })
    }
}
