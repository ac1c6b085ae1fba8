//! The webhook outbox under fencing, on SQLite and Postgres: a delivery is
//! recorded exactly when the mail change it announces is committed, once
//! per event however often the change is stored, and never by a stale
//! owner's write or one that outlived its lease.

use std::time::Duration;

use tokio::time::Instant;

use leasehold_core::{FencingToken, LeaseKey, UserId, WorkerId};
use sqlx::Row;
use sync_worker::both_databases;
use sync_worker::deadline::LeaseDeadline;
use sync_worker::events::MailEventKind;
use sync_worker::storage::{AccountAuth, Email, MessageRow, NewAccount, Security, Storage, StorageError};
use sync_worker::testing::TestDb;
use sync_worker::Fence;

both_databases!(
    async:
    a_delivery_is_recorded_once_per_event_and_only_by_the_owner,
    a_paused_webhook_holds_its_events_and_a_webhook_for_other_events_gets_none,
);

async fn alice(storage: &Storage) -> (UserId, LeaseKey) {
    let user = storage.add_user(&"alice@example.org".parse::<Email>().unwrap()).await.expect("user");
    let account = storage
        .add_account(&NewAccount {
            user: user.id.clone(),
            host: "127.0.0.1".into(),
            port: 1,
            security: Security::Plain,
            username: "alice".into(),
            auth: AccountAuth::Password("pw".into()),
        })
        .await
        .expect("account");
    (user.id, account)
}

fn fence(account: &LeaseKey, token: u64, deadline: LeaseDeadline) -> Fence {
    Fence { account: account.clone(), worker: WorkerId::new("w").unwrap(), token: FencingToken(token), deadline }
}

async fn store(storage: &Storage, fence: &Fence, uid: u32) -> Result<(), StorageError> {
    let mut tx = storage.write(fence).await?;
    tx.ensure_folder("INBOX", None).await?;
    let row = MessageRow { uid, flags: String::new(), subject: Some(format!("m{uid}")), ..MessageRow::default() };
    tx.insert_messages("INBOX", 7, &[row]).await?;
    tx.commit().await
}

/// `(event, state)` of every recorded delivery, sorted.
async fn deliveries(storage: &Storage) -> Vec<(String, String)> {
    let rows = sqlx::query("SELECT event, state, event_id FROM webhook_deliveries ORDER BY event, event_id")
        .fetch_all(storage.pool())
        .await
        .expect("deliveries");
    rows.iter().map(|r| (r.get::<String, _>(0), r.get::<String, _>(1))).collect()
}

async fn a_delivery_is_recorded_once_per_event_and_only_by_the_owner(db: TestDb) {
    let storage = db.open().await.expect("storage");
    let (user, account) = alice(&storage).await;
    storage.add_webhook(&user, "https://1.2.3.4/hook", &[MailEventKind::New], "s").await.expect("webhook");
    let owner = fence(&account, 1, LeaseDeadline::unbounded());
    storage.record_claim(&owner).await.expect("claim");
    store(&storage, &owner, 1).await.expect("store");
    assert_eq!(deliveries(&storage).await, [("message.new".to_string(), "pending".to_string())]);
    // Stored again (a poll that overlapped another): the same event, recorded once.
    store(&storage, &owner, 1).await.expect("store again");
    assert_eq!(deliveries(&storage).await.len(), 1);

    // A successor claims with token 2: the old owner's write records nothing.
    storage.record_claim(&fence(&account, 2, LeaseDeadline::unbounded())).await.expect("successor");
    let stale = store(&storage, &owner, 2).await;
    assert!(matches!(stale, Err(StorageError::Fenced { .. })), "{stale:?}");
    // A write that outlives its lease rolls back, outbox and all.
    let deadline = LeaseDeadline::until(Instant::now() + Duration::from_millis(300));
    let late = fence(&account, 3, deadline);
    storage.record_claim(&late).await.expect("claim 3");
    let mut tx = storage.write(&late).await.expect("write");
    tx.ensure_folder("INBOX", None).await.unwrap();
    tx.insert_messages("INBOX", 7, &[MessageRow { uid: 3, ..MessageRow::default() }]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(tx.commit().await, Err(StorageError::LeaseExpired { .. })));
    assert_eq!(deliveries(&storage).await.len(), 1, "only the owner's committed write is announced");

    // The current owner's new mail is.
    store(&storage, &fence(&account, 4, LeaseDeadline::unbounded()), 4).await.expect("owner 4");
    assert_eq!(deliveries(&storage).await.len(), 2);
}

async fn a_paused_webhook_holds_its_events_and_a_webhook_for_other_events_gets_none(db: TestDb) {
    let storage = db.open().await.expect("storage");
    let (user, account) = alice(&storage).await;
    let deleted_only =
        storage.add_webhook(&user, "https://1.2.3.4/a", &[MailEventKind::Deleted], "s").await.expect("webhook");
    let paused = storage.add_webhook(&user, "https://1.2.3.4/b", &[MailEventKind::New], "s").await.expect("webhook");
    sqlx::query("UPDATE webhooks SET paused_at = 1, paused_reason = 'test' WHERE id = $1")
        .bind(&paused.id)
        .execute(storage.pool())
        .await
        .unwrap();
    let owner = fence(&account, 1, LeaseDeadline::unbounded());
    storage.record_claim(&owner).await.expect("claim");
    store(&storage, &owner, 1).await.expect("store");
    assert_eq!(deliveries(&storage).await, [("message.new".to_string(), "held".to_string())]);
    let shown = storage.webhook(&user, &paused.id).await.unwrap().unwrap();
    assert_eq!((shown.undelivered, shown.paused_reason.as_deref()), (1, Some("test")));
    assert_eq!(storage.webhook(&user, &deleted_only.id).await.unwrap().unwrap().undelivered, 0);
    // Resumed: the held delivery is pending again, in a new batch.
    let resumed = storage.resume_webhook(&user, &paused.id).await.unwrap().unwrap();
    assert!(resumed.paused_at.is_none());
    assert_eq!(deliveries(&storage).await, [("message.new".to_string(), "pending".to_string())]);
    let open = storage.open_webhook_batches(10).await.unwrap();
    assert_eq!(open.len(), 2, "the commit's batch and the resume's: {open:?}");
    // Removing the webhook takes its deliveries.
    assert!(storage.remove_webhook(&user, &paused.id).await.unwrap());
    assert!(deliveries(&storage).await.is_empty());
}
