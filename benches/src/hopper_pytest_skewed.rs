//! `hopper-pytest`'s second suite, shaped like real ones: most tests in two
//! heavily parametrized files whose tests cost differently (as packaging's
//! `test_version.py` and `test_requirements.py` do), and a few small files.
//! File-level shards are uneven on it by construction.
//!
//! Measured: plain `python -m pytest` against `hopper run -j 2 --discover
//! pytest` (wall time), and hopper's own CPU per test: the hopper process's
//! user + system time read from `/proc` while it runs (not its agents').
//! Targets: agents ≤ 0.6 × plain pytest, hopper's own CPU ≤ 50 µs per test.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::hopper_local::round3;

/// Cheap tests in the first big file.
const CHEAP: usize = 9000;
/// Dearer tests (a little work each) in the second.
const DEAR: usize = 3000;
const SMALL_FILES: usize = 10;
const PER_SMALL: usize = 100;
/// Every test of the suite.
pub const TESTS: usize = CHEAP + DEAR + SMALL_FILES * PER_SMALL;

/// Writes the suite under `dir/skewed`; returns that directory.
pub fn write_suite(dir: &Path) -> Result<std::path::PathBuf> {
    let root = dir.join("skewed");
    let tests = root.join("tests");
    std::fs::create_dir_all(&tests)?;
    std::fs::write(
        tests.join("test_cheap.py"),
        format!("import pytest\n\n@pytest.mark.parametrize('n', range({CHEAP}))\ndef test_cheap(n):\n    assert n + 1 > n\n"),
    )?;
    std::fs::write(
        tests.join("test_dear.py"),
        format!(
            "import pytest\n\n@pytest.mark.parametrize('n', range({DEAR}))\ndef test_dear(n):\n    assert sum(range(n % 7 * 500 + 3000)) > 0\n"
        ),
    )?;
    for f in 0..SMALL_FILES {
        let mut text = String::new();
        for t in 0..PER_SMALL {
            text.push_str(&format!("def test_small_{t}():\n    assert {t} >= 0\n\n"));
        }
        std::fs::write(tests.join(format!("test_small_{f:02}.py")), text)?;
    }
    Ok(root)
}

/// Alternating pairs of runs (plain pytest, then hopper) the figures are the
/// medians of: one pair's ratio moved by ±0.05 between runs on the shared
/// 2-core VM. `HOPPER_BENCH_ROUNDS` sets another number.
const ROUNDS: usize = 3;

/// The figures of one comparison on the skewed suite (medians over rounds).
pub struct Skewed {
    pub plain_s: f64,
    pub agents_s: f64,
    /// The median of each round's agents ÷ plain.
    pub ratio: f64,
    pub ratios: Vec<f64>,
    pub hopper_cpu_us_per_test: f64,
}

impl Skewed {
    pub fn json(&self) -> serde_json::Value {
        json!({
            "skewed_tests": TESTS,
            "skewed_rounds": self.ratios.len(),
            "skewed_plain_pytest_s": round3(self.plain_s),
            "skewed_agents_s": round3(self.agents_s),
            "skewed_agents_over_plain": round3(self.ratio),
            "skewed_ratios": self.ratios.iter().map(|r| round3(*r)).collect::<Vec<_>>(),
            "skewed_hopper_cpu_us_per_test": round3(self.hopper_cpu_us_per_test),
        })
    }
}

/// Plain pytest, then hopper's agents, on the suite in `root`, in
/// alternating rounds. `plain` and `agents` make commands ready to run
/// there (program, arguments, environment).
pub fn compare(plain: impl Fn() -> Command, agents: impl Fn() -> Command) -> Result<Skewed> {
    let rounds = std::env::var("HOPPER_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(ROUNDS).max(1);
    let (mut plains, mut agentss, mut ratios, mut cpus) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let started = Instant::now();
        let out = plain().stdin(Stdio::null()).output().context("cannot start plain pytest")?;
        let plain_s = started.elapsed().as_secs_f64();
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !text.contains(&format!("{TESTS} passed")) {
            bail!("plain pytest did not pass {TESTS} tests: {}", text.lines().last().unwrap_or(""));
        }
        let (agents_s, cpu_s, text) = run_sampling_cpu(agents())?;
        if !text.contains(&format!("PASSED: {TESTS} units")) {
            bail!("hopper with agents did not pass {TESTS} units: {}", text.trim());
        }
        println!(
            "  skewed suite, round {}: plain {plain_s:.2}s, agents {agents_s:.2}s ({:.2}×)",
            ratios.len() + 1,
            agents_s / plain_s
        );
        plains.push(plain_s);
        agentss.push(agents_s);
        ratios.push(agents_s / plain_s);
        cpus.push(cpu_s * 1e6 / TESTS as f64);
    }
    let figures = Skewed {
        plain_s: median(&plains),
        agents_s: median(&agentss),
        ratio: median(&ratios),
        hopper_cpu_us_per_test: median(&cpus),
        ratios,
    };
    println!(
        "  skewed suite ({TESTS} tests, most in two files), medians of {rounds}: plain {:.2}s, agents {:.2}s ({:.2}×), hopper's own CPU {:.1} µs per test",
        figures.plain_s, figures.agents_s, figures.ratio, figures.hopper_cpu_us_per_test
    );
    Ok(figures)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Runs `cmd` to its end; returns its wall time, its own CPU seconds (the
/// last `/proc/<pid>/stat` read before it exited, its children not counted)
/// and its stdout.
fn run_sampling_cpu(mut cmd: Command) -> Result<(f64, f64, String)> {
    let started = Instant::now();
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
    let stdout = child.stdout.take().context("no stdout")?;
    let reader = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let stat = format!("/proc/{}/stat", child.id());
    // SAFETY: sysconf only reads a constant of the system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut cpu = 0.0;
    let status = loop {
        if let Ok(text) = std::fs::read_to_string(&stat) {
            // Fields after the command name (which may hold spaces): state is
            // the first, utime the 12th, stime the 13th.
            if let Some((_, rest)) = text.rsplit_once(')') {
                let fields: Vec<&str> = rest.split_whitespace().collect();
                if let (Some(u), Some(s)) = (fields.get(11), fields.get(12)) {
                    cpu = (u.parse::<f64>().unwrap_or(0.0) + s.parse::<f64>().unwrap_or(0.0)) / ticks;
                }
            }
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let wall = started.elapsed().as_secs_f64();
    let text = reader.join().unwrap_or_default();
    if !status.success() {
        bail!("hopper with agents failed ({status}): {}", text.trim());
    }
    Ok((wall, cpu, text))
}
