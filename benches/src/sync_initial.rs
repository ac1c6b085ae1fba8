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
//! Target (issue #21): >= 10,000 messages/s. The engine parses and commits
//! a batch while the next one is fetched, so the bound is the server:
//! `server_alone_messages_per_s` is Dovecot's own rate for the same FETCH
//! commands (batches of 500, `NEW_MAIL_QUERY`'s items) read by a raw client
//! that parses and stores nothing, on a copy of the mailbox that nobody has
//! fetched yet (Dovecot builds its cache on the first FETCH: a mailbox
//! fetched before answers about three times as fast).

use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use serde_json::json;
use sync_worker::imap::{ImapSettings, ImapSource, BATCH, NEW_MAIL_QUERY};
use sync_worker::{MailSource, Scope};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::sync_support::{fence, peak_kib, reset_peak, rss_kib, world};

const SMALL: u64 = 2_000;
const LARGE: u64 = 10_000;

pub async fn run() -> Result<serde_json::Value> {
    let w = world().await?;
    let small = w.account("small").await?;
    let large = w.account("large").await?;
    // Added with the others, before any login: Dovecot rereads its users
    // file by mtime in whole seconds, and may miss a write made later.
    w.dovecot.add_user("alone", "pw")?;
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
    // A mailbox of the same messages that nobody has fetched yet: Dovecot
    // builds its cache on a first FETCH, so the synced one would flatter it.
    w.fill("alone", "INBOX", LARGE, 2)?;
    let alone = server_alone(&w, "alone", LARGE).await?;
    println!("Dovecot alone, the same FETCHes: {alone:.0} messages/s");
    let (_, small_rate, _, small_peak) = figures[0];
    let (_, rate, secs, peak) = figures[1];
    Ok(json!({
        "bench": "sync-initial",
        "database": w.database,
        "messages": LARGE,
        "seconds": secs,
        "messages_per_s": rate.round(),
        "target_messages_per_s": 10000,
        "server_alone_messages_per_s": alone.round(),
        "peak_rss_mib": (peak as f64 / 1024.0 * 10.0).round() / 10.0,
        "small_mailbox_messages": SMALL,
        "small_mailbox_messages_per_s": small_rate.round(),
        "small_mailbox_peak_rss_mib": (small_peak as f64 / 1024.0 * 10.0).round() / 10.0,
        "commands": source.commands(),
    }))
}

/// Dovecot's own rate for the engine's new-mail FETCHes of `user`'s INBOX
/// (`n` messages, UIDs 1..=n): a raw client logs in, examines, sends
/// `UID FETCH lo:hi <the engine's items>` per batch of [`BATCH`] and reads
/// each answer to its tagged OK, parsing nothing.
async fn server_alone(w: &crate::sync_support::World, user: &str, n: u64) -> Result<f64> {
    let tcp = TcpStream::connect((w.dovecot.host(), w.dovecot.port())).await.context("connect to Dovecot")?;
    let mut c = RawClient { tcp, buf: vec![0; 1 << 20], tail: Vec::new() };
    c.greeting().await?;
    c.command("l", &format!("LOGIN {user} pw")).await?;
    c.command("s", "EXAMINE INBOX").await?;
    let started = Instant::now();
    let (mut lo, mut bytes) = (1, 0);
    while lo <= n {
        let hi = (lo + BATCH as u64 - 1).min(n);
        bytes += c.command(&format!("f{lo}"), &format!("UID FETCH {lo}:{hi} {NEW_MAIL_QUERY}")).await?;
        lo = hi + 1;
    }
    let secs = started.elapsed().as_secs_f64();
    ensure!(bytes > n * 1024, "Dovecot answered only {bytes} bytes for {n} messages");
    Ok(n as f64 / secs)
}

/// An IMAP client that sends commands and counts their answers' bytes.
struct RawClient {
    tcp: TcpStream,
    buf: Vec<u8>,
    /// The last bytes read: where a tagged answer's line is looked for.
    tail: Vec<u8>,
}

impl RawClient {
    async fn greeting(&mut self) -> Result<()> {
        self.read_until(|tail| tail.starts_with(b"\r\n* OK") && tail.ends_with(b"\r\n")).await?;
        Ok(())
    }

    /// Sends `tag text` and reads to the tagged OK; answers the bytes read.
    async fn command(&mut self, tag: &str, text: &str) -> Result<u64> {
        self.tcp.write_all(format!("{tag} {text}\r\n").as_bytes()).await?;
        let done = format!("\r\n{tag} OK");
        let answered = |tail: &[u8]| {
            tail.ends_with(b"\r\n") && tail.windows(done.len()).rposition(|w| w == done.as_bytes()).is_some()
        };
        self.read_until(answered).await.with_context(|| format!("{tag} {text}"))
    }

    /// Reads until `done(the last bytes read)`, which begin with a line
    /// break: every read starts at the beginning of a line.
    async fn read_until(&mut self, done: impl Fn(&[u8]) -> bool) -> Result<u64> {
        self.tail.clear();
        self.tail.extend_from_slice(b"\r\n");
        let mut total = 0;
        loop {
            let read = tokio::time::timeout(std::time::Duration::from_secs(30), self.tcp.read(&mut self.buf));
            let got = read.await.context("Dovecot sent nothing for 30 s")??;
            if got == 0 {
                bail!("Dovecot closed the connection; it sent {:?}", String::from_utf8_lossy(&self.tail));
            }
            total += got as u64;
            self.tail.extend_from_slice(&self.buf[..got]);
            if self.tail.len() > 4096 {
                self.tail.drain(..self.tail.len() - 4096);
            }
            if done(&self.tail) {
                return Ok(total);
            }
        }
    }
}
