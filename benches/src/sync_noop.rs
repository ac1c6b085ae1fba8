//! `sync-noop`: a poll of an unchanged account with 20 folders (INBOX, the
//! five special folders, 14 others under `Projects`), a few messages in
//! each, after its initial sync. The engine polls every folder; Dovecot
//! offers LIST-STATUS, so the target is one LIST-STATUS answering all of
//! them, and no STATUS, no FETCH, no SELECT at all.
//!
//! Figures: the commands the poll sent (by kind), and the wall time of the
//! poll on an open connection and of connect + poll.

use std::time::Instant;

use anyhow::{ensure, Result};
use serde_json::json;
use sync_worker::imap::{ImapSettings, ImapSource};
use sync_worker::{MailSource, Scope};

use crate::sync_support::{fence, world};

pub async fn run() -> Result<serde_json::Value> {
    let w = world().await?;
    let account = w.account("noop").await?;
    w.fill("noop", "INBOX", 20, 1)?;
    for f in ["Sent", "Drafts", "Trash", "Junk", "Archive"] {
        w.fill("noop", f, 3, 2)?;
    }
    for i in 0..14 {
        let name = format!("Projects/p{i}");
        w.dovecot.doveadm(&["mailbox", "create", "-u", "noop", &name])?;
        w.fill("noop", &name, 2, 3)?;
    }
    let first = ImapSource::new(w.storage.clone(), ImapSettings::default());
    first.connect(&fence(&account)).await?.poll(Scope::All).await?;
    let source = ImapSource::new(w.storage.clone(), ImapSettings::default());
    let started = Instant::now();
    let mut conn = source.connect(&fence(&account)).await?;
    let connected = started.elapsed();
    let connect_commands = source.commands();
    let t = Instant::now();
    let report = conn.poll(Scope::All).await?;
    let poll = t.elapsed();
    let total = started.elapsed();
    ensure!(report.new_messages == 0, "an unchanged account got {} new messages", report.new_messages);
    let mut sent = source.commands();
    for (k, v) in connect_commands {
        if let Some(n) = sent.get_mut(&k) {
            *n -= v;
        }
    }
    sent.retain(|_, v| *v > 0);
    let fetches: u64 = sent.iter().filter(|(k, _)| k.contains("FETCH")).map(|(_, v)| v).sum();
    println!(
        "poll of an unchanged 20-folder account: {sent:?} in {:.2} ms (connect {:.2} ms)",
        poll.as_secs_f64() * 1e3,
        connected.as_secs_f64() * 1e3
    );
    Ok(json!({
        "bench": "sync-noop",
        "database": w.database,
        "folders_on_server": 20,
        "folders_polled": w.storage.folder_names(&account).await?.len(),
        "status_commands": sent.get("STATUS").copied().unwrap_or(0),
        "commands": sent,
        "fetches": fetches,
        "poll_ms": poll.as_secs_f64() * 1e3,
        "connect_and_poll_ms": total.as_secs_f64() * 1e3,
    }))
}
