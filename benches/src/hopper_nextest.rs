//! `hopper-nextest`: a generated crate of 2,000 tests, after a warm build:
//! `hopper run -j 2 --discover nextest` (each test binary run directly, one
//! process per test) against `cargo nextest run -j 2`, in the same run.
//! Target: hopper ≤ 1.1 × nextest.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::hopper_local::{hopper_binary, median, round3};

const TESTS: usize = 2000;
const ROUNDS: usize = 3;

fn write_crate(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir.join("src"))?;
    std::fs::write(
        dir.join("Cargo.toml"),
        "[package]\nname = \"bench-suite\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n",
    )?;
    let mut lib = String::from("#[cfg(test)]\nmod tests {\n");
    for t in 0..TESTS {
        lib.push_str(&format!("    #[test]\n    fn test_{t}() {{\n        assert!({t}usize < {TESTS});\n    }}\n"));
    }
    lib.push_str("}\n");
    std::fs::write(dir.join("src/lib.rs"), lib)?;
    Ok(())
}

fn in_crate(program: &Path, dir: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(dir).env("CARGO_TARGET_DIR", dir.join("target")).env_remove("CARGO_BUILD_TARGET_DIR");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("NEXTEST") {
            cmd.env_remove(name);
        }
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

fn timed(mut cmd: Command, what: &str, must_say: &str) -> Result<Duration> {
    let started = Instant::now();
    let output = cmd.output().with_context(|| format!("cannot start {what}"))?;
    let elapsed = started.elapsed();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    if !output.status.success() || !text.contains(must_say) {
        bail!("{what} failed ({}): {}", output.status, text.lines().rev().take(5).collect::<Vec<_>>().join(" | "));
    }
    Ok(elapsed)
}

/// Runs the benchmark; prints readable lines and returns its JSON figures.
pub async fn run() -> Result<serde_json::Value> {
    tokio::task::spawn_blocking(run_blocking).await.context("benchmark thread panicked")?
}

fn run_blocking() -> Result<serde_json::Value> {
    let hopper = hopper_binary()?;
    let cargo = std::env::var_os("CARGO").map(std::path::PathBuf::from).unwrap_or_else(|| "cargo".into());
    let dir = tempfile::tempdir().context("cannot make a temp dir")?;
    write_crate(dir.path())?;
    println!("hopper-nextest: {TESTS} tests in one crate; warming the build");
    let mut warm = in_crate(&cargo, dir.path());
    warm.args(["nextest", "list"]);
    timed(warm, "the warm build", "")?;
    let (mut nextest, mut ours) = (Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        let mut n = in_crate(&cargo, dir.path());
        n.args(["nextest", "run", "-j", "2", "--no-fail-fast"]);
        let n = timed(n, "cargo nextest run", &format!("{TESTS} tests run: {TESTS} passed"))?;
        let mut h = in_crate(&hopper, dir.path());
        h.args(["run", "-j", "2", "--quiet", "--no-timings", "--slowest", "0", "--discover", "nextest"]);
        let h = timed(h, "hopper run", &format!("PASSED: {TESTS} units"))?;
        println!(
            "  round {round}: cargo nextest run -j 2 {:.2}s  hopper -j 2 {:.2}s",
            n.as_secs_f64(),
            h.as_secs_f64()
        );
        nextest.push(n);
        ours.push(h);
    }
    let (n, h) = (median(nextest).as_secs_f64(), median(ours).as_secs_f64());
    let ratio = h / n;
    println!("hopper / nextest: {ratio:.2} ({} the 1.1 target)", if ratio <= 1.1 { "meets" } else { "misses" });
    Ok(json!({
        "bench": "hopper-nextest",
        "tests": TESTS,
        "nextest_s": round3(n),
        "hopper_s": round3(h),
        "hopper_over_nextest": round3(ratio),
    }))
}
