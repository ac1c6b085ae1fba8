//! `sync-ownership`: 10,000 live accounts split by 4 sync-worker
//! coordinators on one Redis (`REDIS_URL` when set, else a private
//! `redis-server`), driving the scripted mail source.
//!
//! **Workers are threads, not processes**: each coordinator runs on its own
//! OS thread with its own current-thread tokio runtime and its own Redis
//! connections (a separate `RedisStore`), so they share nothing but the
//! in-process scripted source (which the test harness needs to check that no
//! account is ever run twice). "Killing" a worker aborts its coordinator and
//! runners without releasing anything, as a crash would.
//!
//! Figures:
//! * `full_ownership_s`: from the moment the (already registered) workers
//!   start their loops until every account is owned;
//! * `spread_pct`: once settled, (max - min) owned / fair share;
//! * `tick_cpu_ms_per_1k`: CPU time of a coordinator's thread (its tick:
//!   register, renew_many, live set and workers read, balance; the Redis
//!   client work included; runners idle because POLL_WARM is an hour) per
//!   tick per 1,000 owned accounts, averaged over the workers in a steady
//!   window (`tick_cpu_ms_per_1k_max`: the worst worker);
//! * `takeover_s`: from killing one worker until all its accounts are owned
//!   by the others.
//!
//! What bounds the figures: takeover is the lease TTL (the dead worker's
//! leases must lapse) minus the time since its last renew, plus at most one
//! tick until the survivors notice its registration expired, plus claim
//! retries every TTL/10. Tick CPU is mostly the Redis client: one pipeline of
//! 2,500 `EVALSHA` renews and an `SMEMBERS` of the 10,000-key live set per
//! tick (the coordinator's own bookkeeping is a few ms of it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use leasehold_core::{LeaseKey, LeaseStore, TokioClock, WorkerId};
use leasehold_redis::{test_support, RedisConfig, RedisStore};
use serde_json::json;
use sync_worker::{Config, Coordinator, CoordinatorObserver, Deps, MemoryDirectory, ScriptedSource};
use tokio::sync::oneshot;
use tokio::time::Instant;

const ACCOUNTS: usize = 10_000;
const WORKERS: usize = 4;
const LEASE_TTL: Duration = Duration::from_secs(3);
const STEADY_WINDOW: Duration = Duration::from_secs(6);

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_THREAD_CPUTIME_ID is always valid.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub(crate) enum Command {
    Kill,
    Shutdown,
}

pub(crate) struct Worker {
    pub(crate) observer: CoordinatorObserver,
    pub(crate) cpu_ns: Arc<AtomicU64>,
    pub(crate) commands: Option<oneshot::Sender<Command>>,
    pub(crate) thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Worker {
    pub(crate) fn send(&mut self, command: Command) {
        if let Some(tx) = self.commands.take() {
            let _ = tx.send(command);
        }
    }

    pub(crate) async fn join(&mut self) -> Result<()> {
        if let Some(thread) = self.thread.take() {
            match tokio::task::spawn_blocking(move || thread.join()).await? {
                Ok(r) => r?,
                Err(_) => bail!("worker thread panicked"),
            }
        }
        Ok(())
    }
}

pub(crate) type Ready = Result<(CoordinatorObserver, Arc<AtomicU64>)>;
/// A started worker thread: its readiness report, its command channel, its join handle.
pub(crate) type Spawned =
    (std::sync::mpsc::Receiver<Ready>, oneshot::Sender<Command>, std::thread::JoinHandle<Result<()>>);

pub(crate) async fn connect(url: &str, prefix: &str) -> Result<RedisStore> {
    RedisStore::connect_with(RedisConfig::new(url.to_string()).with_prefix(prefix.to_string()))
        .await
        .with_context(|| format!("connect to {url}"))
}

/// Starts one worker thread: connect, register, wait at `barrier` until all
/// are registered, then run until told to stop.
pub(crate) fn spawn_worker(
    name: String,
    url: String,
    prefix: String,
    config: Config,
    source: ScriptedSource,
    directory: MemoryDirectory,
    barrier: Arc<Barrier>,
) -> Result<Spawned> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Ready>();
    let (cmd_tx, cmd_rx) = oneshot::channel::<Command>();
    let thread = std::thread::Builder::new().name(name.clone()).spawn(move || -> Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async move {
            let prepared = async {
                let leases = Arc::new(connect(&url, &prefix).await?);
                let store: Arc<dyn LeaseStore> = leases.clone();
                let deps = Deps {
                    store,
                    buckets: leases.clone(),
                    presence: leases,
                    source: Arc::new(source),
                    directory: Arc::new(directory),
                    clock: Arc::new(TokioClock::new()),
                };
                anyhow::Ok(Coordinator::prepare(WorkerId::new(&name)?, config, deps).await?)
            }
            .await;
            // Every worker registered (or failed): start together.
            barrier.wait();
            let prepared = match prepared {
                Ok(p) => p,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return Ok(());
                }
            };
            let handle = prepared.spawn();
            let cpu = Arc::new(AtomicU64::new(thread_cpu_ns()));
            let sampler = cpu.clone();
            tokio::spawn(async move {
                loop {
                    sampler.store(thread_cpu_ns(), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
            let _ = ready_tx.send(Ok((handle.observer(), cpu)));
            match cmd_rx.await {
                Ok(Command::Kill) => handle.kill().await,
                Ok(Command::Shutdown) | Err(_) => handle.shutdown().await?,
            }
            anyhow::Ok(())
        })
    })?;
    Ok((ready_rx, cmd_tx, thread))
}

/// Starts `n` worker threads named `{name}{i}` on `url` under `prefix`,
/// lets them all register, then starts their loops together; answers them
/// and the moment they started.
pub(crate) async fn start_workers(
    n: usize,
    name: &str,
    url: &str,
    prefix: &str,
    config: &Config,
    source: &ScriptedSource,
    directory: &MemoryDirectory,
) -> Result<(Vec<Worker>, Instant)> {
    let barrier = Arc::new(Barrier::new(n + 1));
    let mut pending = Vec::new();
    for i in 0..n {
        pending.push(spawn_worker(
            format!("{name}{i}"),
            url.to_owned(),
            prefix.to_owned(),
            config.clone(),
            source.clone(),
            directory.clone(),
            barrier.clone(),
        )?);
    }
    let b = barrier.clone();
    tokio::task::spawn_blocking(move || b.wait()).await?;
    let started = Instant::now();
    let mut workers = Vec::new();
    for (ready, cmd, thread) in pending {
        let (observer, cpu_ns) = tokio::task::spawn_blocking(move || ready.recv())
            .await?
            .context("worker thread ended before it was ready")??;
        workers.push(Worker { observer, cpu_ns, commands: Some(cmd), thread: Some(thread) });
    }
    Ok((workers, started))
}

pub(crate) fn owned_total(workers: &[Worker]) -> usize {
    workers.iter().map(|w| w.observer.owned_count()).sum()
}

pub(crate) fn counts(workers: &[Worker]) -> Vec<usize> {
    workers.iter().map(|w| w.observer.owned_count()).collect()
}

/// Waits until the workers' counts stay unchanged, and sum to `total`, for
/// `quiet`; answers them, or an error after `limit`.
pub(crate) async fn settle(workers: &[Worker], total: usize, quiet: Duration, limit: Duration) -> Result<Vec<usize>> {
    settle_counts(|| counts(workers), total, quiet, limit).await
}

/// Waits until the owned counts `counts` reads add up to `total` and stay
/// put for `quiet`; the counts then, or an error after `limit`.
pub(crate) async fn settle_counts(
    counts: impl Fn() -> Vec<usize>,
    total: usize,
    quiet: Duration,
    limit: Duration,
) -> Result<Vec<usize>> {
    let mut last = counts();
    let mut stable_since = Instant::now();
    let started = Instant::now();
    while stable_since.elapsed() < quiet {
        ensure!(started.elapsed() < limit, "ownership never settled: {:?}", counts());
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = counts();
        if now != last || now.iter().sum::<usize>() != total {
            last = now;
            stable_since = Instant::now();
        }
    }
    Ok(last)
}

/// Waits until `cond` holds (checking every 5 ms); the instant it held, or an error after `limit`.
pub(crate) async fn time_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Result<Instant> {
    let start = Instant::now();
    loop {
        if cond() {
            return Ok(Instant::now());
        }
        if start.elapsed() > limit {
            bail!("{what}: not reached within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs the benchmark; returns its figures.
pub async fn run() -> Result<serde_json::Value> {
    let (url, where_) = match std::env::var("REDIS_URL") {
        Ok(u) if !u.is_empty() => (u, "REDIS_URL"),
        _ => {
            test_support::require_binary("redis-server");
            (test_support::shared_server().url(), "private redis-server")
        }
    };
    let prefix = test_support::unique_prefix("bench-sync");
    println!("sync-ownership: {ACCOUNTS} accounts, {WORKERS} coordinators (threads with their own connections), {where_}, lease TTL {LEASE_TTL:?}");

    let admin = Arc::new(connect(&url, &prefix).await?);
    let keys: Vec<LeaseKey> = (0..ACCOUNTS).map(|i| LeaseKey::new(format!("acct-{i:05}"))).collect::<Result<_, _>>()?;
    let mut marks = tokio::task::JoinSet::new();
    for chunk in keys.chunks(ACCOUNTS / 50) {
        let (admin, chunk) = (admin.clone(), chunk.to_vec());
        marks.spawn(async move {
            for k in &chunk {
                admin.mark_live(k).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = marks.join_next().await {
        r??;
    }
    ensure!(admin.live_keys().await?.len() == ACCOUNTS, "live set not filled");

    let config = Config {
        lease_ttl: LEASE_TTL,
        poll_warm: Duration::from_secs(3600),
        poll_cold: Duration::from_secs(7200),
        tier_eval_interval: Duration::from_secs(3600),
        ..Config::default()
    };
    let source = ScriptedSource::new();
    let (mut workers, started) =
        start_workers(WORKERS, "bench-w", &url, &prefix, &config, &source, &MemoryDirectory::new()).await?;

    // Full ownership.
    let full = {
        let ws = &workers;
        time_until(Duration::from_secs(60), "full ownership", || owned_total(ws) == ACCOUNTS).await?
    };
    let full_ownership_s = (full - started).as_secs_f64();
    println!("full ownership after {full_ownership_s:.3} s: {:?}", counts(&workers));

    let last = settle(&workers, ACCOUNTS, 2 * LEASE_TTL, Duration::from_secs(120)).await?;
    let share = ACCOUNTS.div_ceil(WORKERS) as f64;
    let (max, min) = (*last.iter().max().unwrap_or(&0), *last.iter().min().unwrap_or(&0));
    let spread_pct = (max - min) as f64 / share * 100.0;
    println!("settled: {last:?}; spread {spread_pct:.2} % of the fair share {share}");

    // Coordinator CPU per tick in a steady window.
    let before: Vec<(u64, u64, usize)> = workers
        .iter()
        .map(|w| (w.cpu_ns.load(Ordering::Relaxed), w.observer.stats().ticks, w.observer.owned_count()))
        .collect();
    tokio::time::sleep(STEADY_WINDOW).await;
    let mut per_1k = Vec::new();
    for (w, (cpu0, ticks0, owned0)) in workers.iter().zip(before) {
        let ticks = w.observer.stats().ticks - ticks0;
        let cpu_ms = (w.cpu_ns.load(Ordering::Relaxed) - cpu0) as f64 / 1e6;
        let owned = (owned0 + w.observer.owned_count()) as f64 / 2.0;
        ensure!(ticks > 0 && owned > 0.0, "{} did not tick in the steady window", w.observer.worker());
        let v = cpu_ms / ticks as f64 / (owned / 1000.0);
        println!(
            "{}: {ticks} ticks, {cpu_ms:.1} ms CPU, {owned} owned: {v:.3} ms per tick per 1k",
            w.observer.worker()
        );
        per_1k.push(v);
    }
    let tick_cpu_ms_per_1k = per_1k.iter().sum::<f64>() / per_1k.len() as f64;
    let tick_cpu_ms_per_1k_max = per_1k.iter().copied().fold(0.0, f64::max);

    // Kill one worker; time until its accounts are owned again.
    let victim = workers.remove(0);
    let orphans = victim.observer.owned_keys();
    let mut victim = victim;
    let killed = Instant::now();
    victim.send(Command::Kill);
    victim.join().await?;
    let takeover = {
        let ws = &workers;
        time_until(Duration::from_secs(60), "takeover", || {
            owned_total(ws) == ACCOUNTS && victim.observer.owned_count() == 0
        })
        .await?
    };
    let takeover_s = (takeover - killed).as_secs_f64();
    println!(
        "killed {} ({} accounts): all owned again after {takeover_s:.3} s: {:?}",
        victim.observer.worker(),
        orphans.len(),
        counts(&workers)
    );

    let exclusive = source.check_exclusive();
    if let Err(report) = &exclusive {
        println!("VIOLATION: an account ran on two workers at once:\n{report}");
    }
    for w in &mut workers {
        w.send(Command::Shutdown);
    }
    for w in &mut workers {
        w.join().await?;
    }
    // Leave no live set behind on a shared Redis.
    let mut cleanup = tokio::task::JoinSet::new();
    for chunk in keys.chunks(ACCOUNTS / 50) {
        let (admin, chunk) = (admin.clone(), chunk.to_vec());
        cleanup.spawn(async move {
            for k in &chunk {
                admin.mark_not_live(k).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = cleanup.join_next().await {
        r??;
    }
    ensure!(exclusive.is_ok(), "an account was run by two workers at once");

    Ok(json!({
        "bench": "sync-ownership",
        "accounts": ACCOUNTS,
        "workers": WORKERS,
        "full_ownership_s": round3(full_ownership_s),
        "spread_pct": round3(spread_pct),
        "tick_cpu_ms_per_1k": round3(tick_cpu_ms_per_1k),
        "tick_cpu_ms_per_1k_max": round3(tick_cpu_ms_per_1k_max),
        "takeover_s": round3(takeover_s),
        "lease_ttl_s": LEASE_TTL.as_secs_f64(),
        "worker_mode": "threads (one current-thread runtime and Redis connection each)",
        "redis": where_,
    }))
}

pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
