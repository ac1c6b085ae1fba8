//! The IMAP engine and the SQL storage against a real, private Dovecot,
//! every case on SQLite and on Postgres (a fresh database per test). Mail is
//! added by a real client (APPEND over IMAP) or by `doveadm`. A missing
//! Dovecot or Postgres fails these tests; they never skip.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::{FencingToken, Tier};
use sqlx::Row;
use sync_worker::both_databases;
use sync_worker::imap::{ImapSettings, ImapSource, LoginBackoff};
use sync_worker::secret::SecretKey;
use sync_worker::storage::{AccountAuth, Storage, StorageError};
use sync_worker::testing::{mail_gen, DovecotOptions, FenceAudit, ImapWorld, TestDb};
use sync_worker::{MailConnection, MailSource, RunnerHandle, RunnerSettings, Scope, SourceError};

const USER: &str = ImapWorld::USER;
const PASSWORD: &str = ImapWorld::PASSWORD;

async fn world(db: TestDb, password: &str) -> ImapWorld {
    ImapWorld::start(db, &DovecotOptions::default(), password).await
}

/// What these tests read of their world, beside what [`ImapWorld`] gives.
trait Checks {
    async fn connect(&self, token: u64) -> Box<dyn MailConnection>;
    async fn rows(&self, folder: &str) -> Vec<(i64, String)>;
    async fn all_rows(&self) -> i64;
    fn server_count(&self, folder: &str) -> u32;
}

impl Checks for ImapWorld {
    async fn connect(&self, token: u64) -> Box<dyn MailConnection> {
        self.source().connect(&self.fence(token)).await.unwrap_or_else(|e| panic!("connect: {e:?}"))
    }

    /// (uid, flags) of every stored message of `folder`, by UID.
    async fn rows(&self, folder: &str) -> Vec<(i64, String)> {
        sqlx::query("SELECT uid, flags FROM messages WHERE account_id = $1 AND folder = $2 ORDER BY uid")
            .bind(self.account.as_str())
            .bind(folder)
            .fetch_all(self.storage.pool())
            .await
            .expect("rows")
            .iter()
            .map(|r| (r.get::<i64, _>(0), r.get::<String, _>(1)))
            .collect()
    }

    async fn all_rows(&self) -> i64 {
        sqlx::query("SELECT COUNT(*) FROM messages WHERE account_id = $1")
            .bind(self.account.as_str())
            .fetch_one(self.storage.pool())
            .await
            .expect("count")
            .get(0)
    }

    fn server_count(&self, folder: &str) -> u32 {
        self.dovecot.mailbox_status(USER, folder).expect("status").messages
    }
}

both_databases!(
    async:
    initial_sync_stores_mail_and_finds_special_folders,
    unchanged_folders_cost_no_fetch,
    last_sync_is_set_by_a_whole_sync_not_by_inbox_alone,
    flag_changes_by_another_client_are_reflected,
    expunges_are_reflected_including_500_at_once,
    uidvalidity_change_leaves_no_stale_rows,
    stale_owner_writes_nothing,
    the_token_takes_effect_at_claim_time,
    a_secret_key_that_does_not_decrypt_sets_last_error,
    killed_server_process_recovers_without_loss_or_duplicates,
    interrupted_initial_sync_resumes_without_duplicates,
    mail_between_fetch_and_idle_is_not_missed,
    hot_account_sees_new_mail_within_2s,
    wrong_password_sets_last_error_without_a_storm,
    idle_has_a_hard_deadline_and_notices_a_dead_connection,
    a_failing_folder_does_not_stop_the_others,
    a_folder_with_high_uids_is_searched_in_windows,
);

async fn initial_sync_stores_mail_and_finds_special_folders(db: TestDb) {
    let w = world(db, PASSWORD).await;
    w.append("INBOX", 3, 1);
    w.append("Sent", 2, 2);
    let mut conn = w.connect(1).await;
    let report = conn.poll(Scope::All).await.expect("poll");
    assert_eq!(report.new_messages, 5);
    assert_eq!(w.rows("INBOX").await.len(), 3);
    assert_eq!(w.rows("Sent").await.len(), 2);
    let roles: Vec<(String, Option<String>)> =
        sqlx::query("SELECT name, role FROM folders WHERE account_id = $1 ORDER BY name")
            .bind(w.account.as_str())
            .fetch_all(w.storage.pool())
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
    for (name, role) in
        [("Archive", "archive"), ("Drafts", "drafts"), ("Junk", "junk"), ("Sent", "sent"), ("Trash", "trash")]
    {
        assert!(roles.contains(&(name.to_string(), Some(role.to_string()))), "{name} not found as {role}: {roles:?}");
    }
    // What mail-parser made of the first message matches what was sent.
    let m = mail_gen::message(1, 0);
    let row = sqlx::query("SELECT subject, message_id, preview, internal_date FROM messages WHERE account_id = $1 AND folder = 'INBOX' AND uid = 1")
        .bind(w.account.as_str())
        .fetch_one(w.storage.pool())
        .await
        .unwrap();
    assert_eq!(row.get::<Option<String>, _>(0).as_deref(), Some(m.subject.as_str()));
    assert_eq!(
        row.get::<Option<String>, _>(1).map(|id| format!("<{id}>")),
        Some(m.message_id.clone()).map(|id| if id.starts_with('<') { id } else { format!("<{id}>") })
    );
    assert!(row.get::<Option<String>, _>(2).is_some_and(|p| !p.is_empty()), "no preview");
    assert!(row.get::<Option<i64>, _>(3).is_some());
    let latest = w.source().latest_internal_date(&w.account).await.unwrap();
    assert!(latest.is_some());
    let summary = w.storage.account(w.account.as_str()).await.unwrap().unwrap();
    assert!(summary.last_sync_at.is_some() && summary.last_error.is_none(), "{summary:?}");
}

/// "Last sync" means that a whole sync finished: a poll of INBOX alone (a
/// hot account's watch starting) leaves it unset on a new account, and
/// refreshes it once a whole sync has set it.
async fn last_sync_is_set_by_a_whole_sync_not_by_inbox_alone(db: TestDb) {
    let w = world(db, PASSWORD).await;
    w.append("INBOX", 2, 5);
    let last_sync = || async { w.storage.account(w.account.as_str()).await.unwrap().unwrap().last_sync_at };
    let mut conn = w.connect(1).await;
    conn.poll(Scope::Inbox).await.expect("INBOX poll");
    assert_eq!(last_sync().await, None, "INBOX alone set last_sync_at");
    conn.poll(Scope::All).await.expect("whole poll");
    let whole = last_sync().await.expect("a whole sync sets last_sync_at");
    tokio::time::sleep(Duration::from_millis(5)).await;
    conn.poll(Scope::Inbox).await.expect("INBOX poll again");
    assert!(last_sync().await.expect("still set") > whole, "an INBOX poll after a whole sync refreshes it");
}

async fn unchanged_folders_cost_no_fetch(db: TestDb) {
    let w = world(db, PASSWORD).await;
    w.append("INBOX", 4, 3);
    let mut conn = w.connect(1).await;
    conn.poll(Scope::All).await.expect("first poll");
    drop(conn);
    let source = w.source();
    let mut conn = source.connect(&w.fence(1)).await.expect("connect");
    let report = conn.poll(Scope::All).await.expect("second poll");
    assert_eq!(report.new_messages, 0);
    assert_eq!(w.rows("INBOX").await.len(), 4);
    let sent = source.commands();
    assert!(!sent.keys().any(|c| c.contains("FETCH")), "a FETCH on an unchanged account: {sent:?}");
    assert!(!sent.contains_key("SELECT"), "a SELECT on an unchanged account: {sent:?}");
    // Every folder's counters from one LIST-STATUS (Dovecot offers it): no STATUS.
    assert_eq!(sent.get("LIST-STATUS"), Some(&1), "{sent:?}");
    assert_eq!(sent.get("STATUS"), None, "{sent:?}");
}

async fn flag_changes_by_another_client_are_reflected(db: TestDb) {
    let w = world(db, PASSWORD).await;
    w.append("INBOX", 3, 4);
    let mut conn = w.connect(1).await;
    conn.poll(Scope::Inbox).await.expect("poll");
    w.dovecot.add_flags(USER, "INBOX", "\\Seen \\Flagged", &["uid", "2"]).expect("flags");
    conn.poll(Scope::Inbox).await.expect("poll");
    let rows = w.rows("INBOX").await;
    assert_eq!(rows[1], (2, "\\Flagged \\Seen".to_string()), "{rows:?}");
    assert_eq!(rows[0].1, "");
}

async fn expunges_are_reflected_including_500_at_once(db: TestDb) {
    let w = world(db, PASSWORD).await;
    w.append("INBOX", 600, 5);
    let mut conn = w.connect(1).await;
    conn.poll(Scope::Inbox).await.expect("poll");
    assert_eq!(w.rows("INBOX").await.len(), 600);
    w.dovecot.expunge(USER, "INBOX", &["uid", "7"]).expect("expunge one");
    conn.poll(Scope::Inbox).await.expect("poll");
    assert!(!w.rows("INBOX").await.iter().any(|(u, _)| *u == 7));
    w.dovecot.expunge(USER, "INBOX", &["uid", "1:501"]).expect("mass expunge");
    drop(conn);
    let source = w.source();
    let mut conn = source.connect(&w.fence(1)).await.expect("connect");
    conn.poll(Scope::Inbox).await.expect("poll");
    // Dovecot offers QRESYNC: VANISHED named the expunges, no UID SEARCH ALL diff was needed.
    assert_eq!(source.commands().get("UID SEARCH"), Some(&1), "{:?}", source.commands());
    let rows = w.rows("INBOX").await;
    assert_eq!(rows.len() as u32, w.server_count("INBOX"));
    assert_eq!(rows.len(), 99);
    assert_eq!(rows[0].0, 502);
}

async fn uidvalidity_change_leaves_no_stale_rows(db: TestDb) {
    let w = world(db, PASSWORD).await;
    w.append("INBOX", 5, 6);
    let mut conn = w.connect(1).await;
    conn.poll(Scope::Inbox).await.expect("poll");
    drop(conn);
    let old = w.dovecot.mailbox_status(USER, "INBOX").unwrap().uid_validity;
    w.dovecot.set_uid_validity(USER, "INBOX", old + 1000).expect("uidvalidity");
    let mut conn = w.connect(1).await;
    conn.poll(Scope::Inbox).await.expect("poll");
    let stale: i64 = sqlx::query("SELECT COUNT(*) FROM messages WHERE account_id = $1 AND uidvalidity <> $2")
        .bind(w.account.as_str())
        .bind(i64::from(old + 1000))
        .fetch_one(w.storage.pool())
        .await
        .unwrap()
        .get(0);
    assert_eq!(stale, 0, "rows of the old UIDVALIDITY remain");
    assert_eq!(w.rows("INBOX").await.len() as u32, w.server_count("INBOX"));
}

async fn stale_owner_writes_nothing(db: TestDb) {
    let w = world(db, PASSWORD).await;
    w.append("INBOX", 2, 7);
    let mut old = w.connect(1).await;
    old.poll(Scope::Inbox).await.expect("old owner's poll");
    // A newer owner takes over and writes.
    let mut new = w.connect(2).await;
    new.poll(Scope::Inbox).await.expect("new owner's poll");
    // Mail arrives and a flag changes; the paused old owner wakes and polls.
    w.append("INBOX", 3, 8);
    w.dovecot.add_flags(USER, "INBOX", "\\Seen", &["all"]).unwrap();
    let before = w.rows("INBOX").await;
    match old.poll(Scope::Inbox).await {
        Err(SourceError::Fenced { token, current, .. }) => {
            assert_eq!((token, current), (FencingToken(1), FencingToken(2)));
        }
        other => panic!("the stale owner's poll was not fenced: {other:?}"),
    }
    assert_eq!(w.rows("INBOX").await, before, "the stale owner changed rows");
    let owner: Option<String> = sqlx::query("SELECT fence_owner FROM accounts WHERE id = $1")
        .bind(w.account.as_str())
        .fetch_one(w.storage.pool())
        .await
        .unwrap()
        .get(0);
    assert_eq!(owner.as_deref(), Some("w2"));
    // Storage itself: an older token is rejected before anything runs.
    match w.storage.write(&w.fence(1)).await {
        Err(StorageError::Fenced { current, .. }) => assert_eq!(current, FencingToken(2)),
        other => panic!("expected Fenced, got {other:?}"),
    }
    new.poll(Scope::Inbox).await.expect("the owner goes on");
    assert_eq!(w.rows("INBOX").await.len(), 5);
}

/// A new owner's token takes effect when it claims, before it has written
/// any mail: the old owner's next write is rejected. On Postgres the audit
/// trigger's record shows no row written under the old token after the new
/// one was recorded.
async fn the_token_takes_effect_at_claim_time(db: TestDb) {
    let w = world(db, PASSWORD).await;
    let audit = w.db.postgres_db().map(|db| FenceAudit::install(db).expect("install the audit trigger"));
    let source = w.source();
    w.append("INBOX", 2, 7);
    source.take_over(&w.fence(1)).await.expect("the first owner records its claim");
    let mut old = w.connect(1).await;
    old.poll(Scope::Inbox).await.expect("old owner's poll");
    // The new owner claims and records its token; it writes no mail.
    source.take_over(&w.fence(2)).await.expect("the new owner records its claim");
    w.append("INBOX", 3, 8);
    let before = w.rows("INBOX").await;
    match old.poll(Scope::Inbox).await {
        Err(SourceError::Fenced { token, current, .. }) => {
            assert_eq!((token, current), (FencingToken(1), FencingToken(2)));
        }
        other => panic!("the old owner's poll was not fenced: {other:?}"),
    }
    assert_eq!(w.rows("INBOX").await, before, "the old owner changed rows");
    // Storage itself: the claim-time check is strict (an equal token from
    // another worker is a duplicate claim), the write check is not (an
    // owner's own later writes).
    let elsewhere = |token| sync_worker::Fence {
        worker: leasehold_core::WorkerId::new("another-worker").unwrap(),
        ..w.fence(token)
    };
    for (fence, what) in [(w.fence(1), "an older token"), (elsewhere(2), "the stored token, from another worker")] {
        match w.storage.record_claim(&fence).await {
            Err(StorageError::Fenced { token: t, current, .. }) => {
                assert_eq!((t, current), (fence.token, FencingToken(2)), "{what}")
            }
            other => panic!("a claim with {what} was recorded: {other:?}"),
        }
    }
    // Its own token again, from the worker that recorded it: one bucket
    // lease covers many starts of the account's runner.
    w.storage.record_claim(&w.fence(2)).await.expect("the owner records its own token again");
    assert!(matches!(w.storage.write(&w.fence(1)).await, Err(StorageError::Fenced { .. })));
    let tx = w.storage.write(&w.fence(2)).await.expect("the owner's own write passes");
    tx.commit().await.expect("commit");
    w.storage.record_claim(&w.fence(3)).await.expect("a newer claim is recorded");
    assert_eq!(w.storage.stored_token(&w.fence(3)).await.expect("read"), Some(FencingToken(3)));
    if let Some(audit) = audit {
        let account = w.account.as_str();
        assert_eq!(audit.claims(account).expect("claims"), [1, 2, 3]);
        assert_eq!(audit.writes_under(account, 1).expect("writes"), 2, "the old owner's first poll");
        assert_eq!(audit.stale_writes().expect("stale"), Vec::<String>::new());
    }
}

/// A valid `SECRET_KEY` that is not the one the passwords were sealed with:
/// the account's `last_error` says so, no login is tried, and the runner
/// treats it as permanent (a whole interval between attempts, not a storm).
async fn a_secret_key_that_does_not_decrypt_sets_last_error(db: TestDb) {
    let w = world(db, PASSWORD).await;
    let url = w.db.url().to_string();
    let other = Storage::open(&url, SecretKey::generate()).await.expect("open with another key");
    let source = ImapSource::new(other, ImapSettings::default());
    source.take_over(&w.fence(1)).await.expect("claim");
    match source.connect(&w.fence(1)).await {
        Err(e @ SourceError::Secret { .. }) => assert!(e.is_permanent(), "{e}"),
        Err(other) => panic!("expected a SECRET_KEY error, got {other:?}"),
        Ok(_) => panic!("connected with a password that does not decrypt"),
    }
    let e = w.last_error().await.expect("last_error set");
    assert!(e.contains("does not decrypt with this SECRET_KEY"), "{e}");
    let log = std::fs::read_to_string(w.dovecot.log_path()).unwrap_or_default();
    assert!(!log.contains("Login: user=<alice>"), "a login was tried:\n{}", w.dovecot.log_tail());
}

async fn killed_server_process_recovers_without_loss_or_duplicates(db: TestDb) {
    let w = world(db, PASSWORD).await;
    w.append("INBOX", 1500, 9);
    let source = w.source();
    let fence = w.fence(1);
    let poll = tokio::spawn(async move {
        let mut conn = source.connect(&fence).await?;
        conn.poll(Scope::Inbox).await
    });
    // Kill the server side once the first batch is in.
    let started = Instant::now();
    while w.all_rows().await == 0 && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let killed = w.dovecot.kill_imap_processes(USER).expect("kill");
    let first = poll.await.expect("join");
    assert!(killed >= 1);
    if first.is_ok() {
        // The sync won the race; the recovery below must still hold.
        eprintln!("the first poll finished before the kill");
    }
    let mut conn = w.connect(1).await;
    conn.poll(Scope::Inbox).await.expect("poll after the kill");
    let rows = w.rows("INBOX").await;
    assert_eq!(w.server_count("INBOX"), 1500, "Dovecot lost mail");
    assert_eq!(rows.len(), 1500);
    let mut uids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    uids.dedup();
    assert_eq!(uids.len(), 1500, "duplicates");
}

async fn interrupted_initial_sync_resumes_without_duplicates(db: TestDb) {
    let w = world(db, PASSWORD).await;
    w.append("INBOX", 1200, 10);
    let source = w.source();
    let fence = w.fence(1);
    let poll = tokio::spawn(async move {
        let mut conn = source.connect(&fence).await?;
        conn.poll(Scope::Inbox).await
    });
    let started = Instant::now();
    while w.all_rows().await < 500 && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The worker dies mid-sync.
    poll.abort();
    let _ = poll.await;
    let partial = w.all_rows().await;
    assert!((500..1200).contains(&partial), "not interrupted mid-sync: {partial} rows");
    let mut conn = w.connect(2).await;
    let report = conn.poll(Scope::Inbox).await.expect("resumed poll");
    assert_eq!(report.new_messages as i64, 1200 - partial, "the resumed sync refetched committed batches");
    assert_eq!(w.rows("INBOX").await.len(), 1200);
}

async fn mail_between_fetch_and_idle_is_not_missed(db: TestDb) {
    let w = world(db, PASSWORD).await;
    w.append("INBOX", 1, 11);
    let mut conn = w.connect(1).await;
    conn.poll(Scope::Inbox).await.expect("poll");
    // Arrives after the FETCH, before the IDLE.
    w.append("INBOX", 1, 12);
    tokio::time::timeout(Duration::from_secs(3), conn.wait_new_mail())
        .await
        .expect("the wait did not notice mail that arrived before it")
        .expect("wait");
    conn.poll(Scope::Inbox).await.expect("poll");
    assert_eq!(w.rows("INBOX").await.len(), 2);
}

async fn hot_account_sees_new_mail_within_2s(db: TestDb) {
    let w = world(db, PASSWORD).await;
    let settings = RunnerSettings {
        poll_warm: Duration::from_secs(600),
        poll_cold: Duration::from_secs(600),
        idle_reissue: Duration::from_secs(600),
        retry_base: Duration::from_secs(1),
        poll_stagger: sync_worker::POLL_STAGGER,
    };
    let runner = RunnerHandle::spawn(
        Arc::new(w.source()),
        w.fence(1),
        Tier::Hot,
        tokio::time::Instant::now() + Duration::from_secs(3600),
        settings,
    );
    // Wait for the watch's first INBOX poll (the folder row appears).
    let started = Instant::now();
    while w.storage.folder_state(&w.account, "INBOX").await.unwrap().is_none() {
        assert!(started.elapsed() < Duration::from_secs(10), "the watch never polled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for round in 0..3u64 {
        w.append("INBOX", 1, 100 + round);
        let appended = Instant::now();
        while w.rows("INBOX").await.len() as u64 <= round {
            assert!(appended.elapsed() < Duration::from_secs(2), "mail {round} not in the DB within 2 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    runner.stop(Duration::from_secs(1)).await;
}

/// Dovecot's count of refused logins so far, from its log.
fn refused_logins(w: &ImapWorld) -> usize {
    let log = std::fs::read_to_string(w.dovecot.log_path()).unwrap_or_default();
    log.matches("auth failed").count().max(log.matches("Authentication failed").count())
}

async fn wrong_password_sets_last_error_without_a_storm(db: TestDb) {
    let w = world(db, "not-the-password").await;
    // Small waits, so that the whole schedule fits in the test: 1 s after
    // the first refusal, 2 s after the second, none after the third.
    let backoff = LoginBackoff {
        first: Duration::from_secs(1),
        max: Duration::from_secs(2),
        attempts: NonZeroU32::new(3).unwrap(),
    };
    let source = ImapSource::new(w.storage.clone(), ImapSettings { login_backoff: backoff, ..ImapSettings::default() });
    match source.connect(&w.fence(1)).await {
        Err(SourceError::Auth { answer, refusals, next_attempt_ms, .. }) => {
            assert!(answer.contains("Authentication failed"), "{answer}");
            assert_eq!(refusals, 1);
            assert!(next_attempt_ms.is_some(), "a second attempt is owed");
        }
        Err(other) => panic!("expected an auth error, got {other:?}"),
        Ok(_) => panic!("a wrong password logged in"),
    }
    let e = w.last_error().await.expect("last_error set");
    assert!(e.contains("authentication failed") && e.contains("refused logins in a row: 1"), "{e}");
    assert!(e.contains("the next login is tried at "), "{e}");
    // Before the wait is over nothing reaches the server, from any owner.
    match ImapSource::new(w.storage.clone(), ImapSettings { login_backoff: backoff, ..ImapSettings::default() })
        .connect(&w.fence(2))
        .await
    {
        Err(SourceError::LoginWaiting { refusals: 1, .. }) => {}
        Err(other) => panic!("expected a wait, got {other:?}"),
        Ok(_) => panic!("a wrong password logged in"),
    }
    // A hot runner whose loops (periodic poll and INBOX watch) wake every
    // 100 ms: only the schedule's two more attempts reach Dovecot (which
    // answers each refusal later than the last, its own penalty), then none.
    let settings = RunnerSettings {
        poll_warm: Duration::from_millis(100),
        poll_cold: Duration::from_millis(100),
        idle_reissue: Duration::from_secs(600),
        retry_base: Duration::from_millis(100),
        poll_stagger: sync_worker::POLL_STAGGER,
    };
    let runner = RunnerHandle::spawn(
        Arc::new(source.clone()),
        w.fence(3),
        Tier::Hot,
        tokio::time::Instant::now() + Duration::from_secs(3600),
        settings,
    );
    let started = Instant::now();
    while w.storage.login_failures(&w.account).await.expect("read").count < 3 {
        assert!(started.elapsed() < Duration::from_secs(60), "no third refusal:\n{}", w.dovecot.log_tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Some 30 more wakes of each loop.
    tokio::time::sleep(Duration::from_secs(3)).await;
    runner.stop(Duration::from_secs(1)).await;
    assert_eq!(refused_logins(&w), 3, "three refusals in all, then none:\n{}", w.dovecot.log_tail());
    let e = w.last_error().await.expect("last_error set");
    assert!(e.contains("refused logins in a row: 3") && e.contains("account update"), "{e}");
    match source.connect(&w.fence(4)).await {
        Err(SourceError::LoginGivenUp { refusals: 3, .. }) => {}
        Err(other) => panic!("expected no more attempts, got {other:?}"),
        Ok(_) => panic!("a wrong password logged in"),
    }
    // The login updated (the CLI's `account update`, the API's PATCH): tried at once, and it works.
    let mut login = w.storage.credentials(&w.account).await.expect("credentials");
    login.auth = AccountAuth::Password(PASSWORD.into());
    w.storage.update_login(&w.account, &login, None).await.expect("update the login");
    let mut conn = source.connect(&w.fence(5)).await.unwrap_or_else(|e| panic!("connect after the update: {e:?}"));
    conn.poll(Scope::Inbox).await.expect("poll");
    let failures = w.storage.login_failures(&w.account).await.expect("read");
    assert_eq!((failures.count, failures.retry_at_ms), (0, None));
    assert_eq!(refused_logins(&w), 3);
}

async fn idle_has_a_hard_deadline_and_notices_a_dead_connection(db: TestDb) {
    let w = world(db, PASSWORD).await;
    let settings = ImapSettings {
        idle_deadline: Duration::from_secs(1),
        idle_silence: Duration::from_millis(300),
        ..ImapSettings::default()
    };
    let source = ImapSource::new(w.storage.clone(), settings);
    let mut conn = source.connect(&w.fence(1)).await.expect("connect");
    conn.poll(Scope::Inbox).await.expect("poll");
    // No mail: the wait ends by itself at the deadline, the connection alive.
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), conn.wait_new_mail()).await.expect("no hard deadline").expect("wait");
    assert!(started.elapsed() >= Duration::from_millis(300), "IDLE ended at once");
    conn.poll(Scope::Inbox).await.expect("the connection survived the re-issue");
    assert!(source.commands().get("IDLE").is_some_and(|n| *n >= 1), "{:?}", source.commands());
    // The server side dies during IDLE: the wait fails soon, it does not hang
    // (deadlines far away, so only the dead connection can end it).
    let long = ImapSettings {
        idle_deadline: Duration::from_secs(120),
        idle_silence: Duration::from_secs(120),
        ..ImapSettings::default()
    };
    let mut conn = ImapSource::new(w.storage.clone(), long).connect(&w.fence(1)).await.expect("connect");
    conn.poll(Scope::Inbox).await.expect("poll");
    let waiter = tokio::spawn(async move { conn.wait_new_mail().await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the wait ended without mail, deadline or failure");
    w.dovecot.kill_imap_processes(USER).expect("kill");
    let r =
        tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("a dead connection went unnoticed").unwrap();
    assert!(r.is_err(), "a wait on a dead connection succeeded");
}

async fn a_failing_folder_does_not_stop_the_others(db: TestDb) {
    let w = world(db, PASSWORD).await;
    let mut conn = w.connect(1).await;
    conn.poll(Scope::All).await.expect("poll");
    // Archive becomes unreadable to the server (it answers NO); mail arrives in the others.
    use std::os::unix::fs::PermissionsExt;
    let archive = w.dovecot.dir().join("home").join(USER).join("Maildir").join(".Archive");
    std::fs::set_permissions(&archive, std::fs::Permissions::from_mode(0o000)).expect("chmod Archive");
    w.append("INBOX", 2, 20);
    w.append("Trash", 1, 21);
    let report = conn.poll(Scope::All).await.expect("a refused folder failed the whole poll");
    assert_eq!(report.new_messages, 3);
    assert_eq!(w.rows("INBOX").await.len(), 2);
    assert_eq!(w.rows("Trash").await.len(), 1);
    let e = w.last_error().await.expect("the refused folder is reported");
    assert!(e.contains("Archive"), "{e}");
    // The connection is still usable.
    conn.poll(Scope::Inbox).await.expect("poll after the refusal");
}

/// UIDs far apart (a big or an old folder): the new-mail SEARCH goes in
/// windows of 50,000 UIDs, so that no answer line passes the reader's
/// 1 MiB line limit, and every message is still found.
async fn a_folder_with_high_uids_is_searched_in_windows(db: TestDb) {
    let w = world(db, PASSWORD).await;
    w.append("INBOX", 3, 1);
    w.dovecot.doveadm(&["mailbox", "update", "-u", USER, "--min-next-uid", "120000", "INBOX"]).expect("doveadm");
    w.append("INBOX", 2, 2);
    let uids: Vec<i64> = {
        let source = w.source();
        let mut conn = source.connect(&w.fence(1)).await.expect("connect");
        let report = conn.poll(Scope::Inbox).await.expect("poll");
        assert_eq!(report.new_messages, 5);
        // 1..=50000, 50001..=100000, then 100001:*.
        assert_eq!(source.commands().get("UID SEARCH"), Some(&3), "{:?}", source.commands());
        w.rows("INBOX").await.into_iter().map(|(u, _)| u).collect()
    };
    assert_eq!(uids, vec![1, 2, 3, 120000, 120001]);
    assert_eq!(w.server_count("INBOX"), 5);
}
