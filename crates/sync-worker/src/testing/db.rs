//! One database of a test's own, SQLite or Postgres, and
//! [`both_databases!`](crate::both_databases), which runs a case on each.
//!
//! Every storage test, API test and storage benchmark gets its database
//! here, so "a fresh SQLite file or a fresh Postgres database" is written
//! once: a SQLite file in a temp dir of its own, or a fresh, uniquely named
//! database on the Postgres server ([`Postgres`]); either is removed when
//! the [`TestDb`] is dropped.

use super::{Postgres, Result};
use crate::secret::SecretKey;
use crate::storage::{DbKind, Storage, StorageError};

/// The name of a SQLite test database's file in its temp dir.
const SQLITE_FILE: &str = "sync.db";

/// What keeps the database alive (and removes it on drop).
#[derive(Debug)]
enum Keep {
    Sqlite(tempfile::TempDir),
    Postgres(Postgres),
}

/// How many partitions [`TestDb::postgres_partitioned`] makes.
pub const TEST_PARTITIONS: u16 = 4;

/// A database of one test's own, removed when this is dropped.
#[derive(Debug)]
pub struct TestDb {
    kind: DbKind,
    tag: String,
    url: String,
    _keep: Keep,
}

impl TestDb {
    /// A fresh database of `kind` for the test named `tag`.
    pub fn fresh(kind: DbKind, tag: &str) -> Result<Self> {
        match kind {
            DbKind::Sqlite => Self::sqlite(tag),
            DbKind::Postgres => Self::postgres(tag),
        }
    }

    /// A SQLite file in a temp dir of its own.
    pub fn sqlite(tag: &str) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("sync-worker-db-")
            .tempdir()
            .map_err(super::HarnessError::io("make a temp dir for a SQLite test database"))?;
        let url = format!("sqlite://{}?mode=rwc", dir.path().join(SQLITE_FILE).display());
        Ok(Self { kind: DbKind::Sqlite, tag: tag.to_owned(), url, _keep: Keep::Sqlite(dir) })
    }

    /// A fresh database on the tests' Postgres server ([`Postgres::server_url`]).
    pub fn postgres(tag: &str) -> Result<Self> {
        Self::postgres_on(&Postgres::server_url(), tag)
    }

    /// A fresh Postgres database, migrated, whose `messages` is
    /// hash-partitioned by account into [`TEST_PARTITIONS`] partitions (as
    /// `PG_MESSAGE_PARTITIONS` makes it), for the suite to run on the
    /// partitioned schema: every later opener, in this process or another,
    /// finds it so.
    pub fn postgres_partitioned(tag: &str) -> Result<Self> {
        let db = Self::postgres(tag)?;
        let url = db.url.clone();
        let partitioned = std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let storage =
                    Storage::open(&url, SecretKey::generate()).await.map_err(|e| crate::errors::error_chain(&e))?;
                let partitions = std::num::NonZeroU16::new(TEST_PARTITIONS).ok_or("no partitions")?;
                storage.partition_messages(partitions).await.map_err(|e| crate::errors::error_chain(&e))?;
                storage.close().await;
                Ok::<_, String>(())
            })
        })
        .join()
        .map_err(|_| super::HarnessError::Invalid("partitioning a test database panicked".into()))?;
        partitioned.map_err(|e| super::HarnessError::Unexpected {
            what: format!("partition messages of test database {tag}"),
            answer: e,
        })?;
        Ok(db)
    }

    /// A fresh database on the Postgres server at `server_url` (any database
    /// URL of that server).
    pub fn postgres_on(server_url: &str, tag: &str) -> Result<Self> {
        let pg = Postgres::fresh_on(server_url, tag)?;
        Ok(Self { kind: DbKind::Postgres, tag: tag.to_owned(), url: pg.url().to_owned(), _keep: Keep::Postgres(pg) })
    }

    /// Which database this is.
    pub fn kind(&self) -> DbKind {
        self.kind
    }

    /// The name it was made for (the test's), e.g. to name a worker after.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The SQLite file, for tests that read its bytes (`None` on Postgres).
    pub fn sqlite_file(&self) -> Option<std::path::PathBuf> {
        match &self._keep {
            Keep::Sqlite(dir) => Some(dir.path().join(SQLITE_FILE)),
            Keep::Postgres(_) => None,
        }
    }

    /// The Postgres database itself (for triggers and `psql`), `None` on SQLite.
    pub fn postgres_db(&self) -> Option<&Postgres> {
        match &self._keep {
            Keep::Postgres(db) => Some(db),
            Keep::Sqlite(_) => None,
        }
    }

    /// Its URL, as `DATABASE_URL` takes it.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Opens it (running the migrations), with a fresh password key.
    pub async fn open(&self) -> Result<Storage, StorageError> {
        Storage::open(&self.url, SecretKey::generate()).await
    }
}

/// Runs each named case once on SQLite, once on Postgres and once on
/// Postgres with `messages` hash-partitioned ([`TestDb::postgres_partitioned`]):
/// it expands to `mod sqlite`, `mod postgres` and `mod postgres_partitioned`,
/// each with one test per case that calls the case (`super::name`) with a
/// fresh [`TestDb`] of that kind, tagged with the case's name. `async:` cases run on a two-thread tokio runtime,
/// `sync:` cases are plain tests.
///
/// ```no_run
/// use sync_worker::testing::TestDb;
///
/// sync_worker::both_databases!(async: a_case);
///
/// async fn a_case(db: TestDb) {
///     let storage = db.open().await.expect("storage");
///     assert!(storage.list_accounts().await.expect("accounts").is_empty());
/// }
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! both_databases {
    (async: $($name:ident),+ $(,)?) => {
        $crate::both_databases!(@each async sqlite Sqlite $($name),+);
        $crate::both_databases!(@each async postgres Postgres $($name),+);
        $crate::both_databases!(@each async postgres_partitioned PostgresPartitioned $($name),+);
    };
    (sync: $($name:ident),+ $(,)?) => {
        $crate::both_databases!(@each sync sqlite Sqlite $($name),+);
        $crate::both_databases!(@each sync postgres Postgres $($name),+);
        $crate::both_databases!(@each sync postgres_partitioned PostgresPartitioned $($name),+);
    };
    (@each async $module:ident $kind:ident $($name:ident),+) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::both_databases!(@db $kind $name)).await;
                }
            )+
        }
    };
    (@each sync $module:ident $kind:ident $($name:ident),+) => {
        mod $module {
            $(
                #[test]
                fn $name() {
                    super::$name($crate::both_databases!(@db $kind $name));
                }
            )+
        }
    };
    (@db PostgresPartitioned $name:ident) => {
        $crate::testing::TestDb::postgres_partitioned(stringify!($name))
            .unwrap_or_else(|e| panic!("a partitioned Postgres test database: {e}"))
    };
    (@db $kind:ident $name:ident) => {
        $crate::testing::TestDb::fresh($crate::storage::DbKind::$kind, stringify!($name))
            .unwrap_or_else(|e| panic!("a {} test database: {e}", stringify!($kind)))
    };
}
