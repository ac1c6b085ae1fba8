//! `sync-worker`: owns a fair share of the live accounts and keeps them synced.
//!
//! Configuration comes from the environment (see the `config` module docs:
//! POLL_WARM, POLL_COLD, TIER_EVAL_INTERVAL, TIER_HOT_ACTIVITY_H,
//! TIER_COLD_AFTER_H, TIER_SESSION_GRACE_MIN, HOT_BUDGET_PER_WORKER, LEASE_TTL,
//! IDLE_REISSUE, REDIS_URL, REDIS_KEY_PREFIX, WORKER_ID). SIGTERM or Ctrl-C
//! releases every lease before exiting, so other workers take over at once.
//!
//! Until the IMAP engine lands (a later issue) the binary drives the
//! in-process scripted source: it exercises ownership, tiers and the loops,
//! and syncs no real mail.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use leasehold_core::{TokioClock, WorkerId};
use sync_worker::{wiring, Config, Coordinator, Deps, MemoryDirectory, ScriptedSource};

#[derive(Parser, Debug)]
#[command(name = "sync-worker", version, about = "Owns a fair share of the live IMAP accounts and keeps them synced")]
struct Cli {
    /// This worker's id (default: <hostname>-<pid>-<random>).
    #[arg(long, env = "WORKER_ID")]
    worker_id: Option<String>,
    /// Log filter (tracing-subscriber syntax).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    log: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log).context("invalid --log / RUST_LOG filter")?)
        .with_writer(std::io::stderr)
        .init();
    let config = Config::from_env().context("invalid configuration")?;
    let worker = match cli.worker_id.as_deref().or(config.worker_id.as_ref().map(WorkerId::as_str)) {
        Some(id) => WorkerId::new(id).context("invalid --worker-id / WORKER_ID")?,
        None => leasehold_core::WorkerId::for_this_process(),
    };
    let store = wiring::connect_store(&config).await.context("could not connect the lease store")?;
    tracing::info!(%worker, backend = %wiring::backend_name(&config), "starting");
    let deps = Deps {
        store,
        source: Arc::new(ScriptedSource::new()),
        directory: Arc::new(MemoryDirectory::new()),
        clock: Arc::new(TokioClock::new()),
    };
    let mut handle = Coordinator::start(worker, config, deps).await.context("could not start the coordinator")?;
    let ended = tokio::select! {
        r = shutdown_signal() => { r?; None }
        r = handle.finished() => Some(r),
    };
    match ended {
        None => {
            tracing::info!("shutdown signal: releasing leases");
            handle.shutdown().await.context("shutdown failed")?;
            Ok(())
        }
        Some(r) => r.context("the coordinator ended unexpectedly"),
    }
}

async fn shutdown_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("could not install the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r.context("could not listen for Ctrl-C")?,
    }
    Ok(())
}
