//! A takeover of 10,000 accounts ramps up: a worker opens new IMAP
//! connections at `CONNECT_RATE` (plus a burst of one second's worth), not
//! all at once. Every account points at one local server that records when
//! it accepted each connection and refuses the login (so each account
//! connects once, then waits out its login backoff).
//!
//! The server accepts on a thread of its own, so the worker's load does not
//! delay the timestamps. The OS can still hold the recorder back on a busy
//! machine, and the connections that queued meanwhile are then stamped
//! together: the one-second bound allows for such a stall (`STALL`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sync_worker::app::{start_worker, wiring};
use sync_worker::config::Ownership;
use sync_worker::secret::SecretKey;
use sync_worker::storage::{AccountAuth, Email, NewAccount, Security, Storage};
use sync_worker::Config;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const ACCOUNTS: usize = 10_000;
const RATE: u32 = 500;
/// How late the recorder may stamp an accept on a loaded machine (CI saw a
/// window of 1,051 against a bound of 1,000 when the recorder shared the
/// worker's runtime). With no limiter, 10,000 logins come in well under 2 s.
const STALL: Duration = Duration::from_millis(500);

/// A server that greets, refuses the first command, and records each accept.
fn refusing_server() -> (u16, Arc<Mutex<Vec<Instant>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("a non-blocking listener");
    let port = listener.local_addr().expect("addr").port();
    let accepts = Arc::new(Mutex::new(Vec::with_capacity(ACCOUNTS)));
    let seen = accepts.clone();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("the server's runtime");
    std::thread::spawn(move || {
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            loop {
                let Ok((conn, _)) = listener.accept().await else { continue };
                seen.lock().push(Instant::now());
                tokio::spawn(async move {
                    let (read, mut write) = conn.into_split();
                    let _ = write.write_all(b"* OK [CAPABILITY IMAP4rev1 AUTH=PLAIN] ready\r\n").await;
                    let mut line = String::new();
                    let _ = BufReader::new(read).read_line(&mut line).await;
                    let tag = line.split(' ').next().unwrap_or("a").to_owned();
                    let _ = write.write_all(format!("{tag} NO [AUTHENTICATIONFAILED] refused\r\n").as_bytes()).await;
                });
            }
        })
    });
    (port, accepts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_of_10000_accounts_opens_connections_at_the_connect_rate() {
    let (port, accepts) = refusing_server();
    let dir = tempfile::tempdir().expect("a temp dir");
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("rate.db").display());
    let storage = Storage::open(&url, SecretKey::generate()).await.expect("open the database");
    let user = storage.add_user(&"rate@example.org".parse::<Email>().expect("email")).await.expect("user");
    for i in 0..ACCOUNTS {
        let new = NewAccount {
            user: user.id.clone(),
            host: "127.0.0.1".into(),
            port,
            security: Security::Plain,
            username: format!("user{i}"),
            auth: AccountAuth::Password("pw".into()),
        };
        storage.add_account(&new).await.expect("account");
    }
    let config = Config {
        ownership: Ownership::Buckets,
        connect_rate: std::num::NonZeroU32::new(RATE).expect("a rate"),
        lease_ttl: Duration::from_secs(30),
        ..Config::default()
    };
    let backend = wiring::in_process();
    let started = Instant::now();
    let worker = start_worker("rate-w".parse().expect("a worker id"), &storage, &backend, &config)
        .await
        .expect("the worker starts");
    // Every account is owned, and each connects once.
    let all_in = Duration::from_secs(120);
    while accepts.lock().len() < ACCOUNTS {
        assert!(
            started.elapsed() < all_in,
            "{} of {ACCOUNTS} accounts connected within {all_in:?} (owned: {})",
            accepts.lock().len(),
            worker.coordinator().owned_count()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let times = accepts.lock().clone();
    let first = times[0];
    let span = times[ACCOUNTS - 1] - first;
    // A burst of one second's worth, then RATE a second: no faster than that.
    let fastest = Duration::from_secs_f64((ACCOUNTS as f64 - f64::from(RATE)) / f64::from(RATE));
    assert!(span >= fastest.mul_f64(0.95), "{ACCOUNTS} connections in {span:?}: faster than {RATE}/s");
    // No one-second window holds more than the burst plus a second's rate
    // (and what a stalled recorder stamps late).
    let mut most = 0;
    let mut lo = 0;
    for hi in 0..times.len() {
        while times[hi] - times[lo] >= Duration::from_secs(1) {
            lo += 1;
        }
        most = most.max(hi - lo + 1);
    }
    let bound = RATE as usize + (f64::from(RATE) * (1.0 + STALL.as_secs_f64())) as usize;
    assert!(most <= bound, "{most} connections in one second at CONNECT_RATE={RATE} (bound {bound})");
    eprintln!("{ACCOUNTS} connections over {span:?}; at most {most} in one second");
    worker.shutdown().await.expect("shutdown");
}
