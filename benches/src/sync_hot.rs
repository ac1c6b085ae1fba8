//! `sync-hot`: 500 hot accounts (500 Dovecot users) held by one worker: a
//! coordinator on the memory lease store, driving the real IMAP engine into
//! the storage. Every account starts hot (its tier is set before the claim),
//! so each keeps an IDLE connection on its INBOX.
//!
//! Figures: `rss_kib_per_hot_account`, the growth of this process's resident
//! memory from before the coordinator starts until every account is
//! watching, divided by 500 (target <= 64 KiB); and the APPEND-to-DB latency
//! over 200 APPENDs to accounts in turn (from the APPEND's OK to the row in
//! storage; target p99 <= 1 s).
//!
//! Dovecot wakes an IDLE at once through inotify, one inotify instance per
//! imap process; past `fs.inotify.max_user_instances` (Linux's default is
//! 128) it falls back to checking every 30 s (`mailbox_idle_check_interval`)
//! and the latency measures that, not the engine. The bench raises the limit
//! to 1024 when it can (it runs as root in CI) and says so; when it cannot,
//! it warns and the figures are bounded by Dovecot's 30 s check.
//!
//! What bounds the latency: Dovecot itself coalesces mailbox changes for
//! about half a second before it tells an IDLE client (measured here: p50
//! ~540 ms, p99 ~910 ms on the 2-core machine), then the engine's INBOX poll
//! (STATUS, SELECT, UID SEARCH, FETCH, one fenced commit) adds tens of ms.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use leasehold_core::{LeaseKey, LeaseStore, Presence, Tier, TokioClock, WorkerId};
use serde_json::json;
use sync_worker::imap::{ImapSettings, ImapSource};
use sync_worker::testing::mail_gen;
use sync_worker::{Config, Coordinator, Deps};

use crate::sync_support::{pct, rss_kib, world};

const ACCOUNTS: usize = 500;
const APPENDS: usize = 200;

async fn inbox_count(storage: &sync_worker::storage::Storage, account: &LeaseKey) -> Result<u64> {
    match storage.folder_state(account, "INBOX").await? {
        Some(st) => Ok(storage.message_count(account, "INBOX", st.uidvalidity).await?),
        None => Ok(0),
    }
}

const INOTIFY_LIMIT: &str = "/proc/sys/fs/inotify/max_user_instances";

/// Makes room for one inotify instance per hot account's imap process.
fn raise_inotify_limit() -> Option<u64> {
    let now: u64 = std::fs::read_to_string(INOTIFY_LIMIT).ok()?.trim().parse().ok()?;
    let wanted = (ACCOUNTS as u64 * 2).max(1024);
    if now >= wanted {
        return Some(now);
    }
    match std::fs::write(INOTIFY_LIMIT, wanted.to_string()) {
        Ok(()) => {
            println!("raised {INOTIFY_LIMIT} from {now} to {wanted} (Dovecot needs one per IDLE process)");
            Some(wanted)
        }
        Err(e) => {
            println!("warning: {INOTIFY_LIMIT} is {now} and cannot be raised ({e}): IDLE wake-ups past {now} processes wait for Dovecot's 30 s check");
            Some(now)
        }
    }
}

pub async fn run() -> Result<serde_json::Value> {
    let inotify_limit = raise_inotify_limit();
    let w = world().await?;
    let leases = Arc::new(leasehold_mem::MemoryStore::new());
    let store: Arc<dyn LeaseStore> = leases.clone();
    let mut accounts = Vec::with_capacity(ACCOUNTS);
    for i in 0..ACCOUNTS {
        let key = w.account(&format!("hot{i}")).await?;
        store.mark_live(&key).await?;
        leases.set_tier(&key, Tier::Hot).await?;
        accounts.push(key);
    }
    let config = Config {
        poll_warm: Duration::from_secs(3600),
        poll_cold: Duration::from_secs(3600),
        tier_eval_interval: Duration::from_secs(3600),
        hot_budget_per_worker: ACCOUNTS * 2,
        ..Config::default()
    };
    let source = ImapSource::new(w.storage.clone(), ImapSettings::from(&config));
    let deps = Deps {
        store,
        buckets: leases.clone(),
        presence: leases,
        source: Arc::new(source.clone()),
        directory: Arc::new(w.storage.clone()),
        clock: Arc::new(TokioClock::new()),
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let base = rss_kib();
    let started = Instant::now();
    let handle = Coordinator::start(WorkerId::new("hot-bench")?, config, deps).await?;
    // Every account watching: its INBOX polled, then IDLE issued.
    loop {
        let idles = source.commands().get("IDLE").copied().unwrap_or(0);
        if idles as usize >= ACCOUNTS {
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("only {idles} of {ACCOUNTS} accounts reached IDLE in 300 s; Dovecot log:\n{}", w.dovecot.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let settle = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = rss_kib();
    let per_account = rss.saturating_sub(base) as f64 / ACCOUNTS as f64;
    println!(
        "{ACCOUNTS} hot accounts watching after {:.1} s; RSS {base} -> {rss} KiB: {per_account:.1} KiB per hot account",
        settle.as_secs_f64()
    );
    let mut latencies = Vec::with_capacity(APPENDS);
    for i in 0..APPENDS {
        let idx = (i * 7) % ACCOUNTS;
        let key = accounts[idx].clone();
        let before = inbox_count(&w.storage, &key).await?;
        let user = format!("hot{idx}");
        let raw = mail_gen::message(7, i as u64).raw;
        let port = w.dovecot.port();
        tokio::task::spawn_blocking(move || -> Result<()> {
            let mut s = sync_worker::testing::ImapSession::login(port, &user, "pw")?;
            s.append("INBOX", &[], &raw)?;
            s.logout();
            Ok(())
        })
        .await??;
        let appended = Instant::now();
        while inbox_count(&w.storage, &key).await? <= before {
            if appended.elapsed() > Duration::from_secs(30) {
                bail!("APPEND {i} to hot{idx} never reached the DB");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        latencies.push(appended.elapsed());
        if (i + 1) % 50 == 0 {
            println!("{} appends done", i + 1);
        }
    }
    latencies.sort();
    let (p50, p99) = (pct(&latencies, 0.5), pct(&latencies, 0.99));
    println!("APPEND-to-DB over {APPENDS} appends: p50 {p50:.1} ms, p99 {p99:.1} ms");
    handle.shutdown().await?;
    Ok(json!({
        "bench": "sync-hot",
        "database": w.database,
        "hot_accounts": ACCOUNTS,
        "seconds_to_all_watching": settle.as_secs_f64(),
        "rss_base_kib": base,
        "rss_kib": rss,
        "rss_kib_per_hot_account": (per_account * 10.0).round() / 10.0,
        "target_rss_kib_per_hot_account": 64,
        "append_to_db_p50_ms": p50,
        "append_to_db_p99_ms": p99,
        "target_append_to_db_p99_ms": 1000,
        "appends": APPENDS,
        "inotify_max_user_instances": inotify_limit,
    }))
}
