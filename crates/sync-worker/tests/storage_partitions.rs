//! `PG_MESSAGE_PARTITIONS`: `messages` hash-partitioned by account on
//! Postgres. The conversion keeps every row, key, index and the foreign key
//! of `message_views`; it is done once (a second call, or a second process,
//! finds it done); another count, SQLite or a bad value is refused with a
//! clear error and changes nothing. (The whole storage suite also runs on a
//! partitioned schema: the `postgres_partitioned` modules of
//! `both_databases!`.)

use std::num::NonZeroU16;

use leasehold_core::{FencingToken, LeaseKey, WorkerId};
use sync_worker::deadline::LeaseDeadline;
use sync_worker::secret::SecretKey;
use sync_worker::storage::{
    search_terms, AccountAuth, Email, MessageRow, MessagesLayout, NewAccount, PartitionError, Security, Storage,
};
use sync_worker::testing::{sync_worker_command, TestDb, TEST_SECRET_KEY};
use sync_worker::Fence;

fn n(count: u16) -> NonZeroU16 {
    NonZeroU16::new(count).expect("non-zero")
}

async fn account(storage: &Storage, name: &str) -> LeaseKey {
    let user = storage.add_user(&format!("{name}@example.org").parse::<Email>().unwrap()).await.expect("user");
    storage
        .add_account(&NewAccount {
            user: user.id,
            host: "127.0.0.1".into(),
            port: 1,
            security: Security::Plain,
            username: name.into(),
            auth: AccountAuth::Password("secret-pw".into()),
        })
        .await
        .expect("account")
}

async fn store_mail(storage: &Storage, account: &LeaseKey, count: u32) {
    let fence = Fence {
        account: account.clone(),
        worker: WorkerId::new("w").unwrap(),
        token: FencingToken(1),
        deadline: LeaseDeadline::unbounded(),
    };
    let mut tx = storage.write(&fence).await.expect("write");
    tx.ensure_folder("INBOX", None).await.expect("folder");
    tx.reset_folder("INBOX", 1).await.expect("uidvalidity");
    let rows: Vec<MessageRow> = (1..=count)
        .map(|uid| MessageRow {
            uid,
            flags: String::new(),
            subject: Some(format!("{account} quarterly report {uid}")),
            ..MessageRow::default()
        })
        .collect();
    tx.insert_messages("INBOX", 1, &rows).await.expect("insert");
    tx.commit().await.expect("commit");
}

async fn count(storage: &Storage, sql: &str) -> i64 {
    use sqlx::Row;
    sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_one(storage.pool()).await.expect(sql).get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioning_keeps_every_row_key_and_index_and_is_done_once() {
    let db = TestDb::postgres("partition_messages").expect("a Postgres test database");
    let storage = db.open().await.expect("open");
    assert_eq!(storage.messages_layout().await.unwrap(), MessagesLayout::Table);
    let accounts = [account(&storage, "ann").await, account(&storage, "bob").await, account(&storage, "cyd").await];
    for (i, a) in accounts.iter().enumerate() {
        store_mail(&storage, a, 40 + i as u32).await;
    }
    let indexes_before = count(&storage, "SELECT COUNT(*) FROM pg_indexes WHERE tablename = 'messages'").await;

    assert_eq!(storage.partition_messages(n(8)).await.unwrap(), MessagesLayout::Partitioned(8));
    assert_eq!(storage.messages_layout().await.unwrap(), MessagesLayout::Partitioned(8));
    assert_eq!(count(&storage, "SELECT COUNT(*) FROM messages").await, 40 + 41 + 42);
    assert_eq!(
        count(&storage, "SELECT COUNT(*) FROM pg_indexes WHERE tablename = 'messages'").await,
        indexes_before,
        "every index of messages, by its own name"
    );
    // Each account's mail is in one partition.
    for a in &accounts {
        let sql = format!("SELECT COUNT(DISTINCT tableoid) FROM messages WHERE account_id = '{a}'");
        assert_eq!(count(&storage, &sql).await, 1, "{a}");
    }
    // The keys hold: a duplicate is refused, the folder key cascades, the
    // search index answers, and message_views still follows its message.
    let dup = sqlx::query(
        "INSERT INTO messages (account_id, folder, uidvalidity, uid, flags) VALUES ($1, 'INBOX', 1, 1, '')",
    )
    .bind(accounts[0].as_str())
    .execute(storage.pool())
    .await;
    assert!(dup.is_err(), "the primary key holds on the partitioned table");
    let found = storage.search_messages(accounts[1].as_str(), None, &search_terms("quarterly 7"), None, 50).await;
    assert!(!found.expect("search").is_empty(), "the search index answers");
    sqlx::query("INSERT INTO message_views (account_id, folder, uidvalidity, uid, body, size, used_at) VALUES ($1, 'INBOX', 1, 3, '{}', 2, 0)")
        .bind(accounts[2].as_str())
        .execute(storage.pool())
        .await
        .expect("a view of a stored message");
    assert!(storage.remove_account(accounts[2].as_str()).await.expect("remove"));
    assert_eq!(count(&storage, "SELECT COUNT(*) FROM messages").await, 40 + 41);
    assert_eq!(count(&storage, "SELECT COUNT(*) FROM message_views").await, 0, "the view went with its message");

    // Done once: again with the same count is nothing; another count is refused.
    assert_eq!(storage.partition_messages(n(8)).await.unwrap(), MessagesLayout::Partitioned(8));
    let other = storage.partition_messages(n(16)).await.unwrap_err();
    assert!(matches!(other, PartitionError::OtherCount { have: 8, asked: 16 }), "{other:?}");
    assert!(other.to_string().contains("PG_MESSAGE_PARTITIONS=8"), "{other}");
    // Opening again (the migrations, the search index check) changes nothing.
    let again = Storage::open(db.url(), SecretKey::generate()).await.expect("open again");
    assert_eq!(again.messages_layout().await.unwrap(), MessagesLayout::Partitioned(8));
    assert_eq!(
        count(&again, "SELECT COUNT(*) FROM pg_indexes WHERE tablename = 'messages'").await,
        indexes_before,
        "no index made twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_and_bad_values_are_refused_and_change_nothing() {
    let db = TestDb::sqlite("partition_sqlite").expect("a SQLite test database");
    let storage = db.open().await.expect("open");
    let err = storage.partition_messages(n(4)).await.unwrap_err();
    assert!(matches!(err, PartitionError::NotPostgres), "{err:?}");
    assert!(err.to_string().contains("PG_MESSAGE_PARTITIONS is for Postgres"), "{err}");

    // The binary: a bad value is named with what to do, before anything is opened.
    let dir = tempfile::tempdir().expect("a dir");
    for bad in ["0", "many", "70000"] {
        let out = sync_worker_command(env!("CARGO_BIN_EXE_sync-worker"), dir.path())
            .args(["account", "list"])
            .env("DATABASE_URL", db.url())
            .env("SECRET_KEY", TEST_SECRET_KEY)
            .env("PG_MESSAGE_PARTITIONS", bad)
            .output()
            .expect("run sync-worker");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "PG_MESSAGE_PARTITIONS={bad} was taken");
        assert!(stderr.contains(&format!("PG_MESSAGE_PARTITIONS=\"{bad}\" is invalid")), "{stderr}");
    }
    // On SQLite, a valid count is refused with what to do.
    let out = sync_worker_command(env!("CARGO_BIN_EXE_sync-worker"), dir.path())
        .args(["account", "list"])
        .env("DATABASE_URL", db.url())
        .env("SECRET_KEY", TEST_SECRET_KEY)
        .env("PG_MESSAGE_PARTITIONS", "4")
        .output()
        .expect("run sync-worker");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("PG_MESSAGE_PARTITIONS is for Postgres"), "{stderr}");
}

/// The binary partitions a new Postgres database when `PG_MESSAGE_PARTITIONS`
/// is set; two processes started together both come up (one converts, the
/// other finds it done).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_partitions_a_new_database_when_asked() {
    let db = TestDb::postgres("partition_binary").expect("a Postgres test database");
    let dir = tempfile::tempdir().expect("a dir");
    let runs: Vec<_> = (0..2)
        .map(|_| {
            sync_worker_command(env!("CARGO_BIN_EXE_sync-worker"), dir.path())
                .args(["account", "list"])
                .env("DATABASE_URL", db.url())
                .env("SECRET_KEY", TEST_SECRET_KEY)
                .env("PG_MESSAGE_PARTITIONS", "6")
                .spawn()
                .expect("run sync-worker")
        })
        .collect();
    for mut run in runs {
        assert!(run.wait().expect("wait").success(), "two processes partitioning together both succeed");
    }
    let storage = db.open().await.expect("open");
    assert_eq!(storage.messages_layout().await.unwrap(), MessagesLayout::Partitioned(6));
}
