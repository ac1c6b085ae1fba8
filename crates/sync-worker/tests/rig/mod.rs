//! The rig of the end-to-end fencing and ownership tests: accounts on one
//! private Dovecot (through the harness's recording IMAP proxy), stored in
//! one Postgres database with the fence audit trigger, leased on a Redis of
//! the test's own (one server, or a Redis Cluster), with coordinators in
//! this process or `sync-worker worker` processes.
#![allow(dead_code)] // Each test file uses part of it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::{FencingToken, LeaseKey, TokioClock, WorkerId};
use leasehold_redis::test_support::{unique_prefix, RedisCluster, RedisServer};
use leasehold_redis::{RedisConfig, RedisStore};
use sqlx::Row;
use sync_worker::config::Ownership;
use sync_worker::coordinator::reconcile::{self, Reconciler};
use sync_worker::imap::{ImapSettings, ImapSource};
use sync_worker::secret::SecretKey;
use sync_worker::storage::{AccountAuth, Email, NewAccount, Security, Storage};
use sync_worker::testing::{mail_gen, Dovecot, FenceAudit, ImapProxy, Postgres};
use sync_worker::{Config, Coordinator, CoordinatorHandle, Deps};

/// The lease store's server: one Redis, or a Redis Cluster.
pub enum LeaseServer {
    /// One `redis-server`.
    One(RedisServer),
    /// A Redis Cluster.
    Cluster(RedisCluster),
}

impl LeaseServer {
    /// The URL workers are given (`redis://` or `redis+cluster://`).
    pub fn url(&self) -> String {
        match self {
            LeaseServer::One(s) => s.url(),
            LeaseServer::Cluster(c) => c.url(),
        }
    }

    /// The single server, for a test that flushes or restarts it.
    pub fn one(&self) -> &RedisServer {
        match self {
            LeaseServer::One(s) => s,
            LeaseServer::Cluster(_) => panic!("this test flushes or restarts its Redis: give it one server"),
        }
    }
}

pub const PASSWORD: &str = "secret-pw";
/// The SECRET_KEY of every rig (32 zero bytes), so worker processes can read the passwords.
pub const SECRET_KEY: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";

/// Accounts on one Dovecot (reached through a proxy that counts logins),
/// stored in one Postgres database with the audit trigger, leased on one
/// private Redis.
pub struct Rig {
    pub dovecot: Dovecot,
    pub proxy: ImapProxy,
    pub db: Postgres,
    pub storage: Storage,
    pub redis: LeaseServer,
    pub prefix: String,
    /// (account, IMAP user)
    pub accounts: Vec<(LeaseKey, String)>,
    /// Worker processes' logs.
    pub logs: tempfile::TempDir,
    /// How its workers share the accounts.
    pub ownership: Ownership,
}

impl Rig {
    pub async fn new(tag: &str, db: Postgres, n: usize, mails: u64) -> Rig {
        let redis = RedisServer::start().unwrap_or_else(|e| panic!("redis-server: {e}"));
        Self::on(LeaseServer::One(redis), tag, db, n, mails).await
    }

    /// The same on a lease server of the caller's (a Redis Cluster, say).
    pub async fn on(redis: LeaseServer, tag: &str, db: Postgres, n: usize, mails: u64) -> Rig {
        let dovecot = Dovecot::start().unwrap_or_else(|e| panic!("Dovecot: {e}"));
        let proxy = ImapProxy::start(dovecot.port()).unwrap_or_else(|e| panic!("IMAP proxy: {e}"));
        let key = SecretKey::from_base64(SECRET_KEY, "the test key").expect("key");
        let storage = Storage::open(db.url(), key).await.unwrap_or_else(|e| panic!("open: {e:?}"));
        FenceAudit::install(&db).expect("install the fence audit");
        let names: Vec<String> = (0..n).map(|i| format!("user{i}")).collect();
        // One write: Dovecot notices a changed users file by its mtime, in seconds.
        dovecot.add_users(names.iter().map(|u| (u.as_str(), PASSWORD))).expect("add users");
        let mut accounts = Vec::new();
        for (i, name) in names.into_iter().enumerate() {
            let msgs: Vec<Vec<u8>> = (0..mails).map(|m| mail_gen::message(i as u64, m).raw).collect();
            dovecot.append_many(&name, "INBOX", msgs.iter().map(|m| m.as_slice())).expect("append");
            let user = storage.add_user(&format!("{name}@example.org").parse::<Email>().unwrap()).await.expect("user");
            let account = storage
                .add_account(&NewAccount {
                    user: user.id,
                    host: dovecot.host().to_string(),
                    port: proxy.port(),
                    security: Security::Plain,
                    username: name.clone(),
                    auth: AccountAuth::Password(PASSWORD.into()),
                })
                .await
                .expect("account");
            accounts.push((account, name));
        }
        let logs = tempfile::tempdir().expect("a log dir");
        Rig {
            dovecot,
            proxy,
            db,
            storage,
            redis,
            prefix: unique_prefix(tag),
            accounts,
            logs,
            ownership: Ownership::Accounts,
        }
    }

    pub async fn store(&self) -> Arc<dyn sync_worker::Leases> {
        let config = RedisConfig::new(self.redis.url()).with_prefix(self.prefix.clone());
        Arc::new(RedisStore::connect_with(config).await.expect("connect to Redis"))
    }

    /// The same rig, its workers on `ownership`.
    pub fn owned_by(mut self, ownership: Ownership) -> Self {
        self.ownership = ownership;
        self
    }

    /// Raises every account's token counter to `past` (its bucket's, under bucket ownership).
    pub async fn raise_tokens(&self, past: FencingToken) {
        let store = self.store().await;
        for (a, _) in &self.accounts {
            match self.ownership {
                Ownership::Accounts => store.raise_token(a, past).await.expect("raise_token"),
                Ownership::Buckets => store
                    .raise_bucket_token(self.storage.bucket_of(a.as_str()), past)
                    .await
                    .expect("raise_bucket_token"),
            }
        }
    }

    pub fn config(&self, ttl: Duration) -> Config {
        Config {
            ownership: self.ownership,
            lease_ttl: ttl,
            // Polls only when an account is (re)claimed: every login the
            // proxy sees after the initial sync is a claim's first poll.
            poll_warm: Duration::from_secs(600),
            reconcile_interval: Duration::from_millis(500),
            ..Config::default()
        }
    }

    /// A worker as `sync-worker worker` assembles it: a reconciler and a
    /// coordinator on the real IMAP engine.
    pub async fn worker(&self, name: &str, config: Config) -> (CoordinatorHandle, Reconciler) {
        let store = self.store().await;
        reconcile::reconcile(&self.storage, store.as_ref()).await.expect("reconcile");
        let reconciler = reconcile::spawn(self.storage.clone(), store.clone(), config.reconcile_interval);
        let deps = Deps {
            store: store.clone(),
            buckets: store.clone(),
            presence: store.clone(),
            source: Arc::new(ImapSource::new(self.storage.clone(), ImapSettings::from(&config))),
            directory: Arc::new(self.storage.clone()),
            clock: Arc::new(TokioClock::new()),
        };
        let handle = Coordinator::start(WorkerId::new(name).unwrap(), config, deps).await.expect("coordinator");
        (handle, reconciler)
    }

    /// `sync-worker worker` as a process of its own, with lease TTL `ttl`,
    /// polling only when it (re)claims an account.
    pub fn worker_process(&self, name: &str, ttl: Duration) -> WorkerProcess {
        self.worker_process_polling(name, ttl, Duration::from_secs(600))
    }

    /// `sync-worker worker` as a process of its own, with lease TTL `ttl`
    /// and warm polls every `poll`. A restarted worker appends to its log.
    pub fn worker_process_polling(&self, name: &str, ttl: Duration, poll: Duration) -> WorkerProcess {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.path().join(format!("{name}.log")))
            .expect("worker log");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_sync-worker"))
            .arg("worker")
            .env("DATABASE_URL", self.db.url())
            .env("REDIS_URL", self.redis.url())
            .env("REDIS_KEY_PREFIX", &self.prefix)
            .env("SECRET_KEY", SECRET_KEY)
            .env("WORKER_ID", name)
            .env(
                "OWNERSHIP",
                match self.ownership {
                    Ownership::Accounts => "accounts",
                    Ownership::Buckets => "buckets",
                },
            )
            .env("LEASE_TTL", format!("{}ms", ttl.as_millis()))
            .env("POLL_WARM", format!("{}ms", poll.as_millis()))
            .env("RECONCILE_INTERVAL", "1")
            // RIG_WORKER_LOG sets the workers' RUST_LOG when chasing a failure.
            .env("RUST_LOG", std::env::var("RIG_WORKER_LOG").unwrap_or_else(|_| "info".into()))
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn sync-worker worker");
        WorkerProcess(child)
    }

    /// Stored messages per account, in account order.
    pub async fn counts(&self) -> Vec<i64> {
        let mut out = Vec::new();
        for (a, _) in &self.accounts {
            let n: i64 = sqlx::query("SELECT COUNT(*) FROM messages WHERE account_id = $1")
                .bind(a.as_str())
                .fetch_one(self.storage.pool())
                .await
                .expect("count")
                .get(0);
            out.push(n);
        }
        out
    }

    /// INBOX counts on the server, in account order.
    pub fn server_counts(&self) -> Vec<i64> {
        self.accounts
            .iter()
            .map(|(_, u)| i64::from(self.dovecot.mailbox_status(u, "INBOX").expect("status").messages))
            .collect()
    }

    /// Waits until the stored counts equal the server's; panics after `within`.
    pub async fn wait_synced(&self, within: Duration, what: &str) {
        let started = Instant::now();
        loop {
            let (stored, server) = (self.counts().await, self.server_counts());
            if stored == server {
                return;
            }
            assert!(
                started.elapsed() < within,
                "{what}: not synced within {within:?}: stored {stored:?}, server {server:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Each account whose stored INBOX differs from the server's, UID by
    /// UID and flag by flag (`\Recent` aside: it belongs to a session).
    pub async fn differences_from_server(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (a, user) in &self.accounts {
            let stored: BTreeMap<i64, String> =
                sqlx::query("SELECT uid, flags FROM messages WHERE account_id = $1 AND folder = 'INBOX'")
                    .bind(a.as_str())
                    .fetch_all(self.storage.pool())
                    .await
                    .expect("stored messages")
                    .iter()
                    .map(|r| (r.get(0), flag_set(r.get(1))))
                    .collect();
            let listing = self
                .dovecot
                .doveadm(&["-f", "tab", "fetch", "-u", user, "uid flags", "mailbox", "INBOX", "all"])
                .expect("doveadm fetch");
            let server: BTreeMap<i64, String> = listing
                .lines()
                .skip(1)
                .filter_map(|l| l.split_once('\t'))
                .map(|(uid, flags)| (uid.trim().parse().expect("a UID"), flag_set(flags)))
                .collect();
            if stored != server {
                let missing: Vec<_> = server.keys().filter(|u| !stored.contains_key(u)).collect();
                let extra: Vec<_> = stored.keys().filter(|u| !server.contains_key(u)).collect();
                let flags: Vec<_> = server
                    .iter()
                    .filter(|(u, f)| stored.get(u).is_some_and(|s| s != *f))
                    .map(|(u, f)| format!("{u}: server {f:?}, stored {:?}", stored[u]))
                    .collect();
                out.push(format!("{a} ({user}): missing {missing:?}, not on the server {extra:?}, flags {flags:?}"));
            }
        }
        out
    }

    pub fn append_one_each(&self, seed: u64) {
        for (i, (_, user)) in self.accounts.iter().enumerate() {
            let raw = mail_gen::message(1000 + seed, i as u64).raw;
            self.dovecot.append_many(user, "INBOX", [raw.as_slice()]).expect("append");
        }
    }

    pub fn assert_no_stale_write(&self) {
        let stale = FenceAudit::of(&self.db).stale_writes().expect("read the audit");
        assert!(stale.is_empty(), "rows written under a replaced token:\n{}", stale.join("\n"));
    }
}

/// IMAP flags as one sorted, space-separated string, `\Recent` left out.
fn flag_set(flags: &str) -> String {
    let set: std::collections::BTreeSet<&str> = flags.split_whitespace().filter(|f| *f != "\\Recent").collect();
    set.into_iter().collect::<Vec<_>>().join(" ")
}

/// A worker process, killed when dropped.
pub struct WorkerProcess(pub std::process::Child);

impl WorkerProcess {
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0.id() as i32), signal).expect("signal the worker");
    }
}

impl Drop for Rig {
    /// A failing test shows the end of each worker's log: a CI run keeps
    /// nothing else of them.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let Ok(entries) = std::fs::read_dir(self.logs.path()) else { return };
        let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL)..];
            eprintln!("--- the last {} lines of {} ---\n{}", tail.len(), path.display(), tail.join("\n"));
        }
    }
}

/// Lines of each worker's log a failing test shows.
const LOG_TAIL: usize = 80;

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub async fn until(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let started = Instant::now();
    while !cond() {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
