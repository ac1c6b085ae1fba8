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

/// The figures of one comparison on the skewed suite.
pub struct Skewed {
    pub plain_s: f64,
    pub agents_s: f64,
    pub hopper_cpu_us_per_test: f64,
}

impl Skewed {
    pub fn json(&self) -> serde_json::Value {
        json!({
            "skewed_tests": TESTS,
            "skewed_plain_pytest_s": round3(self.plain_s),
            "skewed_agents_s": round3(self.agents_s),
            "skewed_agents_over_plain": round3(self.agents_s / self.plain_s),
            "skewed_hopper_cpu_us_per_test": round3(self.hopper_cpu_us_per_test),
        })
    }
}

/// Plain pytest, then hopper's agents, on the suite in `root`. `plain` and
/// `agents` come ready to run there (program, arguments, environment).
pub fn compare(mut plain: Command, agents: Command) -> Result<Skewed> {
    let started = Instant::now();
    let out = plain.stdin(Stdio::null()).output().context("cannot start plain pytest")?;
    let plain_s = started.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.contains(&format!("{TESTS} passed")) {
        bail!("plain pytest did not pass {TESTS} tests: {}", text.lines().last().unwrap_or(""));
    }
    let (agents_s, cpu_s, text) = run_sampling_cpu(agents)?;
    if !text.contains(&format!("PASSED: {TESTS} units")) {
        bail!("hopper with agents did not pass {TESTS} units: {}", text.trim());
    }
    let figures = Skewed { plain_s, agents_s, hopper_cpu_us_per_test: cpu_s * 1e6 / TESTS as f64 };
    println!(
        "  skewed suite ({TESTS} tests, most in two files): plain {plain_s:.2}s, agents {agents_s:.2}s ({:.2}×), hopper's own CPU {:.1} µs per test",
        agents_s / plain_s,
        figures.hopper_cpu_us_per_test
    );
    Ok(figures)
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
