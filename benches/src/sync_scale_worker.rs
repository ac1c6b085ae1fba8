//! One worker process of `sync-scale` (this binary again, as
//! `leasehold-benches sync-scale-worker`): a coordinator under bucket
//! ownership on the Redis (Cluster) and the Postgres database its parent
//! names, with the scripted mail source standing in for IMAP servers.
//!
//! It talks to its parent over its standard streams:
//! * it prints `ready RSS_KIB` once connected and registered (nothing
//!   claimed yet), then waits for a `go` line, so every worker starts at once;
//! * from then on, every [`REPORT_EVERY`],
//!   `state OWNED TICKS RSS_KIB CLAIMED LOST SHED` (the coordinator's counts);
//! * a `stop` line (or its stdin closing) shuts it down gracefully: every
//!   bucket handed back. The parent kills it outright to test a takeover.

use std::io::BufRead as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use leasehold_core::{LeaseKey, TokioClock, WorkerId};
use sync_worker::app::wiring;
use sync_worker::config::Ownership;
use sync_worker::secret::SecretKey;
use sync_worker::storage::Storage;
use sync_worker::{
    Config, Coordinator, Deps, Fence, MailConnection, MailSource, PollReport, Scope, ScriptedSource, SourceError,
};

use crate::sync_support::rss_kib;

/// How often a worker reports what it owns.
const REPORT_EVERY: Duration = Duration::from_millis(100);

/// What the parent passes in the environment (names shared with `sync_scale`).
pub(crate) const ENV_WORKER: &str = "SYNC_SCALE_WORKER";
pub(crate) const ENV_REDIS: &str = "SYNC_SCALE_REDIS_URL";
pub(crate) const ENV_PREFIX: &str = "SYNC_SCALE_PREFIX";
pub(crate) const ENV_DATABASE: &str = "SYNC_SCALE_DATABASE_URL";
pub(crate) const ENV_TTL_MS: &str = "SYNC_SCALE_TTL_MS";
/// `scripted` (the default: [`ScriptedSource`]) or `quiet` ([`QuietSource`]).
pub(crate) const ENV_SOURCE: &str = "SYNC_SCALE_SOURCE";
/// The database's secret key (32 zero bytes): nothing is decrypted, the
/// scripted source logs in nowhere.
pub(crate) const SECRET_KEY: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";

fn env(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set: this mode is started by `sync-scale`"))
}

/// The configuration every worker of the benchmark runs with: bucket
/// ownership, and accounts that are owned but not polled in the window.
pub(crate) fn config(ttl: Duration) -> Config {
    Config {
        ownership: Ownership::Buckets,
        lease_ttl: ttl,
        poll_warm: Duration::from_secs(3600),
        poll_cold: Duration::from_secs(7200),
        tier_eval_interval: Duration::from_secs(3600),
        reconcile_interval: Duration::from_secs(3600),
        ..Config::default()
    }
}

/// Runs one worker until told to stop; the process's whole job.
pub async fn run() -> Result<()> {
    // Its standard error is the parent's log of this worker.
    let spec = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt().with_env_filter(sync_worker::logging::filter(&spec)?).with_writer(std::io::stderr).init();
    let name = env(ENV_WORKER)?;
    let ttl = Duration::from_millis(env(ENV_TTL_MS)?.parse().context("SYNC_SCALE_TTL_MS")?);
    let mut config = config(ttl);
    config.redis_url = Some(env(ENV_REDIS)?);
    config.redis_key_prefix = env(ENV_PREFIX)?;
    let store = wiring::connect_store(&config).await?;
    let key = SecretKey::from_base64(SECRET_KEY, "the benchmark's key")?;
    let storage = Storage::open(&env(ENV_DATABASE)?, key).await?;
    let deps = Deps {
        store: store.clone(),
        buckets: store.clone(),
        presence: store,
        source: match std::env::var(ENV_SOURCE).as_deref() {
            Ok("quiet") => Arc::new(QuietSource),
            Ok("scripted") | Err(_) => Arc::new(ScriptedSource::new()),
            Ok(other) => anyhow::bail!("{ENV_SOURCE}={other:?}: expected `scripted` or `quiet`"),
        },
        directory: Arc::new(storage),
        clock: Arc::new(TokioClock::new()),
    };
    let prepared = Coordinator::prepare(WorkerId::new(&name)?, config, deps).await?;
    println!("ready {}", rss_kib());

    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    while lines.recv().await.context("the parent went away before `go`")? != "go" {}
    let handle = prepared.spawn();
    let observer = handle.observer();
    let mut report = tokio::time::interval(REPORT_EVERY);
    loop {
        tokio::select! {
            _ = report.tick() => {
                let stats = observer.stats();
                println!(
                    "state {} {} {} {} {} {}",
                    observer.owned_count(), stats.ticks, rss_kib(), stats.claimed, stats.lost, stats.shed
                );
            }
            line = lines.recv() => {
                if line.is_none_or(|l| l == "stop") {
                    break;
                }
            }
        }
    }
    handle.shutdown().await?;
    Ok(())
}

/// A mail source with nothing to say: every poll finds nothing new, and it
/// keeps nothing per account and takes no lock. [`ScriptedSource`] records
/// every account and every poll under one lock, for tests that check who
/// polled what; at a hundred thousand first polls at once, that record is
/// a cost of the test double, not of the worker.
struct QuietSource;

struct QuietConnection;

#[async_trait::async_trait]
impl MailSource for QuietSource {
    async fn take_over(&self, _fence: &Fence) -> Result<(), SourceError> {
        Ok(())
    }

    async fn connect(&self, _fence: &Fence) -> Result<Box<dyn MailConnection>, SourceError> {
        Ok(Box::new(QuietConnection))
    }

    async fn latest_internal_date(&self, _account: &LeaseKey) -> Result<Option<u64>, SourceError> {
        Ok(None)
    }
}

#[async_trait::async_trait]
impl MailConnection for QuietConnection {
    async fn poll(&mut self, _scope: Scope) -> Result<PollReport, SourceError> {
        Ok(PollReport::default())
    }

    async fn wait_new_mail(&mut self) -> Result<(), SourceError> {
        std::future::pending().await
    }
}
