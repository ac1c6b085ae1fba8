//! One IMAP account as the engine's tests stand it up: a private Dovecot
//! with one user, a fresh database ([`TestDb`]) holding that user's account,
//! and every event storage publishes kept for the test to read.

use std::sync::Arc;

use leasehold_core::{FencingToken, LeaseKey, WorkerId};
use parking_lot::Mutex;

use super::{mail_gen, Dovecot, DovecotOptions, TestDb};
use crate::deadline::LeaseDeadline;
use crate::events::{EventSink, SyncEvent};
use crate::imap::{ImapSettings, ImapSource};
use crate::storage::{AccountAuth, Email, NewAccount, Security, Storage};
use crate::Fence;

/// Every event published to it, in order: a test double of [`EventSink`].
#[derive(Debug, Default)]
pub struct CollectedEvents(Mutex<Vec<SyncEvent>>);

impl CollectedEvents {
    /// The events published so far.
    pub fn all(&self) -> Vec<SyncEvent> {
        self.0.lock().clone()
    }
}

impl EventSink for CollectedEvents {
    fn publish(&self, events: Vec<SyncEvent>) {
        self.0.lock().extend(events);
    }
}

/// A Dovecot with user [`ImapWorld::USER`], and its account stored in a
/// fresh database (see the [module docs](self)).
#[derive(Debug)]
pub struct ImapWorld {
    /// The private IMAP server.
    pub dovecot: Dovecot,
    /// Storage on the test's database, publishing into [`ImapWorld::events`].
    pub storage: Storage,
    /// The account of [`ImapWorld::USER`].
    pub account: LeaseKey,
    /// What storage published.
    pub events: Arc<CollectedEvents>,
    /// The database, dropped with the world.
    pub db: TestDb,
}

impl ImapWorld {
    /// The IMAP user (and `alice@example.org` the account's owner).
    pub const USER: &'static str = "alice";
    /// Its password on the server.
    pub const PASSWORD: &'static str = "secret-pw";

    /// Starts Dovecot with `options` and stores the account with
    /// `password` (not necessarily the server's: a test of a refused login
    /// stores another). Panics with the cause when a part cannot start.
    pub async fn start(db: TestDb, options: &DovecotOptions, password: &str) -> Self {
        Self::start_with_auth(db, options, AccountAuth::Password(password.into())).await
    }

    /// [`ImapWorld::start`], with the account logging in by `auth` (e.g. an
    /// OAuth2 grant of an [`super::OAuthServer`]'s).
    pub async fn start_with_auth(db: TestDb, options: &DovecotOptions, auth: AccountAuth) -> Self {
        let dovecot = Dovecot::start_with(options).unwrap_or_else(|e| panic!("Dovecot: {e}"));
        dovecot.add_user(Self::USER, Self::PASSWORD).unwrap_or_else(|e| panic!("add user: {e}"));
        let events = Arc::new(CollectedEvents::default());
        let storage =
            db.open().await.unwrap_or_else(|e| panic!("open {}: {e:?}", db.url())).with_events(events.clone());
        let email: Email = "alice@example.org".parse().unwrap_or_else(|e| panic!("email: {e}"));
        let user = storage.add_user(&email).await.unwrap_or_else(|e| panic!("add user: {e:?}"));
        let account = storage
            .add_account(&NewAccount {
                user: user.id,
                host: dovecot.host().to_string(),
                port: dovecot.port(),
                security: Security::Plain,
                username: Self::USER.into(),
                auth,
            })
            .await
            .unwrap_or_else(|e| panic!("add account: {e:?}"));
        Self { dovecot, storage, account, events, db }
    }

    /// The engine on this world's storage, with default settings.
    pub fn source(&self) -> ImapSource {
        ImapSource::new(self.storage.clone(), ImapSettings::default())
    }

    /// The fence of an owner `w{token}` holding the account with `token`, no deadline.
    pub fn fence(&self, token: u64) -> Fence {
        Fence {
            account: self.account.clone(),
            worker: WorkerId::new(format!("w{token}")).unwrap_or_else(|e| panic!("worker id: {e}")),
            token: FencingToken(token),
            deadline: LeaseDeadline::unbounded(),
        }
    }

    /// The account's `last_error`, as stored.
    pub async fn last_error(&self) -> Option<String> {
        let account = self.storage.account(self.account.as_str()).await;
        account.unwrap_or_else(|e| panic!("read the account: {e:?}")).expect("the account exists").last_error
    }

    /// Appends `n` generated messages (of `seed`) to `folder` on the server.
    pub fn append(&self, folder: &str, n: u64, seed: u64) {
        let msgs: Vec<Vec<u8>> = (0..n).map(|i| mail_gen::message(seed, i).raw).collect();
        self.dovecot
            .append_many(Self::USER, folder, msgs.iter().map(|m| m.as_slice()))
            .unwrap_or_else(|e| panic!("append to {folder}: {e}"));
    }
}
