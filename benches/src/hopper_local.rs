//! `hopper-local`: 2,000 units of `true` through `hopper run -j 2` (memory
//! queue) against `xargs -P 2 -n 1 true` on the same unit list, in the same
//! run. Target: hopper's wall time ≤ 1.0 × xargs'.
//!
//! Both are run [`ROUNDS`] times, alternating, and the median wall time and
//! CPU time (the process and every unit it ran) of each is reported.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;

/// Units per run.
pub const UNITS: usize = 2000;
/// Runs of each contender; the median counts.
pub const ROUNDS: usize = 7;

/// The `hopper` binary: `HOPPER_BIN`, else the one beside this benchmark's
/// executable (same target dir and profile), built with cargo when missing.
pub fn hopper_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("HOPPER_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().context("cannot find this benchmark's executable")?;
    let profile_dir = exe.parent().context("benchmark executable has no directory")?.to_owned();
    let candidate = profile_dir.join("hopper");
    if candidate.is_file() {
        return Ok(candidate);
    }
    let target_dir = profile_dir.parent().context("benchmark executable is not in a target dir")?;
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    println!("building the hopper binary ({})", if release { "release" } else { "debug" });
    let mut build = Command::new(cargo);
    build.args(["build", "-p", "hopper", "--bin", "hopper"]).env("CARGO_TARGET_DIR", target_dir);
    if release {
        build.arg("--release");
    }
    let status = build.status().context("cannot run cargo to build hopper")?;
    if !status.success() || !candidate.is_file() {
        bail!("building hopper failed ({status}); set HOPPER_BIN to a built hopper binary");
    }
    Ok(candidate)
}

/// Writes `n` unit names, one per line, and returns the file.
pub fn write_units(dir: &Path, n: usize) -> Result<PathBuf> {
    let path = dir.join("units.txt");
    let text: String = (0..n).map(|i| format!("unit-{i:05}\n")).collect();
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// Runs `cmd` to completion (output discarded) and returns its wall time.
pub fn timed(mut cmd: Command, what: &str) -> Result<Duration> {
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let started = Instant::now();
    let output = cmd.output().with_context(|| format!("cannot start {what}"))?;
    let elapsed = started.elapsed();
    if !output.status.success() {
        bail!("{what} failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(elapsed)
}

/// CPU seconds (user + system) of the child processes waited for so far
/// (with their own waited-for descendants).
pub fn children_cpu_s() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    if rc != 0 {
        return f64::NAN;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// The median of some durations.
pub fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// One run of `hopper run -j 2` on the memory queue.
pub fn hopper_local_once(hopper: &Path, dir: &Path, units: &Path) -> Result<Duration> {
    let mut cmd = Command::new(hopper);
    cmd.current_dir(dir)
        .args(["run", "-j", "2", "--quiet", "--no-timings", "--units-from"])
        .arg(units)
        .args(["--", "true"]);
    timed(cmd, "hopper run")
}

/// Makes this process the parent of its orphaned descendants, so that a
/// process a child leaves behind is waited for here and its CPU time shows
/// in `RUSAGE_CHILDREN`, as the child's own does.
pub fn adopt_orphans() -> Result<()> {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes one integer argument and touches no memory.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        bail!("cannot become a child subreaper: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Waits for every child and adopted orphan to exit, for up to `limit`.
pub fn wait_for_orphans(limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only the status it is given.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid < 0 || Instant::now() >= deadline {
            return; // ECHILD: none left.
        }
        if pid == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// One run of `xargs -P 2 -n 1 true` on the same list.
pub fn xargs_once(units: &Path) -> Result<Duration> {
    let mut cmd = Command::new("xargs");
    cmd.args(["-P", "2", "-n", "1", "-a"]).arg(units).arg("true");
    timed(cmd, "xargs")
}

/// Runs the benchmark; prints readable lines and returns its JSON figures.
pub async fn run() -> Result<serde_json::Value> {
    tokio::task::spawn_blocking(run_blocking).await.context("benchmark thread panicked")?
}

fn run_blocking() -> Result<serde_json::Value> {
    let hopper = hopper_binary()?;
    // hopper's reaper outlives it (it waits for hopper's end); its CPU is hopper's.
    adopt_orphans()?;
    let dir = tempfile::tempdir().context("cannot make a temp dir")?;
    let units = write_units(dir.path(), UNITS)?;
    println!(
        "hopper-local: {UNITS} units of `true`, -j 2, {ROUNDS} rounds each (median), hopper at {}",
        hopper.display()
    );
    // One warm-up of each (page cache, binary loading).
    hopper_local_once(&hopper, dir.path(), &units)?;
    xargs_once(&units)?;
    let (mut hop, mut xargs, mut hop_cpu, mut xargs_cpu) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        let cpu = children_cpu_s();
        let h = hopper_local_once(&hopper, dir.path(), &units)?;
        // Its reaper ends just after it (this bench has no other child).
        wait_for_orphans(Duration::from_secs(5));
        let h_cpu = children_cpu_s() - cpu;
        let x = xargs_once(&units)?;
        let x_cpu = children_cpu_s() - cpu - h_cpu;
        println!(
            "  round {round}: hopper {:.3}s ({h_cpu:.3}s CPU)  xargs {:.3}s ({x_cpu:.3}s CPU)",
            h.as_secs_f64(),
            x.as_secs_f64()
        );
        hop.push(h);
        xargs.push(x);
        hop_cpu.push(Duration::from_secs_f64(h_cpu.max(0.0)));
        xargs_cpu.push(Duration::from_secs_f64(x_cpu.max(0.0)));
    }
    let (h, x) = (median(hop).as_secs_f64(), median(xargs).as_secs_f64());
    let (hc, xc) = (median(hop_cpu).as_secs_f64(), median(xargs_cpu).as_secs_f64());
    let ratio = if x > 0.0 { h / x } else { f64::NAN };
    let cpu_ratio = if xc > 0.0 { hc / xc } else { f64::NAN };
    let verdict = if ratio <= 1.0 { "meets" } else { "misses" };
    println!(
        "hopper {h:.3}s, xargs {x:.3}s: ratio {ratio:.3} ({verdict} the target of 1.0); CPU {hc:.3}s against {xc:.3}s: ratio {cpu_ratio:.3}"
    );
    Ok(json!({
        "bench": "hopper-local",
        "units": UNITS,
        "hopper_s": round3(h),
        "xargs_s": round3(x),
        "ratio": round3(ratio),
        "hopper_cpu_s": round3(hc),
        "xargs_cpu_s": round3(xc),
        "cpu_ratio": round3(cpu_ratio),
    }))
}

/// Rounds to milliseconds (for readable JSON).
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
