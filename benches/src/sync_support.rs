//! What the IMAP sync benchmarks share: a private Dovecot, a storage (a
//! SQLite file in a temp dir, or, when `DATABASE_URL` is a `postgres://`
//! URL, a fresh database on that server, dropped at the end), accounts in
//! it, and the process's memory figures.

use std::time::Duration;

use anyhow::{Context, Result};
use leasehold_core::{FencingToken, LeaseKey, WorkerId};
use sync_worker::deadline::LeaseDeadline;
use sync_worker::storage::{AccountAuth, Email, NewAccount, Security, Storage};
use sync_worker::testing::{mail_gen, Dovecot, DovecotOptions, TestDb};
use sync_worker::Fence;

pub struct World {
    pub dovecot: Dovecot,
    pub storage: Storage,
    pub database: String,
    /// How accounts reach the server: plain on its port, or TLS from the
    /// first byte on its TLS port.
    security: Security,
    _db: TestDb,
}

pub async fn world() -> Result<World> {
    world_with(&DovecotOptions::default()).await
}

/// A world whose Dovecot has these options; accounts use TLS when it does.
pub async fn world_with(options: &DovecotOptions) -> Result<World> {
    let dovecot = Dovecot::start_with(options).context("start Dovecot")?;
    let security = if options.tls.is_some() { Security::Tls } else { Security::Plain };
    let db = match std::env::var("DATABASE_URL") {
        Ok(u) if u.starts_with("postgres") => TestDb::postgres_on(&u, "bench")?,
        _ => TestDb::sqlite("bench")?,
    };
    let storage = db.open().await.context("open the storage")?;
    let database = format!("{:?}", storage.kind()).to_lowercase();
    Ok(World { dovecot, storage, database, security, _db: db })
}

impl World {
    /// A Dovecot user and its account (password `pw`).
    pub async fn account(&self, user: &str) -> Result<LeaseKey> {
        self.dovecot.add_user(user, "pw")?;
        let email: Email = format!("{user}@example.org").parse()?;
        let u = self.storage.add_user(&email).await?;
        Ok(self
            .storage
            .add_account(&NewAccount {
                user: u.id,
                host: self.dovecot.host().to_string(),
                port: match self.security {
                    Security::Tls => self.dovecot.tls_port().context("a TLS world's Dovecot has a TLS port")?,
                    _ => self.dovecot.port(),
                },
                security: self.security,
                username: user.to_string(),
                auth: AccountAuth::Password("pw".into()),
            })
            .await?)
    }

    /// Appends `n` realistic messages (seed `seed`) in slices, so the
    /// generator never holds the whole mailbox in memory.
    pub fn fill(&self, user: &str, folder: &str, n: u64, seed: u64) -> Result<()> {
        let mut i = 0;
        while i < n {
            let end = (i + 500).min(n);
            let msgs: Vec<Vec<u8>> = (i..end).map(|k| mail_gen::message(seed, k).raw).collect();
            self.dovecot.append_many(user, folder, msgs.iter().map(|m| m.as_slice()))?;
            i = end;
        }
        Ok(())
    }
}

pub fn fence(account: &LeaseKey) -> Fence {
    Fence {
        account: account.clone(),
        worker: WorkerId::new("bench").expect("id"),
        token: FencingToken(1),
        deadline: LeaseDeadline::unbounded(),
    }
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

/// Resident memory now, KiB.
pub fn rss_kib() -> u64 {
    status_kib("VmRSS:")
}

/// Peak resident memory since the last [`reset_peak`], KiB.
pub fn peak_kib() -> u64 {
    status_kib("VmHWM:")
}

/// Restarts the peak (`/proc/self/clear_refs`, "5").
pub fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

pub fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}
