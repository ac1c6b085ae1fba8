//! `sync-initial`: the initial sync of one Dovecot INBOX of 10,000
//! realistic messages (2–50 KB, multipart, with headers; the harness's
//! `mail_gen`), by the real IMAP engine into the storage (SQLite file by
//! default, Postgres when `DATABASE_URL` is `postgres://...`).
//!
//! Figures: `messages_per_s` over the whole connect + poll; `peak_rss_mib`
//! (the process's peak resident memory during the sync, over its baseline:
//! `/proc/self/clear_refs` restarts the peak), measured once for a 2,000- and
//! once for the 10,000-message mailbox, so `peak_grows_with_size` shows
//! whether memory follows the mailbox (it must not: batches of 500 stream).
//! Target: >= 3,000 messages/s.

use std::time::Instant;

use anyhow::{ensure, Result};
use serde_json::json;
use sync_worker::imap::{ImapSettings, ImapSource};
use sync_worker::{MailSource, Scope};

use crate::sync_support::{fence, peak_kib, reset_peak, rss_kib, world};

const SMALL: u64 = 2_000;
const LARGE: u64 = 10_000;

pub async fn run() -> Result<serde_json::Value> {
    let w = world().await?;
    let small = w.account("small").await?;
    let large = w.account("large").await?;
    println!("filling Dovecot: {SMALL} + {LARGE} messages ...");
    w.fill("small", "INBOX", SMALL, 1)?;
    w.fill("large", "INBOX", LARGE, 2)?;
    let source = ImapSource::new(w.storage.clone(), ImapSettings::default());
    let mut figures = Vec::new();
    for (account, n) in [(&small, SMALL), (&large, LARGE)] {
        let base = rss_kib();
        reset_peak();
        let started = Instant::now();
        let mut conn = source.connect(&fence(account)).await?;
        let report = conn.poll(Scope::Inbox).await?;
        let secs = started.elapsed().as_secs_f64();
        let peak = peak_kib().saturating_sub(base);
        ensure!(report.new_messages == n, "synced {} of {n} messages", report.new_messages);
        let rate = n as f64 / secs;
        println!("{n} messages in {secs:.2} s: {rate:.0} messages/s, peak RSS +{:.1} MiB", peak as f64 / 1024.0);
        figures.push((n, rate, secs, peak));
    }
    let (_, small_rate, _, small_peak) = figures[0];
    let (_, rate, secs, peak) = figures[1];
    Ok(json!({
        "bench": "sync-initial",
        "database": w.database,
        "messages": LARGE,
        "seconds": secs,
        "messages_per_s": rate.round(),
        "target_messages_per_s": 3000,
        "peak_rss_mib": (peak as f64 / 1024.0 * 10.0).round() / 10.0,
        "small_mailbox_messages": SMALL,
        "small_mailbox_messages_per_s": small_rate.round(),
        "small_mailbox_peak_rss_mib": (small_peak as f64 / 1024.0 * 10.0).round() / 10.0,
        "commands": source.commands(),
    }))
}
