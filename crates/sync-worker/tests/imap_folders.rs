//! Every folder, and nothing missed while hot (issue 21, items 3 and 4),
//! against a private Dovecot, on SQLite and on Postgres. Folders are
//! created, renamed and deleted by `doveadm`, as another client would.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::Tier;
use sqlx::Row;
use sync_worker::both_databases;
use sync_worker::events::{MailEventKind, SyncEvent};
use sync_worker::imap::{ImapSettings, ImapSource};
use sync_worker::testing::{DovecotOptions, ImapProxy, ImapWorld, TestDb};
use sync_worker::{MailConnection, MailSource, RunnerHandle, RunnerSettings, Scope};

const USER: &str = ImapWorld::USER;

async fn world(db: TestDb, options: &DovecotOptions) -> ImapWorld {
    ImapWorld::start(db, options, ImapWorld::PASSWORD).await
}

/// What these tests read of their world, beside what [`ImapWorld`] gives.
trait Checks {
    async fn connect_with(&self, source: &ImapSource) -> Box<dyn MailConnection>;
    async fn counts(&self) -> Vec<(String, i64)>;
    async fn flagged(&self, folder: &str, flag: &str) -> usize;
    fn server_counts(&self) -> Vec<(String, i64)>;
    fn deleted_events(&self, folder: &str) -> usize;
}

impl Checks for ImapWorld {
    async fn connect_with(&self, source: &ImapSource) -> Box<dyn MailConnection> {
        source.connect(&self.fence(1)).await.unwrap_or_else(|e| panic!("connect: {e:?}"))
    }

    /// folder -> stored messages, for every folder storage holds.
    async fn counts(&self) -> Vec<(String, i64)> {
        sqlx::query(
            "SELECT f.name, (SELECT COUNT(*) FROM messages m WHERE m.account_id = f.account_id AND m.folder = f.name) \
             FROM folders f WHERE f.account_id = $1 ORDER BY f.name",
        )
        .bind(self.account.as_str())
        .fetch_all(self.storage.pool())
        .await
        .expect("counts")
        .iter()
        .map(|r| (r.get::<String, _>(0), r.get::<i64, _>(1)))
        .collect()
    }

    /// How many stored messages of `folder` carry `flag`.
    async fn flagged(&self, folder: &str, flag: &str) -> usize {
        sqlx::query("SELECT flags FROM messages WHERE account_id = $1 AND folder = $2")
            .bind(self.account.as_str())
            .bind(folder)
            .fetch_all(self.storage.pool())
            .await
            .expect("flags")
            .iter()
            .filter(|r| r.get::<String, _>(0).split(' ').any(|f| f == flag))
            .count()
    }

    /// folder -> `doveadm mailbox status` messages, for every folder
    /// `doveadm mailbox list` names.
    fn server_counts(&self) -> Vec<(String, i64)> {
        let list = self.dovecot.doveadm(&["mailbox", "list", "-u", USER]).expect("mailbox list");
        let mut v: Vec<(String, i64)> = list
            .lines()
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .map(|f| (f.to_string(), i64::from(self.dovecot.mailbox_status(USER, f).expect("status").messages)))
            .collect();
        v.sort();
        v
    }

    fn deleted_events(&self, folder: &str) -> usize {
        self.events
            .all()
            .iter()
            .filter(|e| matches!(e, SyncEvent::Mail(m) if m.kind == MailEventKind::Deleted && m.folder == folder))
            .count()
    }
}

both_databases!(
    async:
    a_folder_tree_with_non_ascii_names_is_synced,
    without_list_status_one_status_per_folder,
    created_renamed_and_deleted_folders_are_reflected,
    past_the_folder_limit_the_status_says_so,
    uidvalidity_reset_on_a_hot_account_is_seen_within_one_idle_reissue,
    flags_without_condstore_all_arrive_eventually,
    a_folder_that_breaks_the_connection_does_not_keep_the_others_from_syncing,
    names_with_quotes_and_backslashes_are_synced,
);

const TREE: [&str; 4] = ["Projekte", "Projekte/Ärger", "Projekte/Ärger/日本語", "Tom & Jerry"];

async fn a_folder_tree_with_non_ascii_names_is_synced(db: TestDb) {
    let w = world(db, &DovecotOptions::default()).await;
    w.dovecot.create_folders(USER, &TREE).expect("create");
    w.append("INBOX", 2, 1);
    // APPEND goes over IMAP: the names in modified UTF-7.
    w.append("Projekte/&AMQ-rger", 3, 2);
    w.append("Projekte/&AMQ-rger/&ZeVnLIqe-", 4, 3);
    w.append("Tom &- Jerry", 1, 4);
    let source = ImapSource::new(w.storage.clone(), ImapSettings::default());
    let mut conn = w.connect_with(&source).await;
    let report = conn.poll(Scope::All).await.expect("poll");
    assert_eq!(report.new_messages, 10);
    let stored = w.counts().await;
    assert_eq!(stored, w.server_counts(), "stored counts per folder differ from doveadm's");
    assert!(stored.iter().any(|(f, n)| f == "Projekte/Ärger/日本語" && *n == 4), "{stored:?}");
    assert_eq!(w.last_error().await, None);
    // A second poll: nothing changed, so no FETCH at all (one STATUS each).
    let before = source.commands();
    conn.poll(Scope::All).await.expect("second poll");
    let after = source.commands();
    assert_eq!(before.get("UID FETCH"), after.get("UID FETCH"), "an unchanged folder cost a FETCH");
    assert_eq!(after["STATUS"] - before.get("STATUS").copied().unwrap_or(0), stored.len() as u64);
    // A new connection: Dovecot offers LIST-STATUS, so one LIST answers
    // every folder's counters; no STATUS, no SELECT, no FETCH.
    let before = source.commands();
    w.connect_with(&source).await.poll(Scope::All).await.expect("poll on a new connection");
    let after = source.commands();
    let sent = |c: &str| after.get(c).copied().unwrap_or(0) - before.get(c).copied().unwrap_or(0);
    assert_eq!((sent("LIST-STATUS"), sent("STATUS"), sent("SELECT"), sent("UID FETCH")), (1, 0, 0, 0), "{after:?}");
    // A change after the LIST-STATUS of a connection's first poll is seen by its next one.
    w.append("Tom &- Jerry", 2, 5);
    let mut conn = w.connect_with(&source).await;
    conn.poll(Scope::All).await.expect("poll");
    assert!(w.counts().await.contains(&("Tom & Jerry".into(), 3)));
}

async fn without_list_status_one_status_per_folder(db: TestDb) {
    let w = world(db, &DovecotOptions::without(&["LIST-STATUS"])).await;
    w.dovecot.create_folders(USER, &TREE).expect("create");
    w.append("Projekte/&AMQ-rger", 3, 2);
    let source = ImapSource::new(w.storage.clone(), ImapSettings::default());
    w.connect_with(&source).await.poll(Scope::All).await.expect("poll");
    let before = source.commands();
    w.connect_with(&source).await.poll(Scope::All).await.expect("poll on a new connection");
    let after = source.commands();
    let sent = |c: &str| after.get(c).copied().unwrap_or(0) - before.get(c).copied().unwrap_or(0);
    let folders = w.counts().await.len() as u64;
    assert_eq!(
        (sent("LIST-STATUS"), sent("LIST"), sent("STATUS"), sent("SELECT"), sent("UID FETCH")),
        (0, 1, folders, 0, 0)
    );
    assert_eq!(w.counts().await, w.server_counts());
}

async fn created_renamed_and_deleted_folders_are_reflected(db: TestDb) {
    let w = world(db, &DovecotOptions::default()).await;
    w.dovecot.create_folders(USER, &["Kunden", "Projekte", "Projekte/Ärger"]).expect("create");
    w.append("Kunden", 5, 1);
    w.append("Projekte/&AMQ-rger", 2, 2);
    let source = ImapSource::new(w.storage.clone(), ImapSettings::default());
    w.connect_with(&source).await.poll(Scope::All).await.expect("poll");
    assert!(w.counts().await.contains(&("Kunden".into(), 5)));

    w.dovecot.doveadm(&["mailbox", "rename", "-u", USER, "Kunden", "Kunden-2024"]).expect("rename");
    w.dovecot.doveadm(&["mailbox", "delete", "-u", USER, "-r", "Projekte"]).expect("delete");
    w.dovecot.create_folders(USER, &["Neu"]).expect("create");
    w.append("Neu", 3, 3);
    w.connect_with(&source).await.poll(Scope::All).await.expect("poll after the changes");
    let stored = w.counts().await;
    let names: Vec<&str> = stored.iter().map(|(f, _)| f.as_str()).collect();
    assert!(!names.contains(&"Kunden"), "the renamed folder kept its rows: {stored:?}");
    assert!(!names.iter().any(|n| n.starts_with("Projekte")), "the deleted folder kept its rows: {stored:?}");
    assert!(stored.contains(&("Kunden-2024".into(), 5)), "{stored:?}");
    assert!(stored.contains(&("Neu".into(), 3)), "{stored:?}");
    assert_eq!(stored, w.server_counts());
    assert_eq!(w.deleted_events("Kunden"), 5, "message.deleted for each message of the renamed folder");
    assert_eq!(w.deleted_events("Projekte/Ärger"), 2, "message.deleted for each message of the deleted folder");
}

async fn past_the_folder_limit_the_status_says_so(db: TestDb) {
    let w = world(db, &DovecotOptions::default()).await;
    w.dovecot.create_folders(USER, &["A1", "A2", "A3", "A4", "A5", "A6", "A7", "A8"]).expect("create");
    let settings = ImapSettings { max_folders: 3, ..ImapSettings::default() };
    let source = ImapSource::new(w.storage.clone(), settings);
    w.connect_with(&source).await.poll(Scope::All).await.expect("poll");
    assert_eq!(w.counts().await.len(), 3, "the limit is not kept");
    let error = w.last_error().await.expect("a status past the limit");
    assert!(error.contains("only the first 3 are synced") && error.contains("IMAP_MAX_FOLDERS"), "{error}");
    assert!(w.counts().await.iter().any(|(f, _)| f == "INBOX"), "INBOX comes first");
}

async fn uidvalidity_reset_on_a_hot_account_is_seen_within_one_idle_reissue(db: TestDb) {
    let w = world(db, &DovecotOptions::default()).await;
    w.append("INBOX", 3, 1);
    let reissue = Duration::from_secs(3);
    let imap = ImapSettings { idle_deadline: Duration::from_secs(2), ..ImapSettings::default() };
    let source = Arc::new(ImapSource::new(w.storage.clone(), imap));
    let settings = RunnerSettings {
        poll_warm: Duration::from_secs(600),
        poll_cold: Duration::from_secs(600),
        idle_reissue: reissue,
        retry_base: Duration::from_secs(1),
        poll_stagger: sync_worker::POLL_STAGGER,
    };
    let runner = RunnerHandle::spawn(
        source,
        w.fence(1),
        Tier::Hot,
        tokio::time::Instant::now() + Duration::from_secs(3600),
        settings,
    );
    let started = Instant::now();
    while w.storage.folder_state(&w.account, "INBOX").await.unwrap().map(|s| s.uidnext) != Some(Some(4)) {
        assert!(started.elapsed() < Duration::from_secs(10), "the watch never polled INBOX");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let old = w.storage.folder_state(&w.account, "INBOX").await.unwrap().expect("state").uidvalidity;
    // Let the watch settle into IDLE, then reset INBOX under it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let new = old.wrapping_add(1000);
    w.dovecot.set_uid_validity(USER, "INBOX", new).expect("reset");
    let reset = Instant::now();
    loop {
        let state = w.storage.folder_state(&w.account, "INBOX").await.unwrap().expect("state");
        if state.uidvalidity == new && w.counts().await.contains(&("INBOX".into(), 3)) {
            break;
        }
        assert!(
            reset.elapsed() < reissue + Duration::from_secs(2),
            "the reset was not seen within one IDLE re-issue ({reissue:?}): {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    runner.stop(Duration::from_secs(1)).await;
}

async fn flags_without_condstore_all_arrive_eventually(db: TestDb) {
    let w = world(db, &DovecotOptions::without(&["CONDSTORE", "QRESYNC"])).await;
    w.dovecot.create_folders(USER, &["Big"]).expect("create");
    w.append("Big", 2000, 1);
    w.append("INBOX", 10, 2);
    let source = ImapSource::new(w.storage.clone(), ImapSettings::default());
    w.connect_with(&source).await.poll(Scope::All).await.expect("initial poll");
    assert!(w.counts().await.contains(&("Big".into(), 2000)));
    // Every message's flags change, the oldest 1,500 far outside the newest-500 rescan.
    w.dovecot.add_flags(USER, "Big", "\\Flagged", &["all"]).expect("flags");
    let folders = w.counts().await.len();
    let mut polls = 0;
    while w.flagged("Big", "\\Flagged").await < 2000 {
        assert!(
            polls < folders,
            "after {polls} polls only {} of 2000 flags synced",
            w.flagged("Big", "\\Flagged").await
        );
        w.connect_with(&source).await.poll(Scope::Special).await.expect("poll");
        polls += 1;
        // Every poll re-reads at least the newest 500.
        assert!(w.flagged("Big", "\\Flagged").await >= 500, "poll {polls} missed the newest 500");
    }
}

/// A server that drops the connection whenever one folder is selected (a
/// message it cannot serve, as pymap does with a bad `Date:`): the poll
/// fails there, and the folders sorted after it still sync, on the next
/// poll, while the broken one waits at the end. Once it heals it syncs too.
async fn a_folder_that_breaks_the_connection_does_not_keep_the_others_from_syncing(db: TestDb) {
    let w = world(db, &DovecotOptions::default()).await;
    w.dovecot.create_folders(USER, &["Aaa kaputt", "Mmm", "Zzz"]).expect("create");
    w.append("INBOX", 2, 1);
    w.append("Aaa kaputt", 3, 2);
    w.append("Mmm", 4, 3);
    w.append("Zzz", 5, 4);
    let proxy = ImapProxy::start(w.dovecot.port()).expect("proxy");
    sqlx::query("UPDATE accounts SET port = $1 WHERE id = $2")
        .bind(i64::from(proxy.port()))
        .bind(w.account.as_str())
        .execute(w.storage.pool())
        .await
        .expect("point the account at the proxy");
    proxy.cut_on(Some("Aaa kaputt"));
    let source = ImapSource::new(w.storage.clone(), ImapSettings::default());
    let stored = |counts: Vec<(String, i64)>, folder: &str| counts.iter().find(|(f, _)| f == folder).map(|(_, n)| *n);
    let first = w.connect_with(&source).await.poll(Scope::All).await;
    assert!(first.is_err(), "the cut connection failed the poll: {first:?}");
    assert_eq!(stored(w.counts().await, "Zzz"), None, "folder order: Aaa kaputt comes before Zzz");
    let second = w.connect_with(&source).await.poll(Scope::All).await;
    assert!(second.is_err(), "the broken folder still fails: {second:?}");
    let counts = w.counts().await;
    assert_eq!((stored(counts.clone(), "Mmm"), stored(counts.clone(), "Zzz")), (Some(4), Some(5)), "{counts:?}");
    assert_eq!(stored(counts.clone(), "INBOX"), Some(2), "{counts:?}");
    assert!(w.last_error().await.is_some_and(|e| e.contains("Aaa kaputt")), "{:?}", w.last_error().await);
    proxy.cut_on(None);
    w.connect_with(&source).await.poll(Scope::All).await.expect("the healed folder syncs");
    assert_eq!(w.counts().await, w.server_counts());
    assert_eq!(w.last_error().await, None);
}

/// A name with `"` or `\\` comes quoted with escapes in the LIST answer; it
/// is stored as the server means it and selected again by that name (it
/// was escaped twice and never found).
async fn names_with_quotes_and_backslashes_are_synced(db: TestDb) {
    let w = world(db, &DovecotOptions::default()).await;
    let names = [r#"Zitat "x""#, r"Back\slash"];
    w.dovecot.create_folders(USER, &names).expect("create");
    for (i, name) in names.iter().enumerate() {
        w.append(name, 2 + i as u64, 7 + i as u64); // the harness quotes the name
    }
    let source = ImapSource::new(w.storage.clone(), ImapSettings::default());
    let mut conn = w.connect_with(&source).await;
    conn.poll(Scope::All).await.expect("poll");
    assert_eq!(w.last_error().await, None);
    let stored = w.counts().await;
    assert!(stored.contains(&(names[0].to_owned(), 2)) && stored.contains(&(names[1].to_owned(), 3)), "{stored:?}");
    assert_eq!(stored, w.server_counts());
    // Unchanged: answered by LIST-STATUS (its names unescaped too), no SELECT.
    let before = source.commands();
    w.connect_with(&source).await.poll(Scope::All).await.expect("second poll");
    assert_eq!(before.get("SELECT"), source.commands().get("SELECT"), "{:?}", source.commands());
}
