//! `sync-scale`: bucket ownership (`OWNERSHIP=buckets`) at growing numbers
//! of accounts, as the issue sets it up: 8 worker processes, a private
//! 3-master Redis Cluster, the accounts in Postgres, the scripted mail source,
//! mostly cold accounts (no poll during the measurement).
//!
//! Each worker is this binary again (`sync-scale-worker`, see
//! `sync_scale_worker.rs`): the coordinator `sync-worker worker` runs, with
//! its lease store from the same wiring and its accounts read from the same
//! Postgres storage, only the IMAP source scripted.
//!
//! Sizes: `SYNC_SCALE_SIZES` (default `10000,100000`; add `1000000` for a
//! million). For each size, a fresh Postgres database (filled with `\copy`
//! before the clock starts) and a fresh key prefix:
//! * `ownership_s`: from the workers' start until every account is owned
//!   (the weights are given by the first worker's bind, as on an empty Redis);
//! * `spread_pct`: once settled, (max − min) owned ÷ the fair share;
//! * `takeover_s`: from SIGKILLing one worker process until its accounts are
//!   owned again (`ttl_s` is the lease TTL);
//! * `redis_cmds_per_tick`, `redis_cpu_us_per_tick`: Redis commands (a
//!   script's inner commands counted) and redis-server CPU (less its idle
//!   rate), summed over the cluster's masters, in a steady window, per
//!   worker tick;
//! * `redis_bytes_per_account`: the masters' `used_memory` growth ÷ accounts
//!   (bucket leases, plus one tier key per account);
//! * `rss_bytes_per_account`: the workers' RSS growth, from registered (no
//!   account claimed) to full ownership, summed, ÷ accounts. It includes the
//!   scripted source's record of each account it was asked about, which a
//!   real IMAP source does not keep.
//!
//! `SYNC_SCALE_SOURCE=quiet` gives the workers a source that finds nothing
//! new and keeps nothing per account, instead of the test suite's
//! `ScriptedSource` (the default), whose record of every poll, under one
//! lock, is the bottleneck of a million accounts' first polls.
//! `SYNC_SCALE_LOG` sets the workers' `RUST_LOG` (default `warn`) and keeps
//! their logs, whose folder the run prints.

use std::io::{BufRead as _, BufWriter, Write as _};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use leasehold_redis::test_support::{self, RedisCluster};
use redis::aio::MultiplexedConnection;
use serde_json::json;
use sync_worker::secret::SecretKey;
use sync_worker::storage::Storage;
use sync_worker::testing::Postgres;
use tokio::time::Instant;

use crate::redis_stats;
use crate::sync_ownership::{round3, settle_counts, time_until};
use crate::sync_scale_worker::{ENV_DATABASE, ENV_PREFIX, ENV_REDIS, ENV_SOURCE, ENV_TTL_MS, ENV_WORKER, SECRET_KEY};

const WORKERS: usize = 8;
const MASTERS: usize = 3;
const LEASE_TTL: Duration = Duration::from_secs(3);
const STEADY_WINDOW: Duration = Duration::from_secs(6);
/// How often the wait for full ownership says where it stands.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

fn sizes() -> Result<Vec<usize>> {
    let raw = std::env::var("SYNC_SCALE_SIZES").unwrap_or_else(|_| "10000,100000".into());
    raw.split(',')
        .map(|s| s.trim().parse::<usize>().with_context(|| format!("SYNC_SCALE_SIZES={raw}: {s:?} is not a number")))
        .collect()
}

async fn used_memory(conn: &mut MultiplexedConnection) -> Result<u64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .context("INFO memory has no used_memory")
}

/// The cluster's masters, each on a connection of its own (INFO and
/// CONFIG RESETSTAT are per node).
struct Masters(Vec<MultiplexedConnection>);

impl Masters {
    async fn used_memory(&mut self) -> Result<u64> {
        let mut sum = 0;
        for conn in &mut self.0 {
            sum += used_memory(conn).await?;
        }
        Ok(sum)
    }

    async fn cpu_s(&mut self) -> Result<f64> {
        let mut sum = 0.0;
        for conn in &mut self.0 {
            sum += redis_stats::cpu_s(conn).await?;
        }
        Ok(sum)
    }

    async fn idle_rate(&mut self, over: Duration) -> Result<f64> {
        let c0 = self.cpu_s().await?;
        tokio::time::sleep(over).await;
        Ok((self.cpu_s().await? - c0) / over.as_secs_f64())
    }

    async fn reset_stats(&mut self) -> Result<()> {
        for conn in &mut self.0 {
            redis_stats::reset_stats(conn).await?;
        }
        Ok(())
    }

    /// Every master's commandstats, added up by command.
    async fn commandstats(&mut self) -> Result<Vec<redis_stats::CommandStat>> {
        let mut all: Vec<redis_stats::CommandStat> = Vec::new();
        for conn in &mut self.0 {
            for stat in redis_stats::commandstats(conn).await? {
                match all.iter_mut().find(|s| s.name == stat.name) {
                    Some(s) => {
                        s.calls += stat.calls;
                        s.usec += stat.usec;
                    }
                    None => all.push(stat),
                }
            }
        }
        all.sort_by_key(|s| std::cmp::Reverse(s.usec));
        Ok(all)
    }
}

/// Runs the benchmark; returns its figures.
pub async fn run() -> Result<serde_json::Value> {
    test_support::require_binary("redis-server");
    let cluster = RedisCluster::start(MASTERS).map_err(anyhow::Error::msg).context("start a private Redis Cluster")?;
    let mut masters = Vec::new();
    // A master busy with the workers' scripts may take a while to answer INFO.
    let patient = redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    for node in cluster.nodes() {
        let client = redis::Client::open(node.url())?;
        masters.push(client.get_multiplexed_async_connection_with_config(&patient).await?);
    }
    let mut masters = Masters(masters);
    let mut out = Vec::new();
    for accounts in sizes()? {
        out.push(one_size(&cluster, &mut masters, accounts).await?);
    }
    Ok(json!({ "bench": "sync-scale", "sizes": out }))
}

/// Fills a fresh database with `accounts` accounts (one user each), their
/// buckets set as `Storage` sets them, with `\copy`.
async fn fill(db: &Postgres, accounts: usize) -> Result<()> {
    let key = SecretKey::from_base64(SECRET_KEY, "the benchmark's key")?;
    // Opening runs the migrations and fixes the bucket count.
    let storage = Storage::open(db.url(), key).await.context("open the benchmark's database")?;
    let dir = tempfile::tempdir()?;
    let (users, rows) = (dir.path().join("users.csv"), dir.path().join("accounts.csv"));
    {
        let (mut u, mut a) =
            (BufWriter::new(std::fs::File::create(&users)?), BufWriter::new(std::fs::File::create(&rows)?));
        for i in 0..accounts {
            let id = format!("acct-{i:07}");
            writeln!(u, "u-{i:07},u{i:07}@example.org,0")?;
            writeln!(a, "{id},u-{i:07},scripted.invalid,993,tls,u{i:07},password,x,0,{}", storage.bucket_of(&id).0)?;
        }
        u.flush()?;
        a.flush()?;
    }
    db.execute(&format!("\\copy users (id, email, created_at) FROM '{}' WITH (FORMAT csv)", users.display()))?;
    db.execute(&format!(
        "\\copy accounts (id, user_id, host, port, security, username, auth, password_enc, created_at, bucket) \
         FROM '{}' WITH (FORMAT csv)",
        rows.display()
    ))?;
    db.execute("ANALYZE users; ANALYZE accounts")?;
    Ok(())
}

/// What one worker process last reported.
#[derive(Debug, Default, Clone, Copy)]
struct Report {
    ready_kib: Option<u64>,
    owned: usize,
    ticks: u64,
    rss_kib: u64,
    /// Accounts claimed, lost (a bucket lost or overdue) and shed so far.
    claimed: u64,
    lost: u64,
    shed: u64,
}

/// One worker process and what it last reported.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    report: Arc<Mutex<Report>>,
}

impl Worker {
    fn spawn(name: &str, redis_url: &str, prefix: &str, database_url: &str, log: &std::path::Path) -> Result<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            .arg("sync-scale-worker")
            .env(ENV_WORKER, name)
            .env(ENV_REDIS, redis_url)
            .env(ENV_PREFIX, prefix)
            .env(ENV_DATABASE, database_url)
            .env(ENV_TTL_MS, LEASE_TTL.as_millis().to_string())
            .env("RUST_LOG", std::env::var("SYNC_SCALE_LOG").unwrap_or_else(|_| "warn".into()))
            .env(ENV_SOURCE, std::env::var(ENV_SOURCE).unwrap_or_else(|_| "scripted".into()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .context("start a worker process")?;
        let stdin = child.stdin.take().context("the worker's stdin")?;
        let stdout = child.stdout.take().context("the worker's stdout")?;
        let report = Arc::new(Mutex::new(Report::default()));
        let shared = report.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let words: Vec<u64> = line.split(' ').skip(1).filter_map(|w| w.parse().ok()).collect();
                let mut r = shared.lock().unwrap_or_else(|p| p.into_inner());
                match (line.split(' ').next(), words.as_slice()) {
                    (Some("ready"), [rss]) => r.ready_kib = Some(*rss),
                    (Some("state"), [owned, ticks, rss, claimed, lost, shed]) => {
                        r.owned = *owned as usize;
                        r.ticks = *ticks;
                        r.rss_kib = *rss;
                        (r.claimed, r.lost, r.shed) = (*claimed, *lost, *shed);
                    }
                    _ => {}
                }
            }
        });
        Ok(Self { child, stdin, report })
    }

    fn report(&self) -> Report {
        *self.report.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&mut self, line: &str) -> Result<()> {
        writeln!(self.stdin, "{line}").context("write to a worker")?;
        Ok(())
    }

    /// Asks it to stop (its buckets handed back), then waits; kills it after `within`.
    fn stop(mut self, within: Duration) {
        let _ = self.send("stop");
        let started = std::time::Instant::now();
        while started.elapsed() < within {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The owned counts, and the accounts claimed, lost and shed in all.
fn progress(workers: &[Worker]) -> String {
    let reports: Vec<Report> = workers.iter().map(Worker::report).collect();
    let sum = |f: fn(&Report) -> u64| reports.iter().map(f).sum::<u64>();
    format!(
        "owned {:?}; claimed {}, lost {}, shed {}",
        reports.iter().map(|r| r.owned).collect::<Vec<_>>(),
        sum(|r| r.claimed),
        sum(|r| r.lost),
        sum(|r| r.shed)
    )
}

fn owned(workers: &[Worker]) -> Vec<usize> {
    workers.iter().map(|w| w.report().owned).collect()
}

async fn one_size(cluster: &RedisCluster, masters: &mut Masters, accounts: usize) -> Result<serde_json::Value> {
    println!(
        "sync-scale: {accounts} accounts, {WORKERS} worker processes, a {MASTERS}-master Redis Cluster, Postgres, \
         bucket ownership, lease TTL {LEASE_TTL:?}"
    );
    let db =
        Postgres::fresh("bench_scale").context("a Postgres database (is Postgres running? see TEST_POSTGRES_URL)")?;
    let filling = Instant::now();
    fill(&db, accounts).await?;
    println!("  {accounts} accounts in Postgres after {:.1} s", filling.elapsed().as_secs_f64());
    let prefix = test_support::unique_prefix("bench-scale");
    let logs = tempfile::tempdir()?;
    let idle = masters.idle_rate(Duration::from_millis(500)).await?;
    let memory_before = masters.used_memory().await?;

    let mut workers = Vec::with_capacity(WORKERS);
    for i in 0..WORKERS {
        let name = format!("scale-w{i}");
        let log = logs.path().join(format!("{name}.log"));
        workers.push(Worker::spawn(&name, &cluster.url(), &prefix, db.url(), &log)?);
    }
    let ready = {
        let ws = &workers;
        time_until(Duration::from_secs(60), "every worker registered", || {
            ws.iter().all(|w| w.report().ready_kib.is_some())
        })
        .await
    };
    if let Err(e) = ready {
        let log = std::fs::read_to_string(logs.path().join("scale-w0.log")).unwrap_or_default();
        bail!("{e}; the first worker's log:\n{log}");
    }
    let baseline: Vec<u64> = workers.iter().map(|w| w.report().ready_kib.unwrap_or(0)).collect();
    let started = Instant::now();
    for w in &mut workers {
        w.send("go")?;
    }
    let full = {
        let ws = &workers;
        let mut said = Instant::now();
        time_until(Duration::from_secs(600), "full ownership", || {
            if said.elapsed() >= PROGRESS_EVERY {
                said = Instant::now();
                println!("  after {:.0} s: {}", started.elapsed().as_secs_f64(), progress(ws));
            }
            owned(ws).iter().sum::<usize>() == accounts
        })
        .await?
    };
    let ownership_s = (full - started).as_secs_f64();
    // Reports come every 100 ms: wait for one made after full ownership.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let grown_kib: u64 = workers.iter().zip(&baseline).map(|(w, b)| w.report().rss_kib.saturating_sub(*b)).sum();
    let rss_bytes_per_account = (grown_kib * 1024) as f64 / accounts as f64;
    let redis_bytes_per_account = masters.used_memory().await?.saturating_sub(memory_before) as f64 / accounts as f64;
    println!("  full ownership after {ownership_s:.2} s: {}", progress(&workers));

    let last = settle_counts(|| owned(&workers), accounts, 2 * LEASE_TTL, Duration::from_secs(300)).await?;
    let share = accounts as f64 / WORKERS as f64;
    let (max, min) = (*last.iter().max().unwrap_or(&0), *last.iter().min().unwrap_or(&0));
    let spread_pct = (max - min) as f64 / share * 100.0;
    println!("  settled: {last:?}; spread {spread_pct:.2} % of the fair share");

    // Redis work per tick in a steady window.
    masters.reset_stats().await?;
    let cpu0 = masters.cpu_s().await?;
    let ticks0: u64 = workers.iter().map(|w| w.report().ticks).sum();
    tokio::time::sleep(STEADY_WINDOW).await;
    let ticks = workers.iter().map(|w| w.report().ticks).sum::<u64>() - ticks0;
    let cpu = masters.cpu_s().await? - cpu0 - idle * STEADY_WINDOW.as_secs_f64();
    let stats = masters.commandstats().await?;
    // Our own INFO calls are not the workers'.
    let calls: u64 = stats.iter().filter(|s| s.name != "info" && s.name != "config|resetstat").map(|s| s.calls).sum();
    ensure!(ticks > 0, "no tick in the steady window");
    let redis_cmds_per_tick = calls as f64 / ticks as f64;
    let redis_cpu_us_per_tick = cpu.max(0.0) * 1e6 / ticks as f64;
    println!("  steady: {ticks} ticks, {redis_cmds_per_tick:.1} Redis commands and {redis_cpu_us_per_tick:.0} µs of Redis CPU per tick");
    redis_stats::print_commandstats(&stats, ticks as f64);

    // SIGKILL one worker process; time until its accounts are owned again.
    let mut victim = workers.remove(0);
    let orphans = victim.report().owned;
    let killed = Instant::now();
    victim.child.kill().context("kill a worker")?;
    victim.child.wait()?;
    let takeover = {
        let ws = &workers;
        let mut said = Instant::now();
        time_until(Duration::from_secs(120), "takeover", || {
            if said.elapsed() >= Duration::from_secs(1) {
                said = Instant::now();
                println!("    {:.0} s after the kill: {}", killed.elapsed().as_secs_f64(), progress(ws));
            }
            owned(ws).iter().sum::<usize>() == accounts
        })
        .await?
    };
    let takeover_s = (takeover - killed).as_secs_f64();
    println!("  killed a worker process ({orphans} accounts): all owned again after {takeover_s:.2} s");
    let stopping: Vec<_> =
        workers.into_iter().map(|w| std::thread::spawn(move || w.stop(Duration::from_secs(30)))).collect();
    for s in stopping {
        let _ = s.join();
    }
    if std::env::var_os("SYNC_SCALE_LOG").is_some() {
        println!("  the workers' logs (SYNC_SCALE_LOG is set): {}", logs.keep().display());
    }
    Ok(json!({
        "accounts": accounts,
        "workers": WORKERS,
        "ownership_s": round3(ownership_s),
        "spread_pct": round3(spread_pct),
        "takeover_s": round3(takeover_s),
        "ttl_s": LEASE_TTL.as_secs_f64(),
        "redis_cmds_per_tick": round3(redis_cmds_per_tick),
        "redis_cpu_us_per_tick": round3(redis_cpu_us_per_tick),
        "redis_bytes_per_account": round3(redis_bytes_per_account),
        "rss_bytes_per_account": round3(rss_bytes_per_account),
    }))
}
