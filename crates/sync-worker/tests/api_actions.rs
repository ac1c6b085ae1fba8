//! Changing mail through the API, end to end on SQLite and Postgres: the
//! change is made on the private Dovecot (checked there with doveadm) and
//! comes back into SQL and to the WebSocket through the sync.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use sync_worker::both_databases;
use sync_worker::testing::{DovecotOptions, TestDb};

mod api_harness;
use api_harness::*;

both_databases!(
    async:
    seen_flagged_and_keywords_are_set_on_the_server_and_come_back_through_the_sync,
    move_and_delete_land_in_the_right_folder_on_the_server_in_sql_and_on_the_websocket,
    a_server_without_move_moves_by_copy_and_uid_expunge,
    batch_actions_act_on_many_messages_and_say_which_were_not_found,
    an_action_racing_a_server_side_expunge_is_a_404,
    bad_actions_are_a_400_naming_the_field,
);

/// Appends `subjects` to alice's INBOX, adds the account, makes it hot (a
/// WebSocket is open) and waits until all is listed.
async fn hot_inbox(s: &Server, subjects: &[&str]) -> (String, String, Ws, Vec<Value>) {
    for subject in subjects {
        s.append("alice", subject);
    }
    let token = s.user("alice@example.org").await;
    let id = s.add_account(&token, "alice").await;
    let ws = s.ws(&token).await;
    let listed = s.wait_listed(&token, &id, subjects.len()).await;
    s.wait_tier(&token, &id, "hot", Duration::from_secs(10)).await;
    // The first poll stores the folders one by one: a move names a stored one.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, f) = s.call("GET", &format!("/v1/accounts/{id}/folders"), Some(&token), None).await;
        let names: Vec<&str> =
            f.as_array().map(|a| a.iter().filter_map(|f| f["name"].as_str()).collect()).unwrap_or_default();
        if ["Archive", "Trash"].iter().all(|n| names.contains(n)) {
            break;
        }
        assert!(Instant::now() < deadline, "the folders were never all stored: {f}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (token, id, ws, listed)
}

fn id_of(listed: &[Value], subject: &str) -> String {
    listed.iter().find(|m| m["subject"] == subject).unwrap_or_else(|| panic!("{subject} not listed"))["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// `doveadm`'s flags of the message with `subject` in `folder`.
fn server_flags(s: &Server, folder: &str, subject: &str) -> String {
    tokio::task::block_in_place(|| {
        s.dovecot.doveadm(&["fetch", "-u", "alice", "flags", "mailbox", folder, "subject", subject])
    })
    .expect("doveadm fetch")
}

/// Subjects in `folder` on the server.
fn server_subjects(s: &Server, folder: &str) -> Vec<String> {
    let out = tokio::task::block_in_place(|| {
        s.dovecot.doveadm(&["fetch", "-u", "alice", "hdr.subject", "mailbox", folder, "all"])
    })
    .expect("doveadm fetch");
    let mut subjects: Vec<String> =
        out.lines().filter_map(|l| l.strip_prefix("hdr.subject: ")).map(str::to_string).collect();
    subjects.sort();
    subjects
}

/// Waits until `folder` of `account` lists exactly `subjects` (sorted).
async fn wait_folder(s: &Server, token: &str, account: &str, folder: &str, subjects: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, v) =
            s.call("GET", &format!("/v1/accounts/{account}/messages?folder={folder}"), Some(token), None).await;
        let mut got: Vec<&str> = v["messages"]
            .as_array()
            .map(|a| a.iter().filter_map(|m| m["subject"].as_str()).collect())
            .unwrap_or_default();
        got.sort();
        if got == subjects {
            return;
        }
        assert!(Instant::now() < deadline, "{folder} lists {got:?}, not {subjects:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn seen_flagged_and_keywords_are_set_on_the_server_and_come_back_through_the_sync(db: TestDb) {
    let s = server(db, |_| {}).await;
    let (token, id, mut ws, listed) = hot_inbox(&s, &["flag-me"]).await;
    let mid = id_of(&listed, "flag-me");
    let path = format!("/v1/accounts/{id}/messages/{mid}");
    let t0 = Instant::now();
    let (st, v) = s
        .call(
            "PATCH",
            &path,
            Some(&token),
            Some(json!({"seen": true, "flagged": true, "keywords": {"add": ["$Work"]}})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["flags"], json!(["$Work", "\\Flagged", "\\Seen"]));
    let flags = server_flags(&s, "INBOX", "flag-me");
    assert!(flags.contains("\\Seen") && flags.contains("\\Flagged") && flags.contains("$Work"), "{flags}");
    let ev = wait_kind(&mut ws, "message.updated", Duration::from_secs(10)).await.expect("message.updated");
    assert_eq!(ev["id"], mid.as_str());
    eprintln!("PATCH to message.updated: {:?}", t0.elapsed());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, m) = s.call("GET", &path, Some(&token), None).await;
        if m["flags"] == json!(["$Work", "\\Flagged", "\\Seen"]) {
            break;
        }
        assert!(Instant::now() < deadline, "the stored flags never changed: {m}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (st, v) =
        s.call("PATCH", &path, Some(&token), Some(json!({"seen": false, "keywords": {"remove": ["$Work"]}}))).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["flags"], json!(["\\Flagged"]));
    let flags = server_flags(&s, "INBOX", "flag-me");
    assert!(!flags.contains("\\Seen") && !flags.contains("$Work") && flags.contains("\\Flagged"), "{flags}");
}

async fn move_and_delete_land_in_the_right_folder_on_the_server_in_sql_and_on_the_websocket(db: TestDb) {
    let s = server(db, |_| {}).await;
    let (token, id, mut ws, listed) = hot_inbox(&s, &["to-archive", "to-trash", "stays"]).await;
    let archive = id_of(&listed, "to-archive");
    let (st, v) = s
        .call(
            "POST",
            &format!("/v1/accounts/{id}/messages/{archive}/move"),
            Some(&token),
            Some(json!({"folder": "Archive"})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["folder"], "Archive");
    assert_eq!(server_subjects(&s, "Archive"), ["to-archive"]);
    let ev = wait_kind(&mut ws, "message.deleted", Duration::from_secs(10)).await.expect("message.deleted");
    assert_eq!(ev["id"], archive.as_str());
    let mut new_in_archive = None;
    let deadline = Instant::now() + Duration::from_secs(15);
    while new_in_archive.is_none() {
        let ev = wait_kind(&mut ws, "message.new", deadline.saturating_duration_since(Instant::now()))
            .await
            .expect("message.new in Archive");
        if ev["folder"] == "Archive" {
            new_in_archive = Some(ev);
        }
    }
    wait_folder(&s, &token, &id, "Archive", &["to-archive"]).await;

    // Delete moves to Trash; deleting in Trash expunges for good.
    let trash = id_of(&listed, "to-trash");
    let (st, v) = s.call("DELETE", &format!("/v1/accounts/{id}/messages/{trash}"), Some(&token), None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["folder"], "Trash");
    assert_eq!(server_subjects(&s, "Trash"), ["to-trash"]);
    wait_folder(&s, &token, &id, "Trash", &["to-trash"]).await;
    wait_folder(&s, &token, &id, "INBOX", &["stays"]).await;
    let (_, t) = s.call("GET", &format!("/v1/accounts/{id}/messages?folder=Trash"), Some(&token), None).await;
    let in_trash = t["messages"][0]["id"].as_str().unwrap().to_string();
    let (st, v) = s.call("DELETE", &format!("/v1/accounts/{id}/messages/{in_trash}"), Some(&token), None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["folder"], Value::Null);
    assert!(server_subjects(&s, "Trash").is_empty());
    wait_folder(&s, &token, &id, "Trash", &[]).await;
    // Nothing else was touched.
    assert_eq!(server_subjects(&s, "INBOX"), ["stays"]);
}

async fn a_server_without_move_moves_by_copy_and_uid_expunge(db: TestDb) {
    let s = server_with(db, &DovecotOptions::without(&["MOVE"]), |_| {}).await;
    let (token, id, _ws, listed) = hot_inbox(&s, &["copied", "deleted-elsewhere", "kept"]).await;
    // Another client marked a message \Deleted without expunging it: a
    // plain EXPUNGE would take it too; UID EXPUNGE must not.
    tokio::task::block_in_place(|| {
        s.dovecot.add_flags("alice", "INBOX", "\\Deleted", &["subject", "deleted-elsewhere"])
    })
    .expect("flag");
    let mid = id_of(&listed, "copied");
    let (st, v) = s
        .call(
            "POST",
            &format!("/v1/accounts/{id}/messages/{mid}/move"),
            Some(&token),
            Some(json!({"folder": "Archive"})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(server_subjects(&s, "Archive"), ["copied"]);
    assert_eq!(server_subjects(&s, "INBOX"), ["deleted-elsewhere", "kept"]);
    wait_folder(&s, &token, &id, "Archive", &["copied"]).await;
}

async fn batch_actions_act_on_many_messages_and_say_which_were_not_found(db: TestDb) {
    let s = server(db, |_| {}).await;
    let subjects: Vec<String> = (0..6).map(|i| format!("batch-{i}")).collect();
    let refs: Vec<&str> = subjects.iter().map(String::as_str).collect();
    let (token, id, _ws, listed) = hot_inbox(&s, &refs).await;
    let mut ids: Vec<String> = refs.iter().map(|s| id_of(&listed, s)).collect();
    ids.push("bm9wZQ".to_string());
    let actions = format!("/v1/accounts/{id}/messages/actions");
    let (st, v) = s
        .call("POST", &actions, Some(&token), Some(json!({"ids": ids, "action": "update", "update": {"seen": true}})))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 7);
    for r in &results[..6] {
        assert_eq!((r["status"].as_str(), r["flags"].clone()), (Some("ok"), json!(["\\Seen"])), "{r}");
    }
    assert_eq!(results[6]["status"], "not_found");
    for subject in &refs {
        assert!(server_flags(&s, "INBOX", subject).contains("\\Seen"), "{subject}");
    }
    let (st, v) = s
        .call("POST", &actions, Some(&token), Some(json!({"ids": &ids[..3], "action": "move", "folder": "Archive"})))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert!(v["results"].as_array().unwrap().iter().all(|r| r["status"] == "ok" && r["folder"] == "Archive"), "{v}");
    assert_eq!(server_subjects(&s, "Archive"), ["batch-0", "batch-1", "batch-2"]);
    let (st, v) = s.call("POST", &actions, Some(&token), Some(json!({"ids": &ids[3..], "action": "delete"}))).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(server_subjects(&s, "Trash"), ["batch-3", "batch-4", "batch-5"]);
    assert!(server_subjects(&s, "INBOX").is_empty());
    wait_folder(&s, &token, &id, "INBOX", &[]).await;
    wait_folder(&s, &token, &id, "Trash", &["batch-3", "batch-4", "batch-5"]).await;
}

async fn an_action_racing_a_server_side_expunge_is_a_404(db: TestDb) {
    let s = server(db, |_| {}).await;
    let (token, id, _ws, listed) = hot_inbox(&s, &["vanishing"]).await;
    let mid = id_of(&listed, "vanishing");
    tokio::task::block_in_place(|| s.dovecot.expunge("alice", "INBOX", &["subject", "vanishing"])).expect("expunge");
    let path = format!("/v1/accounts/{id}/messages/{mid}");
    for (method, route, body) in [
        ("PATCH", path.clone(), Some(json!({"seen": true}))),
        ("POST", format!("{path}/move"), Some(json!({"folder": "Archive"}))),
        ("DELETE", path.clone(), None),
    ] {
        let (st, v) = s.call(method, &route, Some(&token), body).await;
        assert!(
            st == StatusCode::NOT_FOUND || st == StatusCode::CONFLICT,
            "{method} {route}: {st} {v} (a 404 or 409, never a 500)"
        );
    }
    let (st, v) = s
        .call(
            "POST",
            &format!("/v1/accounts/{id}/messages/actions"),
            Some(&token),
            Some(json!({"ids": [mid], "action": "delete"})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["results"][0]["status"], "not_found");
    assert!(server_subjects(&s, "Trash").is_empty());
}

async fn bad_actions_are_a_400_naming_the_field(db: TestDb) {
    let s = server(db, |_| {}).await;
    let (token, id, _ws, listed) = hot_inbox(&s, &["subject"]).await;
    let mid = id_of(&listed, "subject");
    let path = format!("/v1/accounts/{id}/messages/{mid}");
    let actions = format!("/v1/accounts/{id}/messages/actions");
    let many: Vec<String> = (0..501).map(|_| mid.clone()).collect();
    for (method, route, body, field) in [
        ("PATCH", path.clone(), json!({}), "body"),
        ("PATCH", path.clone(), json!({"seen": 1}), "seen"),
        ("PATCH", path.clone(), json!({"keywords": {"add": ["two words"]}}), "keywords.add[0]"),
        ("POST", format!("{path}/move"), json!({"folder": "Nowhere"}), "folder"),
        ("POST", format!("{path}/move"), json!({}), "folder"),
        ("POST", actions.clone(), json!({"ids": [], "action": "delete"}), "ids"),
        ("POST", actions.clone(), json!({"ids": many, "action": "delete"}), "ids"),
        ("POST", actions.clone(), json!({"ids": [mid], "action": "update"}), "update"),
        (
            "POST",
            actions.clone(),
            json!({"ids": [mid], "action": "update", "update": {"flagged": "x"}}),
            "update.flagged",
        ),
        ("POST", actions.clone(), json!({"ids": [mid], "action": "move", "folder": "Nowhere"}), "folder"),
        ("POST", actions.clone(), json!({"ids": [mid], "action": "explode"}), "action"),
    ] {
        let (st, v) = s.call(method, &route, Some(&token), Some(body.clone())).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{method} {route} {body}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(&format!("{field}:")), "{body}: {message}");
    }
    // Nothing changed on the server.
    assert!(!server_flags(&s, "INBOX", "subject").contains('\\'));
    assert_eq!(server_subjects(&s, "INBOX"), ["subject"]);
}
