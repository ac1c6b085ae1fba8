//! `sync-api`: the sync-worker API measured from this process as a client of
//! a separate `sync-worker serve` process (memory backend, SQLite) over a
//! private Dovecot:
//! * APPEND-to-WebSocket-push latency of a hot account, p50 and p99;
//! * message-list requests/s (pages of 50) on an account of
//!   `SYNC_API_MESSAGES` (default 10,000) messages, 16 concurrent clients;
//! * login requests/s (argon2id bounds it), 4 concurrent clients;
//! * whole-message reads: the first read of a message (from IMAP) and
//!   reads from the SQL cache, p50 / p99 and requests/s;
//! * search latency, p50 / p99, of selective and broad queries (target
//!   p99 <= 50 ms on 100,000 messages: `SYNC_API_MESSAGES=100000`);
//! * a big attachment's download (`SYNC_API_ATTACHMENT_MB`, default 50 MB,
//!   base64 in a multipart/mixed) and its message's raw download:
//!   throughput and the server's RSS growth while each streams;
//! * webhook deliveries/s to a receiver in this process, for a burst of
//!   `SYNC_API_WEBHOOK_BURST` (default 1,000) new messages ([`crate::sync_webhooks`]).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use serde_json::{json, Value};
use sync_worker::testing::Dovecot;

use crate::machine::{load_1m, process_cpu_s};
use crate::sync_support::pct;

const PUSHES: usize = 50;
const MEASURE: Duration = Duration::from_secs(5);

/// The `sync-worker` binary beside this benchmark's executable, built when missing.
fn sync_worker_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find this benchmark's executable")?;
    let profile_dir = exe.parent().context("benchmark executable has no directory")?.to_owned();
    let candidate = profile_dir.join("sync-worker");
    let target_dir = profile_dir.parent().context("benchmark executable is not in a target dir")?;
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    println!("building the sync-worker binary ({})", if release { "release" } else { "debug" });
    let mut build = Command::new(cargo);
    // `cargo run` gave this process its package's CARGO_PKG_*, CARGO_MANIFEST_*
    // and such; build scripts (ring's) name them in rerun-if-env-changed, so
    // passing them on would rebuild ring and all above it on every run.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(cargo_set_for_run) {
            build.env_remove(&name);
        }
    }
    // Selecting leasehold-benches too resolves features exactly as the
    // `cargo run -p leasehold-benches` that started this process did, so
    // cargo reuses every compiled dependency and only links the binary.
    build
        .args(["build", "-p", "leasehold-benches", "-p", "sync-worker", "--bin", "sync-worker"])
        .env("CARGO_TARGET_DIR", target_dir);
    if release {
        build.arg("--release");
    }
    let status = build.status().context("cannot run cargo to build sync-worker")?;
    if !status.success() || !candidate.is_file() {
        bail!("building sync-worker failed ({status})");
    }
    Ok(candidate)
}

/// An environment variable `cargo run` sets for the program it runs (not
/// one a user sets for cargo itself).
fn cargo_set_for_run(name: &str) -> bool {
    ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_BIN_", "CARGO_CRATE_"].iter().any(|p| name.starts_with(p))
        || name == "CARGO_PRIMARY_PACKAGE"
        || name == "OUT_DIR"
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn mail(i: usize) -> Vec<u8> {
    format!(
        "From: Carol <carol@example.org>\r\nTo: bench@example.org\r\nSubject: bench-{i}\r\n\
         Message-ID: <bench-{i}@example.org>\r\n\r\nMessage number {i} of the sync-api benchmark.\r\n"
    )
    .into_bytes()
}

async fn post(http: &reqwest::Client, url: String, token: Option<&str>, body: Value) -> Result<Value> {
    let mut req = http.post(&url).json(&body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await?;
    let status = r.status();
    let v: Value = r.json().await?;
    if !status.is_success() {
        bail!("POST {url}: {status} {v}");
    }
    Ok(v)
}

pub async fn run() -> Result<Value> {
    let n: usize = std::env::var("SYNC_API_MESSAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let bin = sync_worker_binary()?;
    let dovecot = Dovecot::start().context("Dovecot")?;
    dovecot.add_user("bench", "bench-pw")?;
    println!("appending {n} messages");
    let messages: Vec<Vec<u8>> = (0..n).map(mail).collect();
    dovecot.append_many("bench", "INBOX", messages.iter().map(Vec::as_slice))?;

    let dir = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let base = format!("http://127.0.0.1:{port}");
    let server = Server(
        Command::new(&bin)
            .arg("serve")
            .current_dir(dir.path())
            .env("LISTEN", format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "warn")
            .env("TIER_EVAL_INTERVAL", "1s")
            // The benchmark's Dovecot is on loopback, which the API refuses by default.
            .env("IMAP_ALLOW_PRIVATE", "true")
            .stdout(Stdio::null())
            .spawn()
            .context("cannot start sync-worker serve")?,
    );
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while http.get(format!("{base}/")).send().await.is_err() {
        if Instant::now() > deadline {
            bail!("sync-worker serve never answered");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let creds = json!({"email": "bench@example.org", "password": "bench-password"});
    post(&http, format!("{base}/v1/users"), None, creds.clone()).await?;
    let token = post(&http, format!("{base}/v1/login"), None, creds.clone()).await?["token"]
        .as_str()
        .context("no token")?
        .to_string();
    let account = json!({"host": dovecot.host(), "port": dovecot.port(), "security": "plain",
                         "username": "bench", "password": "bench-pw"});
    let id = post(&http, format!("{base}/v1/accounts"), Some(&token), account).await?["id"]
        .as_str()
        .context("no id")?
        .to_string();
    let synced_at = Instant::now();
    loop {
        let a: Value = http.get(format!("{base}/v1/accounts/{id}")).bearer_auth(&token).send().await?.json().await?;
        let inbox = a["folders"].as_array().and_then(|f| f.iter().find(|f| f["name"] == "INBOX").cloned());
        if inbox.is_some_and(|f| f["messages"] == n as u64) && a["tier"] == "hot" {
            break;
        }
        if synced_at.elapsed() > Duration::from_secs(600) {
            bail!("the account never synced {n} messages hot: {a}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("initial sync of {n} messages: {:.1} s", synced_at.elapsed().as_secs_f64());

    // Pages of 50: walk the cursors once, then request them round-robin.
    let mut cursors: Vec<Option<String>> = vec![None];
    while cursors.len() < 200 {
        let mut url = format!("{base}/v1/accounts/{id}/messages?limit=50");
        if let Some(c) = cursors.last().cloned().flatten() {
            url.push_str(&format!("&cursor={c}"));
        }
        let page: Value = http.get(url).bearer_auth(&token).send().await?.json().await?;
        match page["next_cursor"].as_str() {
            Some(c) => cursors.push(Some(c.to_string())),
            None => break,
        }
    }
    let cursors = Arc::new(cursors);
    let server_pid = server.0.id();
    let (server_cpu_before, client_cpu_before) = (process_cpu_s(server_pid)?, process_cpu_s(std::process::id())?);
    let done = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + MEASURE;
    let mut tasks = Vec::new();
    for t in 0..16usize {
        let (http, base, id, token, cursors, done) =
            (http.clone(), base.clone(), id.clone(), token.clone(), cursors.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = t;
            while Instant::now() < end {
                let mut url = format!("{base}/v1/accounts/{id}/messages?limit=50");
                if let Some(c) = &cursors[i % cursors.len()] {
                    url.push_str(&format!("&cursor={c}"));
                }
                let r = http.get(url).bearer_auth(&token).send().await?;
                if !r.status().is_success() {
                    bail!("list: {}", r.status());
                }
                r.bytes().await?;
                done.fetch_add(1, Ordering::Relaxed);
                i += 16;
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let lists = done.load(Ordering::Relaxed) as f64;
    let list_rps = lists / MEASURE.as_secs_f64();
    // CPU per request says what the rate would be on cores of its own: on a
    // shared 2-core machine the rate alone moves with whatever else runs.
    let list_server_cpu_us = (process_cpu_s(server_pid)? - server_cpu_before) * 1e6 / lists;
    let list_client_cpu_us = (process_cpu_s(std::process::id())? - client_cpu_before) * 1e6 / lists;
    println!(
        "message list (pages of 50, 16 clients): {list_rps:.0} req/s (target >= 5000); CPU per request: \
         server {list_server_cpu_us:.0} µs, this client {list_client_cpu_us:.0} µs (load {:.1})",
        load_1m()
    );

    let logins = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + MEASURE;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (http, base, creds, logins) = (http.clone(), base.clone(), creds.clone(), logins.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                post(&http, format!("{base}/v1/login"), None, creds.clone()).await?;
                logins.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let login_rps = logins.load(Ordering::Relaxed) as f64 / MEASURE.as_secs_f64();
    println!("login (argon2id, 4 clients): {login_rps:.1} req/s");

    let reads = whole_messages(&http, &base, &id, &token, server_pid).await?;
    let search = searches(&http, &base, &id, &token, n).await?;
    let attachment = big_attachment(&http, &base, &id, &token, &dovecot, server_pid, n).await?;

    let (mut ws, _) = {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
        let mut req = format!("ws://127.0.0.1:{port}/v1/ws").into_client_request()?;
        req.headers_mut().insert("authorization", format!("Bearer {token}").parse()?);
        tokio_tungstenite::connect_async(req).await?
    };
    let dovecot = Arc::new(dovecot);
    let mut latencies = Vec::with_capacity(PUSHES);
    for i in 0..PUSHES {
        let subject = format!("push-{i}");
        let raw = mail(n + i).into_iter().collect::<Vec<u8>>();
        let raw = String::from_utf8(raw)?.replace(&format!("bench-{}", n + i), &subject).into_bytes();
        let d = dovecot.clone();
        let t0 = Instant::now();
        tokio::task::spawn_blocking(move || d.append("bench", "INBOX", &raw)).await??;
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
                .await
                .with_context(|| format!("no push of {subject} within 10 s"))?;
            let Some(Ok(tokio_tungstenite::tungstenite::Message::Text(t))) = msg else { continue };
            let ev: Value = serde_json::from_str(t.as_str())?;
            if ev["type"] == "message.new" && ev["message"]["subject"] == subject {
                latencies.push(t0.elapsed());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let burst: usize = std::env::var("SYNC_API_WEBHOOK_BURST").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000);
    let hooks =
        crate::sync_webhooks::burst(&http, &base, &token, &dovecot, "bench", burst, |i| mail(n + PUSHES + i)).await?;
    println!(
        "webhooks ({burst} new messages): {:.0} deliveries/s, the last {:.1} s after the APPEND began, {:.2} POSTs per event",
        hooks.per_s, hooks.end_to_end_s, hooks.posts_per_event
    );
    // The server goes before the Dovecot it watches.
    drop(server);
    latencies.sort();
    let (p50, p99) = (pct(&latencies, 0.5), pct(&latencies, 0.99));
    println!("APPEND to WebSocket push ({PUSHES} pushes): p50 {p50:.0} ms, p99 {p99:.0} ms (target p99 <= 1000 ms)");
    Ok(json!({
        "bench": "sync-api",
        "messages": n,
        "push_p50_ms": p50,
        "push_p99_ms": p99,
        "list_rps": list_rps.round(),
        "list_server_cpu_us": list_server_cpu_us.round(),
        "list_client_cpu_us": list_client_cpu_us.round(),
        "login_rps": (login_rps * 10.0).round() / 10.0,
        "detail_imap_p50_ms": reads.imap_p50,
        "detail_imap_p99_ms": reads.imap_p99,
        "detail_cached_p99_ms": reads.cached_p99,
        "detail_cached_rps": reads.cached_rps.round(),
        "search_p50_ms": search.0,
        "search_p99_ms": search.1,
        "attachment_mb": attachment.size_mb,
        "attachment_mb_per_s": attachment.decoded.0,
        "attachment_rss_growth_mb": attachment.decoded.1,
        "raw_mb_per_s": attachment.raw.0,
        "raw_rss_growth_mb": attachment.raw.1,
        "webhook_deliveries_per_s": hooks.per_s.round(),
        "webhook_burst_end_to_end_s": (hooks.end_to_end_s * 10.0).round() / 10.0,
    }))
}

/// What reading whole messages measured.
struct Reads {
    imap_p50: f64,
    imap_p99: f64,
    cached_p99: f64,
    cached_rps: f64,
}

/// The ids of the first `n` messages of INBOX, newest first.
async fn message_ids(http: &reqwest::Client, base: &str, id: &str, token: &str, n: usize) -> Result<Vec<String>> {
    let page: Value =
        http.get(format!("{base}/v1/accounts/{id}/messages?limit={n}")).bearer_auth(token).send().await?.json().await?;
    Ok(page["messages"]
        .as_array()
        .context("no messages")?
        .iter()
        .filter_map(|m| m["id"].as_str().map(str::to_string))
        .collect())
}

async fn timed_get(http: &reqwest::Client, url: String, token: &str) -> Result<Duration> {
    let t0 = Instant::now();
    let r = http.get(&url).bearer_auth(token).send().await?;
    if !r.status().is_success() {
        bail!("GET {url}: {}", r.status());
    }
    r.bytes().await?;
    Ok(t0.elapsed())
}

/// 200 messages read once each (from IMAP), then again from the cache by
/// 16 clients for [`MEASURE`].
async fn whole_messages(http: &reqwest::Client, base: &str, id: &str, token: &str, _server: u32) -> Result<Reads> {
    let ids = message_ids(http, base, id, token, 200).await?;
    let mut first = Vec::with_capacity(ids.len());
    for m in &ids {
        first.push(timed_get(http, format!("{base}/v1/accounts/{id}/messages/{m}"), token).await?);
    }
    first.sort();
    let (imap_p50, imap_p99) = (pct(&first, 0.5), pct(&first, 0.99));
    let ids = Arc::new(ids);
    let end = Instant::now() + MEASURE;
    let mut tasks = Vec::new();
    for t in 0..16usize {
        let (http, base, id, token, ids) =
            (http.clone(), base.to_string(), id.to_string(), token.to_string(), ids.clone());
        tasks.push(tokio::spawn(async move {
            let (mut i, mut took) = (t, Vec::new());
            while Instant::now() < end {
                took.push(
                    timed_get(&http, format!("{base}/v1/accounts/{id}/messages/{}", ids[i % ids.len()]), &token)
                        .await?,
                );
                i += 16;
            }
            Ok::<_, anyhow::Error>(took)
        }));
    }
    let mut cached = Vec::new();
    for t in tasks {
        cached.extend(t.await??);
    }
    cached.sort();
    let cached_rps = cached.len() as f64 / MEASURE.as_secs_f64();
    let cached_p99 = pct(&cached, 0.99);
    println!(
        "message detail: from IMAP p50 {imap_p50:.1} ms, p99 {imap_p99:.1} ms (200 reads); from the cache \
         {cached_rps:.0} req/s, p99 {cached_p99:.1} ms (16 clients)"
    );
    Ok(Reads { imap_p50, imap_p99, cached_p99, cached_rps })
}

/// Selective (`bench 4242`: a few matches) and broad (`carol`: every
/// message) searches, pages of 50, one at a time: (p50, p99) in ms.
async fn searches(http: &reqwest::Client, base: &str, id: &str, token: &str, n: usize) -> Result<(f64, f64)> {
    let (mut selective, mut broad) = (Vec::new(), Vec::new());
    for i in 0..100usize {
        let (q, into) = if i % 2 == 0 {
            (format!("bench%20{}", (i * 7919) % n), &mut selective)
        } else {
            ("carol".to_string(), &mut broad)
        };
        into.push(timed_get(http, format!("{base}/v1/accounts/{id}/messages?q={q}&limit=50"), token).await?);
    }
    selective.sort();
    broad.sort();
    let mut all: Vec<Duration> = selective.iter().chain(&broad).copied().collect();
    all.sort();
    let (p50, p99) = (pct(&all, 0.5), pct(&all, 0.99));
    println!(
        "search on {n} messages (100 queries): p50 {p50:.1} ms, p99 {p99:.1} ms (target p99 <= 50 ms on 100,000); \
         selective (`bench <number>`) p99 {:.1} ms, matching every message (`carol`) p99 {:.1} ms",
        pct(&selective, 0.99),
        pct(&broad, 0.99)
    );
    Ok((p50, p99))
}

/// The server's resident set (MiB).
fn rss_mib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no VmRSS")?;
    Ok(kib / 1024.0)
}

/// What downloading the big message measured: (MB/s, server RSS growth MiB) each.
struct BigDownloads {
    size_mb: u64,
    decoded: (f64, f64),
    raw: (f64, f64),
}

/// GETs `url`, reading the body as it comes while sampling the server's
/// RSS: (bytes, MB/s, RSS growth MiB).
async fn download(http: &reqwest::Client, url: String, token: &str, server: u32) -> Result<(usize, f64, f64)> {
    let before = rss_mib(server)?;
    let t0 = Instant::now();
    let mut r = http.get(&url).bearer_auth(token).send().await?;
    if !r.status().is_success() {
        bail!("GET {url}: {}", r.status());
    }
    let (mut got, mut peak) = (0usize, before);
    while let Some(chunk) = r.chunk().await? {
        got += chunk.len();
        peak = peak.max(rss_mib(server)?);
    }
    let mb_s = got as f64 / 1e6 / t0.elapsed().as_secs_f64();
    Ok((got, (mb_s * 10.0).round() / 10.0, ((peak - before) * 10.0).round() / 10.0))
}

/// A `SYNC_API_ATTACHMENT_MB` (default 50) MB attachment appended, synced,
/// then downloaded decoded, and its message raw.
async fn big_attachment(
    http: &reqwest::Client,
    base: &str,
    id: &str,
    token: &str,
    dovecot: &Dovecot,
    server: u32,
    n: usize,
) -> Result<BigDownloads> {
    use base64::Engine as _;
    let size_mb: u64 = std::env::var("SYNC_API_ATTACHMENT_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let len = u32::try_from(size_mb << 20).context("SYNC_API_ATTACHMENT_MB is too large")?;
    let data: Vec<u8> = (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut raw = "From: carol@example.org\r\nTo: bench@example.org\r\nSubject: big attachment\r\n\
                   MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\n\
                   Content-Type: text/plain\r\n\r\nattached\r\n--b\r\nContent-Type: application/octet-stream\r\n\
                   Content-Disposition: attachment; filename=big.bin\r\nContent-Transfer-Encoding: base64\r\n\r\n"
        .to_string();
    for line in base64::engine::general_purpose::STANDARD.encode(&data).as_bytes().chunks(76) {
        raw.push_str(std::str::from_utf8(line)?);
        raw.push_str("\r\n");
    }
    raw.push_str("--b--\r\n");
    dovecot.append("bench", "INBOX", raw.as_bytes())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mid = loop {
        let ids = message_ids(http, base, id, token, 1).await?;
        let page: Value = http
            .get(format!("{base}/v1/accounts/{id}/messages?limit=1"))
            .bearer_auth(token)
            .send()
            .await?
            .json()
            .await?;
        if page["messages"][0]["subject"] == "big attachment" {
            break ids[0].clone();
        }
        if Instant::now() > deadline {
            bail!("the big message was never synced (after {n} others)");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let url = format!("{base}/v1/accounts/{id}/messages/{mid}");
    let (got, mb_s, growth) = download(http, format!("{url}/attachments/2"), token, server).await?;
    if got != data.len() {
        bail!("the attachment came back with {got} bytes, not {}", data.len());
    }
    println!("{size_mb} MB attachment (base64): {mb_s:.1} MB/s, server RSS +{growth:.1} MiB while it streamed");
    let (got, raw_mb_s, raw_growth) = download(http, format!("{url}/raw"), token, server).await?;
    if got != raw.len() {
        bail!("the raw message came back with {got} bytes, not {}", raw.len());
    }
    println!(
        "its raw message ({:.0} MB): {raw_mb_s:.1} MB/s, server RSS +{raw_growth:.1} MiB while it streamed",
        raw.len() as f64 / 1e6
    );
    Ok(BigDownloads { size_mb, decoded: (mb_s, growth), raw: (raw_mb_s, raw_growth) })
}
