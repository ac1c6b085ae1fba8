//! `hopper-redis`: the same 2,000 units of `true` through a private Redis
//! with two `hopper run` processes (one slot each, so the same two slots as
//! the local `-j 2` run), against the local memory-queue run in the same
//! benchmark. Figure of merit: wall time added per unit over the local run.
//! Target: ≤ 0.3 ms added per unit.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use leasehold_redis::test_support::{unique_prefix, RedisServer};
use serde_json::json;

use crate::hopper_local::{hopper_binary, hopper_local_once, median, round3, write_units, UNITS};

/// Runs of each contender; the median counts.
const ROUNDS: usize = 3;
/// `hopper run` processes sharing the Redis queue.
const WORKERS: usize = 2;

/// One build: `WORKERS` processes on `url`, from spawn to the last exit.
fn redis_once(hopper: &std::path::Path, dir: &std::path::Path, units: &std::path::Path, url: &str) -> Result<Duration> {
    let prefix = unique_prefix("hopper-bench");
    let build = format!("bench-{prefix}");
    let started = Instant::now();
    let mut children = Vec::new();
    for w in 0..WORKERS {
        let child = Command::new(hopper)
            .current_dir(dir)
            .args(["run", "-j", "1", "--quiet", "--no-timings", "--queue", url, "--key-prefix", &prefix])
            .args(["--build", &build, "--worker", &format!("w{w}"), "--units-from"])
            .arg(units)
            .args(["--", "true"])
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
    let elapsed = started.elapsed();
    // The verdict must be right too: every unit passed.
    let report = Command::new(hopper)
        .current_dir(dir)
        .args(["report", "--queue", url, "--key-prefix", &prefix, "--build", &build, "--slowest", "0"])
        .stdin(Stdio::null())
        .output()
        .context("cannot run hopper report")?;
    let text = String::from_utf8_lossy(&report.stdout);
    if !report.status.success() || !text.contains(&format!("PASSED: {UNITS} units")) {
        bail!("hopper report did not pass the build ({}): {}", report.status, text.trim());
    }
    Ok(elapsed)
}

/// Runs the benchmark; prints readable lines and returns its JSON figures.
pub async fn run() -> Result<serde_json::Value> {
    tokio::task::spawn_blocking(run_blocking).await.context("benchmark thread panicked")?
}

fn run_blocking() -> Result<serde_json::Value> {
    let hopper = hopper_binary()?;
    let dir = tempfile::tempdir().context("cannot make a temp dir")?;
    let units = write_units(dir.path(), UNITS)?;
    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => (url, None),
        _ => {
            let server =
                RedisServer::start().map_err(anyhow::Error::msg).context("cannot start a private redis-server")?;
            (server.url(), Some(server))
        }
    };
    println!(
        "hopper-redis: {UNITS} units of `true`, {WORKERS} hopper processes x 1 slot on {url}, {ROUNDS} rounds (median)"
    );
    redis_once(&hopper, dir.path(), &units, &url)?; // warm-up
    hopper_local_once(&hopper, dir.path(), &units)?;
    let (mut redis, mut local) = (Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        let r = redis_once(&hopper, dir.path(), &units, &url)?;
        let l = hopper_local_once(&hopper, dir.path(), &units)?;
        println!("  round {round}: redis {:.3}s  local (mem, -j 2) {:.3}s", r.as_secs_f64(), l.as_secs_f64());
        redis.push(r);
        local.push(l);
    }
    let (r, l) = (median(redis).as_secs_f64(), median(local).as_secs_f64());
    let added_ms = (r - l) * 1000.0 / UNITS as f64;
    let verdict = if added_ms <= 0.3 { "meets" } else { "misses" };
    println!("redis {r:.3}s vs local {l:.3}s: {added_ms:.3} ms added per unit ({verdict} the target of 0.3 ms)");
    Ok(json!({
        "bench": "hopper-redis",
        "units": UNITS,
        "workers": WORKERS,
        "redis_s": round3(r),
        "local_s": round3(l),
        "added_ms_per_unit": round3(added_ms),
    }))
}
