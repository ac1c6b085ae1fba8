//! Search through the API (`GET .../messages?q=`), end to end on SQLite
//! (FTS5) and Postgres (tsvector + GIN): mail appended to the private
//! Dovecot in two folders, synced, then found by subject, sender,
//! recipients and preview words, newest first, paged with each match once.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;
use sync_worker::both_databases;
use sync_worker::testing::TestDb;

mod api_harness;
use api_harness::*;

both_databases!(
    async:
    search_finds_by_subject_sender_recipients_and_preview_in_every_folder,
    paging_through_results_gives_each_match_once_newest_first,
    new_and_expunged_mail_is_found_and_forgotten,
    a_database_made_before_the_index_is_indexed_when_opened,
    a_body_search_asks_the_server_and_says_so,
);

/// A message from `from` to `to` with this subject and body, dated `date` (seconds).
fn message(from: &str, to: &str, subject: &str, body: &str) -> Vec<u8> {
    format!(
        "From: {from}\r\nTo: {to}\r\nSubject: {subject}\r\nDate: Tue, 1 Dec 2026 09:00:00 +0000\r\n\
         Content-Type: text/plain; charset=utf-8\r\n\r\n{body}\r\n"
    )
    .into_bytes()
}

const BASE: i64 = 1_796_000_000;

async fn setup(s: &Server, mail: &[(&str, Vec<u8>)]) -> (String, String) {
    for (i, (folder, raw)) in mail.iter().enumerate() {
        tokio::task::block_in_place(|| s.dovecot.append_with("alice", folder, &[], Some(BASE + i as i64 * 60), raw))
            .expect("APPEND");
    }
    let token = s.user("alice@example.org").await;
    let id = s.add_account(&token, "alice").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, a) = s.call("GET", &format!("/v1/accounts/{id}"), Some(&token), None).await;
        let stored: i64 =
            a["folders"].as_array().map(|f| f.iter().filter_map(|f| f["messages"].as_i64()).sum()).unwrap_or(0);
        if stored == mail.len() as i64 {
            return (token, id);
        }
        assert!(Instant::now() < deadline, "only {stored} of {} messages stored: {a}", mail.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The subjects a search finds (one page of up to 500), in order.
async fn found(s: &Server, token: &str, id: &str, query: &str) -> Vec<String> {
    let (st, v) = s.call("GET", &format!("/v1/accounts/{id}/messages?limit=500&{query}"), Some(token), None).await;
    assert_eq!(st, StatusCode::OK, "{query}: {v}");
    v["messages"].as_array().unwrap().iter().map(|m| m["subject"].as_str().unwrap().to_string()).collect()
}

async fn search_finds_by_subject_sender_recipients_and_preview_in_every_folder(db: TestDb) {
    let s = server(db, |_| {}).await;
    let mail = [
        ("INBOX", message("Carol <carol@example.org>", "alice@example.org", "Invoice 42", "Please pay by Friday.")),
        ("INBOX", message("dave@shop.example", "alice@example.org", "Your order", "The invoice is attached.")),
        ("Archive", message("Carol <carol@example.org>", "alice@example.org", "Old invoice", "Paid in full.")),
        ("INBOX", message("Eve <eve@example.net>", "bob@team.example", "Grüße aus Köln", "Bis bald, Jörg")),
        ("Archive", message("Frank <frank@example.org>", "alice@example.org", "Lunch", "Pizza on Friday?")),
    ];
    let (token, id) = setup(&s, &mail).await;
    // Newest first (by date: the later appends).
    assert_eq!(found(&s, &token, &id, "q=invoice").await, ["Old invoice", "Your order", "Invoice 42"]);
    assert_eq!(found(&s, &token, &id, "q=invoice&folder=INBOX").await, ["Your order", "Invoice 42"]);
    assert_eq!(found(&s, &token, &id, "q=carol").await, ["Old invoice", "Invoice 42"]);
    assert_eq!(found(&s, &token, &id, "q=shop.example").await, ["Your order"]);
    assert_eq!(found(&s, &token, &id, "q=team").await, ["Grüße aus Köln"], "by recipient");
    assert_eq!(found(&s, &token, &id, "q=friday").await, ["Lunch", "Invoice 42"], "by preview");
    assert_eq!(found(&s, &token, &id, "q=FRI").await, ["Lunch", "Invoice 42"], "by prefix, any case");
    assert_eq!(found(&s, &token, &id, "q=invoice%20carol").await, ["Old invoice", "Invoice 42"], "every word");
    assert_eq!(found(&s, &token, &id, "q=k%C3%B6ln").await, ["Grüße aus Köln"]);
    assert!(found(&s, &token, &id, "q=nothing-like-this").await.is_empty());
    // Each result's id reads the message.
    let (_, v) = s.call("GET", &format!("/v1/accounts/{id}/messages?q=lunch"), Some(&token), None).await;
    assert_eq!(v["messages"][0]["folder"], "Archive");
    let mid = v["messages"][0]["id"].as_str().unwrap();
    let (st, m) = s.call("GET", &format!("/v1/accounts/{id}/messages/{mid}"), Some(&token), None).await;
    assert_eq!((st, m["headers"]["subject"].as_str()), (StatusCode::OK, Some("Lunch")));
    // Bad queries name the parameter.
    for (query, field) in [("q=%20%3F%21", "q"), ("q=x&cursor=zz", "cursor"), ("q=x&limit=0", "limit")] {
        let (st, v) = s.call("GET", &format!("/v1/accounts/{id}/messages?{query}"), Some(&token), None).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{query}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().starts_with(&format!("{field}:")), "{v}");
    }
}

async fn paging_through_results_gives_each_match_once_newest_first(db: TestDb) {
    let s = server(db, |_| {}).await;
    let mut mail = Vec::new();
    for i in 0..23 {
        let folder = if i % 3 == 0 { "Archive" } else { "INBOX" };
        mail.push((
            folder,
            message("Carol <carol@example.org>", "alice@example.org", &format!("report {i:02}"), "weekly"),
        ));
        mail.push(("INBOX", message("dave@example.org", "alice@example.org", &format!("other {i:02}"), "unrelated")));
    }
    let (token, id) = setup(&s, &mail).await;
    let (mut seen, mut order, mut cursor) = (BTreeSet::new(), Vec::new(), None::<String>);
    let mut pages = 0;
    loop {
        let mut path = format!("/v1/accounts/{id}/messages?q=weekly&limit=5");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let (st, v) = s.call("GET", &path, Some(&token), None).await;
        assert_eq!(st, StatusCode::OK, "{v}");
        pages += 1;
        for m in v["messages"].as_array().unwrap() {
            assert!(seen.insert(m["id"].as_str().unwrap().to_string()), "{m} came twice");
            order.push(m["subject"].as_str().unwrap().to_string());
        }
        match &v["next_cursor"] {
            Value::String(c) => cursor = Some(c.clone()),
            _ => break,
        }
    }
    let expected: Vec<String> = (0..23).rev().map(|i| format!("report {i:02}")).collect();
    assert_eq!(order, expected);
    assert_eq!(pages, 5);
    // The plan for queries that match most mail (walk newest first, check
    // each) pages to the same answers as the one that sorts the matches.
    let terms = vec!["weekly".to_string()];
    for folder in [None, Some("INBOX")] {
        let mut after = None;
        loop {
            let sorted = s.storage.search_messages(&id, folder, &terms, after.as_ref(), 4).await.expect("search");
            let walked = s.storage.search_messages_walking(&id, folder, &terms, after.as_ref(), 4).await.expect("walk");
            assert_eq!(sorted, walked, "{folder:?} after {after:?}");
            match sorted.last() {
                Some((_, c)) if sorted.len() == 4 => after = Some(c.clone()),
                _ => break,
            }
        }
    }
}

async fn new_and_expunged_mail_is_found_and_forgotten(db: TestDb) {
    let s = server(db, |_| {}).await;
    let mail = [("INBOX", message("carol@example.org", "alice@example.org", "first zebra", "x"))];
    let (token, id) = setup(&s, &mail).await;
    assert_eq!(found(&s, &token, &id, "q=zebra").await, ["first zebra"]);
    tokio::task::block_in_place(|| {
        s.dovecot.append_with(
            "alice",
            "INBOX",
            &[],
            Some(BASE + 3600),
            &message("a@b.example", "c@d.example", "second zebra", "y"),
        )
    })
    .expect("APPEND");
    let deadline = Instant::now() + Duration::from_secs(20);
    while found(&s, &token, &id, "q=zebra").await != ["second zebra", "first zebra"] {
        assert!(Instant::now() < deadline, "new mail never found");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::task::block_in_place(|| s.dovecot.expunge("alice", "INBOX", &["subject", "first zebra"])).expect("expunge");
    while found(&s, &token, &id, "q=zebra").await != ["second zebra"] {
        assert!(Instant::now() < deadline, "expunged mail still found");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn a_database_made_before_the_index_is_indexed_when_opened(db: TestDb) {
    let s = server(db, |_| {}).await;
    let mail = [("INBOX", message("carol@example.org", "alice@example.org", "kept from before", "x"))];
    let (token, id) = setup(&s, &mail).await;
    // As a database from before search was: no index at all.
    let drops: &[&str] = match s.storage.kind() {
        sync_worker::storage::DbKind::Sqlite => &[
            "DROP TRIGGER messages_fts_insert",
            "DROP TRIGGER messages_fts_delete",
            "DROP TRIGGER messages_fts_update",
            "DROP TABLE messages_fts",
        ],
        sync_worker::storage::DbKind::Postgres => {
            &["DROP INDEX messages_search", "ALTER TABLE messages DROP COLUMN search"]
        }
    };
    for sql in drops {
        sqlx::query(sqlx::AssertSqlSafe(*sql)).execute(s.storage.pool()).await.expect(sql);
    }
    let reopened = sync_worker::storage::Storage::open(s._db.url(), sync_worker::secret::SecretKey::generate())
        .await
        .expect("reopen");
    let found = reopened.search_messages(&id, None, &["before".to_string()], None, 10).await.expect("search");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].0.subject.as_deref(), Some("kept from before"));
    drop(token);
}

async fn a_body_search_asks_the_server_and_says_so(db: TestDb) {
    let s = server(db, |_| {}).await;
    // The word sits past the stored preview: only the server's search finds it.
    let deep = format!("{} platypus", "filler ".repeat(80));
    let mail = [
        ("INBOX", message("carol@example.org", "alice@example.org", "deep inbox", &deep)),
        ("Archive", message("carol@example.org", "alice@example.org", "deep archive", &deep)),
        ("INBOX", message("dave@example.org", "alice@example.org", "platypus in the subject", "short")),
        ("INBOX", message("dave@example.org", "alice@example.org", "unrelated", "nothing")),
    ];
    let (token, id) = setup(&s, &mail).await;
    let get = |query: &'static str| {
        let (s, token, id) = (&s, &token, &id);
        async move {
            let (st, v) = s.call("GET", &format!("/v1/accounts/{id}/messages?{query}"), Some(token), None).await;
            assert_eq!(st, StatusCode::OK, "{query}: {v}");
            v
        }
    };
    let subjects = |v: &Value| -> Vec<String> {
        v["messages"].as_array().unwrap().iter().map(|m| m["subject"].as_str().unwrap().to_string()).collect()
    };
    let v = get("q=platypus").await;
    assert_eq!(subjects(&v), ["platypus in the subject"]);
    assert_eq!(v["searched_bodies"], false);
    let v = get("q=platypus&body=true").await;
    assert_eq!(subjects(&v), ["platypus in the subject", "deep archive", "deep inbox"]);
    assert_eq!(v["searched_bodies"], true);
    let v = get("q=platypus&body=true&folder=INBOX").await;
    assert_eq!(subjects(&v), ["platypus in the subject", "deep inbox"]);
    // Paged by one cursor, each match once.
    let v = get("q=platypus&body=true&limit=2").await;
    assert_eq!(subjects(&v), ["platypus in the subject", "deep archive"]);
    let cursor = v["next_cursor"].as_str().unwrap();
    let (_, v) = s
        .call(
            "GET",
            &format!("/v1/accounts/{id}/messages?q=platypus&body=true&limit=2&cursor={cursor}"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(subjects(&v), ["deep inbox"]);
    assert_eq!(v["next_cursor"], Value::Null);
    // A plain list has no searched_bodies at all.
    let v = get("folder=INBOX").await;
    assert!(v.get("searched_bodies").is_none(), "{v}");
}
