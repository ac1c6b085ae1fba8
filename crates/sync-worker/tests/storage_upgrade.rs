//! A database made before accounts were unique per user: its global
//! `UNIQUE (host, port, username)` goes at open, nothing else does (on
//! SQLite the table is rebuilt, and no folder or message row may cascade
//! away), and two users may then hold the same mailbox.

use sqlx::Row;
use sync_worker::secret::SecretKey;
use sync_worker::storage::{AccountAuth, Email, NewAccount, Security, Storage, StorageError};
use sync_worker::testing::{TestDb, TEST_SECRET_KEY};

fn account(user: &sync_worker::storage::UserRecord) -> NewAccount {
    NewAccount {
        user: user.id.clone(),
        host: "127.0.0.1".into(),
        port: 143,
        security: Security::Plain,
        username: "alice".into(),
        auth: AccountAuth::Password("pw".into()),
    }
}

async fn schema(storage: &Storage) -> String {
    sqlx::query("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'accounts'")
        .fetch_one(storage.pool())
        .await
        .unwrap()
        .get(0)
}

/// Puts the old global constraint back, as a database of the first schema has it.
async fn make_old(storage: &Storage) {
    let sql = schema(storage).await;
    let end = sql.rfind(')').unwrap();
    let old = format!("{}, UNIQUE (host, port, username))", &sql[..end]).replacen(
        "CREATE TABLE \"accounts\"",
        "CREATE TABLE accounts_old",
        1,
    );
    let mut conn = storage.pool().acquire().await.unwrap();
    sqlx::query("PRAGMA foreign_keys = OFF").execute(&mut *conn).await.unwrap();
    for step in [old.as_str(), "INSERT INTO accounts_old SELECT * FROM accounts", "DROP TABLE accounts"] {
        sqlx::query(sqlx::AssertSqlSafe(step.to_string())).execute(&mut *conn).await.unwrap();
    }
    sqlx::query("ALTER TABLE accounts_old RENAME TO accounts").execute(&mut *conn).await.unwrap();
    sqlx::query("PRAGMA foreign_keys = ON").execute(&mut *conn).await.unwrap();
}

#[tokio::test]
async fn an_old_sqlite_database_loses_the_global_constraint_and_keeps_every_row() {
    let db = TestDb::sqlite("upgrade").unwrap();
    let key = || SecretKey::from_base64(TEST_SECRET_KEY, "SECRET_KEY").unwrap();
    let storage = Storage::open(db.url(), key()).await.unwrap();
    let ann = storage.add_user(&"ann@example.org".parse::<Email>().unwrap()).await.unwrap();
    let bob = storage.add_user(&"bob@example.org".parse::<Email>().unwrap()).await.unwrap();
    let id = storage.add_account(&account(&ann)).await.unwrap();
    for folder in ["INBOX", "Sent", "Projekte/Ärger"] {
        sqlx::query("INSERT INTO folders (account_id, name, last_uid) VALUES ($1, $2, 0)")
            .bind(id.as_str())
            .bind(folder)
            .execute(storage.pool())
            .await
            .unwrap();
    }
    make_old(&storage).await;
    assert!(schema(&storage).await.contains("UNIQUE (host, port, username)"));
    // The old rule: bob cannot add the mailbox ann has.
    assert!(matches!(storage.add_account(&account(&bob)).await, Err(StorageError::Duplicate { .. })));
    storage.close().await;

    let storage = Storage::open(db.url(), key()).await.unwrap();
    assert!(!schema(&storage).await.contains("UNIQUE (host, port, username)"), "{}", schema(&storage).await);
    let folders: i64 = sqlx::query("SELECT COUNT(*) FROM folders WHERE account_id = $1")
        .bind(id.as_str())
        .fetch_one(storage.pool())
        .await
        .unwrap()
        .get(0);
    assert_eq!(folders, 3, "the rebuild cascaded folder rows away");
    let creds = storage.credentials(&id).await.expect("the account stays");
    assert_eq!(creds.auth, AccountAuth::Password("pw".into()), "and its sealed password");
    storage.add_account(&account(&bob)).await.expect("bob may hold the same mailbox now");
    let mut again = account(&ann);
    again.host = "127.0.0.1".to_uppercase();
    again.username = "ALICE".into();
    assert!(matches!(storage.add_account(&again).await, Err(StorageError::Duplicate { .. })), "ann's own twice");
    storage.close().await;
    // A third open changes nothing.
    let storage = Storage::open(db.url(), key()).await.unwrap();
    assert_eq!(storage.list_accounts().await.unwrap().len(), 2);
}

sync_worker::both_databases!(async: the_per_user_index_holds_under_a_race);

/// An API and a worker process started together on a new Postgres database
/// both make the per-user index; neither fails (Postgres's `IF NOT EXISTS`
/// does not hold under that race: one of them once exited). Scale-out runs
/// on Postgres; on SQLite (one `serve`) sqlx's migrations themselves are
/// not safe for two first opens at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_opening_a_new_database_at_once_all_start() {
    let db = TestDb::postgres("open_at_once").unwrap();
    let opens: Vec<_> = (0..8)
        .map(|_| {
            let url = db.url().to_owned();
            tokio::spawn(async move {
                let key = SecretKey::from_base64(TEST_SECRET_KEY, "SECRET_KEY").unwrap();
                Storage::open(&url, key).await.map(drop)
            })
        })
        .collect();
    for open in opens {
        open.await.unwrap().unwrap_or_else(|e| panic!("{}", sync_worker::errors::error_chain(&e)));
    }
}

/// Two adds of one mailbox for one user at once: the index, not only the
/// check before the insert, keeps it to one.
async fn the_per_user_index_holds_under_a_race(db: TestDb) {
    let storage = db.open().await.unwrap();
    let ann = storage.add_user(&"ann@example.org".parse::<Email>().unwrap()).await.unwrap();
    let adds: Vec<_> = (0..8)
        .map(|i| {
            let (storage, mut new) = (storage.clone(), account(&ann));
            new.username = if i % 2 == 0 { "alice".into() } else { "Alice".into() };
            tokio::spawn(async move { storage.add_account(&new).await })
        })
        .collect();
    let mut added = 0;
    for a in adds {
        match a.await.unwrap() {
            Ok(_) => added += 1,
            Err(StorageError::Duplicate { .. }) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(added, 1);
}
