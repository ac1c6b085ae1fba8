//! The first-run demo (`cargo xtask demo`): a private Dovecot with a demo
//! mailbox of realistic mail in several folders, new mail every so often,
//! and `serve` (API, console and a worker, memory backend and SQLite) with
//! a demo login that already has the mailbox's account.

use std::net::SocketAddr;
use std::time::Duration;

use leasehold_core::bus::AbortOnDrop;
use leasehold_core::WorkerId;

use std::sync::Arc;

use super::{mail_gen, Dovecot, HarnessError};
use crate::api::errors::ApiError;
use crate::api::ApiSettings;
use crate::app::serve::{self, Parts, Running, StartError};
use crate::app::wiring;
use crate::config::Config;
use crate::secret::SecretKey;
use crate::storage::{AccountAuth, Email, NewAccount, Security, Storage, StorageError};

/// Why the demo could not start.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The private Dovecot or its mail.
    #[error("could not start the demo's Dovecot or fill its mailbox")]
    Dovecot(#[from] HarnessError),
    /// The demo's database.
    #[error("the demo's database: could not {what}")]
    Storage {
        /// What was being done.
        what: &'static str,
        /// Why.
        #[source]
        source: StorageError,
    },
    /// Hashing the demo login's password.
    #[error("could not hash the demo password")]
    Hash(#[source] ApiError),
    /// `serve` itself.
    #[error("could not start serve")]
    Serve(#[source] StartError),
    /// The demo's directory.
    #[error("could not make the demo's directory")]
    Dir(#[source] std::io::Error),
    /// The task that fills the mailbox.
    #[error("the task that fills the demo mailbox failed")]
    Task(#[source] tokio::task::JoinError),
}

/// The console login of the demo.
pub const DEMO_EMAIL: &str = "demo@example.org";
/// Its password.
pub const DEMO_PASSWORD: &str = "demo-password";
/// The demo mailbox's IMAP login (on the private Dovecot).
const IMAP_USER: &str = "demo";
const IMAP_PASSWORD: &str = "demo-imap-password";
/// The generator's seed: the same mail on every run.
const SEED: u64 = 2026;

/// What the demo looks like.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Where the console listens.
    pub listen: SocketAddr,
    /// Messages in the INBOX at the start (the other folders get a quarter each).
    pub inbox_messages: u64,
    /// A new message arrives this often.
    pub new_mail_every: Duration,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            inbox_messages: 200,
            new_mail_every: Duration::from_secs(20),
        }
    }
}

/// A running demo; dropping it stops everything and removes its files.
pub struct Demo {
    running: Option<Running>,
    _feeder: AbortOnDrop,
    _dovecot: Arc<Dovecot>,
    _dir: tempfile::TempDir,
    url: String,
}

impl std::fmt::Debug for Demo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Demo").field("url", &self.url).finish_non_exhaustive()
    }
}

impl Demo {
    /// Starts it: Dovecot and its mail, the database with the demo login and
    /// account, `serve`, and the new-mail feeder.
    pub async fn start(options: DemoOptions) -> Result<Self, DemoError> {
        let dovecot = Arc::new(
            tokio::task::spawn_blocking(move || fill(options.inbox_messages)).await.map_err(DemoError::Task)??,
        );
        let dir = tempfile::tempdir().map_err(DemoError::Dir)?;
        let url = format!("sqlite://{}", dir.path().join("demo.db").display());
        let storage = Storage::open(&url, SecretKey::generate()).await.map_err(db_error("open it"))?;
        let email: Email = DEMO_EMAIL.parse().expect("DEMO_EMAIL is an e-mail address");
        let user = storage.add_user(&email).await.map_err(db_error("add the demo user"))?;
        let hash = crate::api::auth::hash_password(DEMO_PASSWORD.to_string()).await.map_err(DemoError::Hash)?;
        storage.set_password_hash(&user.id, &hash).await.map_err(db_error("set the demo password"))?;
        let account = NewAccount {
            user: user.id,
            host: dovecot.host().to_string(),
            port: dovecot.port(),
            security: Security::Plain,
            username: IMAP_USER.to_string(),
            auth: AccountAuth::Password(IMAP_PASSWORD.to_string()),
        };
        storage.add_account(&account).await.map_err(db_error("add the demo account"))?;
        // Its Dovecot is on loopback, which accounts added through the API may not use.
        let config = Config { imap_allow_private: true, ..Config::default() };
        let mut settings = ApiSettings::new(&config);
        settings.listen = options.listen;
        let parts = Parts { storage, backend: wiring::in_process(), config, settings };
        let worker = WorkerId::new("demo-worker").expect("a valid worker id");
        let running = serve::start(parts, Some(worker)).await.map_err(DemoError::Serve)?;
        let url = format!("http://{}/", running.addr());
        let feeder = AbortOnDrop(tokio::spawn(feed(dovecot.clone(), options.new_mail_every)));
        Ok(Self { running: Some(running), _feeder: feeder, _dovecot: dovecot, _dir: dir, url })
    }

    /// The console's address.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Until serve ends by itself (an error).
    pub async fn finished(&mut self) -> anyhow::Result<()> {
        match self.running.as_mut() {
            Some(r) => r.finished().await,
            None => Ok(()),
        }
    }

    /// Stops serve (releasing its leases).
    pub async fn stop(mut self) -> anyhow::Result<()> {
        match self.running.take() {
            Some(r) => r.shutdown().await,
            None => Ok(()),
        }
    }
}

fn db_error(what: &'static str) -> impl Fn(StorageError) -> DemoError {
    move |source| DemoError::Storage { what, source }
}

/// A Dovecot with the demo mailbox: `inbox` messages in INBOX, a quarter as
/// many in each of a few more folders (one with a non-ASCII name).
fn fill(inbox: u64) -> Result<Dovecot, HarnessError> {
    let dovecot = Dovecot::start()?;
    dovecot.add_user(IMAP_USER, IMAP_PASSWORD)?;
    let folders = ["Archive", "Projects", "Projects/Ärger"];
    dovecot.create_folders(IMAP_USER, &folders)?;
    let mut next = 0u64;
    for (folder, n) in std::iter::once(("INBOX", inbox)).chain(folders.iter().map(|f| (*f, inbox / 4))) {
        let raws: Vec<Vec<u8>> = (next..next + n).map(|i| mail_gen::message(SEED, i).raw).collect();
        next += n;
        // On the wire, a folder name is modified UTF-7 (`Projects/&AMQ-rger`).
        let wire = crate::imap::encode_modified_utf7(folder);
        dovecot.append_many(IMAP_USER, &wire, raws.iter().map(Vec::as_slice))?;
    }
    Ok(dovecot)
}

/// Appends one new message to INBOX every `every`.
async fn feed(dovecot: Arc<Dovecot>, every: Duration) {
    let mut index = 1_000_000u64;
    loop {
        tokio::time::sleep(every).await;
        let raw = mail_gen::message(SEED, index).raw;
        index += 1;
        let d = dovecot.clone();
        match tokio::task::spawn_blocking(move || d.append(IMAP_USER, "INBOX", &raw)).await {
            Ok(Ok(_)) => tracing::info!("demo: a new message arrived in INBOX"),
            Ok(Err(e)) => tracing::warn!(error = %e, "demo: could not append a new message"),
            Err(e) => tracing::warn!(error = %e, "demo: the append task failed"),
        }
    }
}
