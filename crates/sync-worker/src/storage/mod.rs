//! The SQL storage: users, accounts, folders and messages.
//!
//! One code path for both databases, through sqlx's `Any` driver: a SQLite
//! file by default (WAL journal, sqlx's default for SQLite), or Postgres when
//! `DATABASE_URL` is `postgres://...`. The schema (`migrations/`, embedded)
//! uses only types both share (TEXT and BIGINT), and every query only SQL both
//! accept (`$n` parameters, `ON CONFLICT`), so behaviour is the same on both;
//! the tests run every case on each.
//!
//! **Fencing.** Every write of an owned account goes through
//! [`Storage::write`], which opens a transaction whose *first* statement
//! checks and advances the account's stored fencing token:
//! `UPDATE accounts SET fence_token = $t WHERE id = $a AND fence_token <= $t`.
//! A token older than the stored one matches no row: the transaction is
//! dropped before anything else runs and the caller gets
//! [`StorageError::Fenced`]. Because the check is an `UPDATE` of the account
//! row, it also takes that row's write lock (Postgres) or the database's
//! (SQLite) for the whole transaction, so a newer owner cannot slip in
//! between the check and the commit. A new owner's token takes effect even
//! earlier, at claim time, before it syncs anything: see [`fence`].

mod accounts;
mod accounts_unique;
mod buckets;
mod connection;
mod deployment;
pub mod fence;
mod folders;
mod logins;
mod mail;
mod message_views;
mod partitions;
mod search;
mod sessions;
mod views;
mod webhooks;

use std::str::FromStr;
use std::time::Duration;

use leasehold_core::backend_url::redact_url;
use leasehold_core::{FencingToken, LeaseKey};
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::AnyPool;

pub use accounts::{
    AccountAuth, AccountSummary, Credentials, Email, FolderCount, LoginChange, NewAccount, Security, UserRecord,
};
pub use connection::ConnectionSettings;
pub use fence::SyncState;
pub use logins::LoginFailures;
pub use mail::{FencedTx, FolderState, MessageRow};
pub use partitions::{MessagesLayout, PartitionError};
pub use search::{search_terms, SearchCursor, MAX_TERMS};
pub use sessions::SessionRecord;
pub use views::{FolderInfo, MessageDetail, MessageKey, MessageSummary};
pub use webhooks::{AttemptOutcome, DeliveryJob, DeliveryRecord, DeliveryState, WebhookRecord};

use crate::events::EventSink;
use crate::secret::{SecretError, SecretKey};

/// Which database a [`Storage`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    /// A SQLite file.
    Sqlite,
    /// A Postgres server.
    Postgres,
}

/// A storage failure, saying what failed and for which key.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// `DATABASE_URL` names no database this build supports.
    #[error("DATABASE_URL={url:?} is invalid: expected sqlite://PATH or postgres://USER@HOST:PORT/DB")]
    BadUrl {
        /// The URL (password removed).
        url: String,
    },
    /// The SQLite file could not be opened or made.
    #[error("could not open the SQLite database {path}: check that its directory exists and is writable")]
    OpenFile {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The SQLite database could not be opened (a file that is not a
    /// database, or one this process may not read or lock).
    #[error("could not open the SQLite database {url}: check that the file is a sync-worker database and is readable and writable")]
    OpenSqlite {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: sqlx::Error,
    },
    /// The database could not be opened or reached.
    #[error("could not open the database {url}: check DATABASE_URL and that the server is up")]
    Open {
        /// The URL (password removed).
        url: String,
        /// Why.
        #[source]
        source: sqlx::Error,
    },
    /// The embedded migrations failed.
    #[error("database {url}: migrations failed")]
    Migrate {
        /// The URL (password removed).
        url: String,
        /// Why.
        #[source]
        source: sqlx::migrate::MigrateError,
    },
    /// A query failed.
    #[error("storage: {op} failed")]
    Query {
        /// What was being done (`insert messages of acct/INBOX`, ...).
        op: String,
        /// Why.
        #[source]
        source: sqlx::Error,
    },
    /// A task writing an account's new mail ended before it could commit
    /// (the runtime shut down under it): nothing of its batch is stored.
    #[error("account {account}: the writer of new mail in {folder} stopped before it committed")]
    WriterStopped {
        /// The account.
        account: String,
        /// The folder it was writing.
        folder: String,
    },
    /// Something that must exist does not.
    #[error("{what} {key} does not exist")]
    NotFound {
        /// `user`, `account`, ...
        what: &'static str,
        /// Its key.
        key: String,
    },
    /// Something that must be unique already exists.
    #[error("{what} already exists")]
    Duplicate {
        /// What (`user a@b`, `account u@host:993`).
        what: String,
    },
    /// A write carried a fencing token older than the stored one.
    #[error("account {account}: write with fencing token {token} rejected: storage holds token {current}")]
    Fenced {
        /// The account.
        account: LeaseKey,
        /// The token the write carried.
        token: FencingToken,
        /// The stored token.
        current: FencingToken,
    },
    /// A write began or was about to commit after its lease's deadline:
    /// it was rolled back (nothing of it is stored).
    #[error("account {account}: the lease (fencing token {token}) ran out before the write could commit; rolled back")]
    LeaseExpired {
        /// The account.
        account: LeaseKey,
        /// The lease's token.
        token: FencingToken,
    },
    /// A stored password does not decrypt.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// A stored value is not what the schema allows.
    #[error("account {account}: stored {field} is invalid: {value:?}")]
    Corrupt {
        /// The account.
        account: String,
        /// The column.
        field: &'static str,
        /// Its value.
        value: String,
    },
}

pub(crate) fn query_err(op: impl Into<String>) -> impl FnOnce(sqlx::Error) -> StorageError {
    let op = op.into();
    move |source| StorageError::Query { op, source }
}

/// A stored `field` of `account` whose `value` the schema does not allow.
pub(crate) fn corrupt(account: &str, field: &'static str, value: impl ToString) -> StorageError {
    StorageError::Corrupt { account: account.into(), field, value: value.to_string() }
}

/// The SQL storage. Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct Storage {
    pool: AnyPool,
    kind: DbKind,
    secret: SecretKey,
    /// Where committed writes announce their messages (the API's event bus).
    events: Option<std::sync::Arc<dyn EventSink>>,
    /// How many lease buckets accounts hash into (read at open).
    buckets: leasehold_core::BucketCount,
}

/// The database used when `DATABASE_URL` is unset: a SQLite file in the
/// working directory, created when missing.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://sync-worker.db?mode=rwc";

/// Turns off SQLite's memory statistics, once per process, before its first
/// connection. They are on by default and take one process-wide mutex on
/// every allocation: with a pool of connections on their own threads and
/// rows freed on others, that mutex was the API's busiest lock (perf on the
/// message list: over a quarter of the server's CPU in futex wait and wake).
/// Nothing here reads the statistics.
fn sqlite_without_memory_statistics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `sqlite3_config` with `SQLITE_CONFIG_MEMSTATUS` takes one
        // int. It may only be called before SQLite initialises; this runs
        // before this process's first connection, and if something else
        // initialised SQLite first it returns SQLITE_MISUSE and changes nothing.
        let rc = unsafe { libsqlite3_sys::sqlite3_config(libsqlite3_sys::SQLITE_CONFIG_MEMSTATUS, 0i32) };
        if rc != libsqlite3_sys::SQLITE_OK {
            tracing::debug!(rc, "SQLite was initialised already: its memory statistics stay on");
        }
    });
}

impl Storage {
    /// Opens the database at `url` (`sqlite://PATH[?mode=rwc]` or
    /// `postgres://...`) and runs the embedded migrations. `secret`
    /// encrypts and decrypts the IMAP passwords.
    pub async fn open(url: &str, secret: SecretKey) -> Result<Self, StorageError> {
        Self::open_with(url, secret, &ConnectionSettings::default()).await
    }

    /// [`Storage::open`], with every Postgres connection set up as
    /// `connection` says (a worker's name and transaction timeouts).
    pub async fn open_with(
        url: &str,
        secret: SecretKey,
        connection: &ConnectionSettings,
    ) -> Result<Self, StorageError> {
        sqlx::any::install_default_drivers();
        let pg_settings = std::sync::Arc::new(connection.postgres_settings());
        let shown = redact_url(url);
        let kind = if url.starts_with("sqlite:") {
            DbKind::Sqlite
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            DbKind::Postgres
        } else {
            return Err(StorageError::BadUrl { url: shown });
        };
        if kind == DbKind::Sqlite {
            sqlite_without_memory_statistics();
            if let Some(path) = sqlite_path(url) {
                private_file(path)?;
            }
        }
        let options =
            AnyConnectOptions::from_str(url).map_err(|source| StorageError::Open { url: shown.clone(), source })?;
        let pool = AnyPoolOptions::new()
            .after_connect(move |conn, _| {
                let pg_settings = pg_settings.clone();
                Box::pin(async move {
                    if kind == DbKind::Postgres {
                        for (name, value) in pg_settings.iter() {
                            sqlx::query("SELECT set_config($1, $2, false)")
                                .bind(*name)
                                .bind(value.as_str())
                                .execute(&mut *conn)
                                .await?;
                        }
                    }
                    if kind == DbKind::Sqlite {
                        // Readers (the API) do not wait for the writer (the
                        // engine), nor it for them. sqlx 0.9 leaves the
                        // journal mode alone unless asked; it is kept in the file.
                        sqlx::query("PRAGMA journal_mode = WAL").execute(&mut *conn).await?;
                        // Pages read through a shared mapping, not a pread
                        // into each connection's own 2 MB cache: a list page
                        // touches more than that (perf: a tenth of its time).
                        sqlx::query("PRAGMA mmap_size = 268435456").execute(conn).await?;
                    }
                    Ok(())
                })
            })
            .max_connections(if kind == DbKind::Sqlite { 4 } else { 16 })
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .map_err(|source| match kind {
                DbKind::Sqlite => StorageError::OpenSqlite { url: shown.clone(), source },
                DbKind::Postgres => StorageError::Open { url: shown.clone(), source },
            })?;
        sqlx::migrate!("./migrations")
            .run(&pool)
            .await
            .map_err(|source| StorageError::Migrate { url: shown, source })?;
        let mut storage = Self { pool, kind, secret, events: None, buckets: leasehold_core::BucketCount::DEFAULT };
        storage.ensure_search_index().await?;
        storage.ensure_per_user_accounts().await?;
        storage.ensure_account_buckets().await?;
        Ok(storage)
    }

    /// This storage, announcing every committed message write and poll outcome to `events`
    /// (see [`crate::events`]).
    pub fn with_events(mut self, events: std::sync::Arc<dyn EventSink>) -> Self {
        self.events = Some(events);
        self
    }

    /// Which database this is.
    pub fn kind(&self) -> DbKind {
        self.kind
    }

    /// The pool, for tests that check rows directly.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Closes the pool (waits for connections in use).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// The file of a `sqlite://PATH[?...]` URL; `None` for an in-memory one.
fn sqlite_path(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or_default();
    (!path.is_empty() && path != ":memory:" && !rest.contains("mode=memory")).then_some(path)
}

/// Makes `path` if it is missing, readable and writable by this user only:
/// SQLite gives its WAL and shared-memory files the database file's mode,
/// so the mail and the encrypted passwords are never readable by others.
/// A URL without `?mode=rwc` then opens the new file too.
fn private_file(path: &str) -> Result<(), StorageError> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let made = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path);
    match made {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if let Ok(meta) = std::fs::metadata(path) {
                if meta.permissions().mode() & 0o077 != 0 {
                    tracing::warn!(
                        path,
                        mode = format!("{:o}", meta.permissions().mode() & 0o777),
                        "the SQLite database is readable by other users: chmod 600 it (and its -wal and -shm files)"
                    );
                }
            }
            Ok(())
        }
        Err(source) => Err(StorageError::OpenFile { path: path.to_string(), source }),
    }
}

/// Milliseconds since the epoch, now.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod sqlite_file_tests {
    use super::*;

    #[test]
    fn the_file_of_a_sqlite_url() {
        assert_eq!(sqlite_path("sqlite://data/x.db?mode=rwc"), Some("data/x.db"));
        assert_eq!(sqlite_path("sqlite:///abs/x.db"), Some("/abs/x.db"));
        assert_eq!(sqlite_path("sqlite:x.db"), Some("x.db"));
        assert_eq!(sqlite_path("sqlite::memory:"), None);
        assert_eq!(sqlite_path("sqlite://x.db?mode=memory"), None);
        assert_eq!(sqlite_path("postgres://h/db"), None);
    }

    #[tokio::test]
    async fn a_new_database_and_its_wal_are_private_and_open_without_mode_rwc() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.db");
        let url = format!("sqlite://{}", path.display());
        let storage = Storage::open(&url, crate::secret::SecretKey::generate()).await.expect("open without ?mode=rwc");
        let email: Email = "a@example.org".parse().unwrap();
        storage.add_user(&email).await.unwrap();
        let journal: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(storage.pool()).await.unwrap();
        assert_eq!(journal, "wal");
        for name in ["new.db", "new.db-wal", "new.db-shm"] {
            let mode = std::fs::metadata(dir.path().join(name)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{name}: {mode:o}");
        }
        storage.close().await;
        let missing = format!("sqlite://{}/no/such/dir/x.db", dir.path().display());
        let err = Storage::open(&missing, crate::secret::SecretKey::generate()).await.unwrap_err();
        let text = crate::errors::error_chain(&err);
        assert!(text.contains("directory exists") && !text.contains("server is up"), "{text}");
        // A file that is not a database.
        let junk = dir.path().join("junk.db");
        std::fs::write(&junk, vec![b'x'; 4096]).unwrap();
        let err = Storage::open(&format!("sqlite://{}", junk.display()), crate::secret::SecretKey::generate())
            .await
            .unwrap_err();
        let text = crate::errors::error_chain(&err);
        assert!(!text.contains("server is up"), "{text}");
    }
}
