//! Whole messages through the API, end to end: awkward mail appended to the
//! private Dovecot by an IMAP client, synced, then read back whole, raw and
//! by attachment, on SQLite and Postgres. What the API shows is held to
//! mail-parser's own reading of the bytes that were appended, whether a
//! part streams from the server or is read from the whole message.

use std::time::{Duration, Instant};

use mail_parser::{MessageParser, PartType};
use reqwest::StatusCode;
use serde_json::Value;
use sync_worker::both_databases;
use sync_worker::testing::TestDb;

mod api_harness;
use api_harness::*;

both_databases!(
    async:
    awkward_mail_is_read_whole_as_mail_parser_reads_it_and_stays_unseen,
    a_20_mb_attachment_comes_back_whole,
    the_cache_keeps_the_most_recently_read_within_its_cap,
    a_message_gone_from_the_server_is_a_404_and_leaves_the_cache,
    an_unreachable_server_is_a_502_and_cached_messages_still_read,
    the_eml_corpus_mail_parser_ships_is_read_whole,
    streamed_attachments_and_raw_are_what_mail_parser_reads,
);

/// Mail that breaks naive readers, each with a subject to find it by.
fn corpus() -> Vec<(&'static str, Vec<u8>)> {
    let head = |subject: &str, extra: &str| {
        format!(
            "From: Carol <carol@example.org>\r\nTo: alice@example.org\r\nSubject: {subject}\r\n\
             Message-ID: <{subject}@example.org>\r\nDate: Tue, 1 Dec 2026 09:00:00 +0000\r\nMIME-Version: 1.0\r\n{extra}"
        )
    };
    let alternative = head("alternative", "Content-Type: multipart/alternative; boundary=\"alt\"\r\n\r\n")
        + "--alt\r\nContent-Type: text/plain; charset=iso-8859-1\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n\
           Gr=FC=DFe, das ist ein sehr langer Satz, der umbrochen =\r\nwird.\r\n\
           --alt\r\nContent-Type: text/html; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\n\
           PHA+R3LDvMOfZTwvcD4=\r\n--alt--\r\n";
    let charsets = head("charsets", "Content-Type: multipart/mixed; boundary=mix\r\n\r\n")
        + "--mix\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nsee attached\r\n\
           --mix\r\nContent-Type: text/plain; charset=koi8-r\r\nContent-Disposition: attachment; filename=\"ru.txt\"\r\n\
           Content-Transfer-Encoding: base64\r\n\r\n8NLJ18XU\r\n\
           --mix\r\nContent-Type: text/plain; charset=shift_jis\r\n\
           Content-Disposition: attachment; filename*=UTF-8''%E6%97%A5%E6%9C%AC.txt\r\n\
           Content-Transfer-Encoding: base64\r\n\r\ngrGC8YLJgr+CzQ==\r\n\
           --mix\r\nContent-Type: application/pdf; name=\"=?UTF-8?B?w7xiZXIucGRm?=\"\r\n\
           Content-Disposition: attachment\r\nContent-Transfer-Encoding: base64\r\n\r\nJVBERi0xLjQKJcOkw7w=\r\n--mix--\r\n";
    let forwarded = head("forwarded", "Content-Type: multipart/mixed; boundary=fw\r\n\r\n")
        + "--fw\r\nContent-Type: text/plain\r\n\r\nFYI, below.\r\n\
           --fw\r\nContent-Type: message/rfc822\r\nContent-Disposition: attachment\r\n\r\n\
           From: dave@example.org\r\nSubject: the original\r\nContent-Type: multipart/mixed; boundary=in\r\n\r\n\
           --in\r\nContent-Type: text/plain\r\n\r\noriginal text\r\n\
           --in\r\nContent-Type: image/gif; name=dot.gif\r\nContent-Transfer-Encoding: base64\r\n\r\n\
           R0lGODlhAQABAAAAACw=\r\n--in--\r\n--fw--\r\n";
    let eight_bit = "From: J\u{f6}rg M\u{fc}ller <jm@example.org>\r\nTo: alice@example.org\r\n\
                     Subject: 8bit caf\u{e9} \u{65e5}\u{672c}\r\nDate: Tue, 1 Dec 2026 09:00:00 +0000\r\n\
                     Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n\
                     K\u{f6}ln \u{2013} na\u{ef}ve\r\n"
        .to_string();
    let broken = head("broken", "Content-Type: multipart/mixed; boundary=b\r\n\r\n")
        + "--b\r\nContent-Type: text/plain\r\nContent-Transfer-Encoding: base64\r\n\r\n!!!not base64@@\r\n\
           --b\r\nContent-Type: text/html; charset=no-such-charset\r\n\r\n<b>never closed";
    vec![
        ("alternative", alternative.into_bytes()),
        ("charsets", charsets.into_bytes()),
        ("forwarded", forwarded.into_bytes()),
        ("8bit café 日本", eight_bit.into_bytes()),
        ("broken", broken.into_bytes()),
    ]
}

/// Appends `mail` to alice's INBOX, adds the account and waits until all is listed: (token, account, listed).
async fn with_mail(s: &Server, mail: &[(&str, Vec<u8>)]) -> (String, String, Vec<Value>) {
    for (_, raw) in mail {
        tokio::task::block_in_place(|| s.dovecot.append("alice", "INBOX", raw)).expect("APPEND");
    }
    let token = s.user("alice@example.org").await;
    let id = s.add_account(&token, "alice").await;
    let listed = s.wait_listed(&token, &id, mail.len()).await;
    (token, id, listed)
}

fn id_of<'a>(listed: &'a [Value], subject: &str) -> &'a str {
    listed.iter().find(|m| m["subject"] == subject).unwrap_or_else(|| panic!("{subject} not listed"))["id"]
        .as_str()
        .expect("an id")
}

async fn awkward_mail_is_read_whole_as_mail_parser_reads_it_and_stays_unseen(db: TestDb) {
    let s = server(db, |_| {}).await;
    let mail = corpus();
    let (token, id, listed) = with_mail(&s, &mail).await;
    for (subject, raw) in &mail {
        let mid = id_of(&listed, subject);
        let (st, m) = s.call("GET", &format!("/v1/accounts/{id}/messages/{mid}"), Some(&token), None).await;
        assert_eq!(st, StatusCode::OK, "{subject}: {m}");
        let parsed = MessageParser::default().parse(raw).expect("mail-parser reads it");
        assert_eq!(m["headers"]["subject"], *subject);
        assert_eq!(m["headers"]["subject"].as_str(), parsed.subject(), "{subject}");
        let from = parsed.from().and_then(|f| f.first()).expect("a sender");
        assert_eq!(m["headers"]["from"][0]["address"].as_str(), from.address(), "{subject}");
        assert_eq!(m["headers"]["from"][0]["name"].as_str(), from.name(), "{subject}");
        let text = m["text"].as_str().unwrap_or_else(|| panic!("{subject}: no text: {m}"));
        if let Some(first) = parsed.body_text(0) {
            assert!(text.starts_with(first.as_ref()), "{subject}: {text:?} vs mail-parser's {first:?}");
        }
        let html_part = parsed.html_body.first().and_then(|i| parsed.part(*i));
        if let Some(PartType::Html(h)) = html_part.map(|p| &p.body) {
            assert!(m["html"].as_str().unwrap().starts_with(h.as_ref()), "{subject}");
        }
        // Every attachment mail-parser sees, decoded the same, under the part number shown.
        let attachments = m["attachments"].as_array().expect("attachments");
        assert_eq!(attachments.len(), parsed.attachments.len(), "{subject}: {m}");
        for (shown, part) in attachments.iter().zip(parsed.attachments()) {
            let path = format!("/v1/accounts/{id}/messages/{mid}/attachments/{}", shown["part"].as_str().unwrap());
            let (st, headers, bytes) = s.get_bytes(&path, &token).await;
            assert_eq!(st, StatusCode::OK, "{subject} {shown}");
            assert_eq!(bytes, part.contents(), "{subject} {shown}");
            assert_eq!(shown["size"].as_u64(), Some(bytes.len() as u64));
            assert_eq!(headers["content-type"].to_str().unwrap(), shown["content_type"].as_str().unwrap());
        }
        // The raw route gives back what was appended, byte for byte.
        let (st, headers, bytes) = s.get_bytes(&format!("/v1/accounts/{id}/messages/{mid}/raw"), &token).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(headers["content-type"], "message/rfc822");
        assert_eq!(bytes, *raw, "{subject}");
    }
    // The awkward cases, named.
    let get = |subject: &str| {
        let path = format!("/v1/accounts/{id}/messages/{}", id_of(&listed, subject));
        let (s, token) = (&s, &token);
        async move { s.call("GET", &path, Some(token), None).await.1 }
    };
    let alt = get("alternative").await;
    assert_eq!(alt["text"], "Grüße, das ist ein sehr langer Satz, der umbrochen wird.");
    assert_eq!(alt["html"], "<p>Grüße</p>");
    let charsets = get("charsets").await;
    let names: Vec<&str> =
        charsets["attachments"].as_array().unwrap().iter().map(|a| a["filename"].as_str().unwrap()).collect();
    assert_eq!(names, ["ru.txt", "日本.txt", "über.pdf"]);
    let (_, headers, ru) =
        s.get_bytes(&format!("/v1/accounts/{id}/messages/{}/attachments/2", id_of(&listed, "charsets")), &token).await;
    assert_eq!(String::from_utf8(ru).unwrap(), "Привет");
    assert_eq!(headers["content-disposition"], "attachment; filename=\"ru.txt\"; filename*=UTF-8''ru.txt");
    let fw = get("forwarded").await;
    assert_eq!(fw["attachments"][0]["content_type"], "message/rfc822");
    assert_eq!(fw["attachments"][0]["part"], "2");
    let eight = get("8bit café 日本").await;
    assert_eq!(eight["headers"]["from"][0]["name"], "Jörg Müller");
    assert_eq!(eight["text"], "Köln – naïve\r\n");
    let broken = get("broken").await;
    assert!(broken["html"].as_str().unwrap().contains("never closed"), "{broken}");

    // Reading set no flag on the server.
    let flags = tokio::task::block_in_place(|| {
        s.dovecot.doveadm(&["fetch", "-u", "alice", "flags", "mailbox", "INBOX", "all"])
    })
    .expect("doveadm fetch");
    assert!(!flags.contains("\\Seen"), "reading marked mail seen: {flags}");
    let (cached, bytes) = s.storage.cached_views(&id).await.expect("cache");
    assert_eq!(cached, mail.len() as u64);
    assert!(bytes > 0);
}

async fn a_20_mb_attachment_comes_back_whole(db: TestDb) {
    use base64::Engine as _;
    let s = server(db, |_| {}).await;
    let data: Vec<u8> = (0..20u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let encoded = base64::engine::general_purpose::STANDARD.encode(&data);
    let mut raw = "From: carol@example.org\r\nTo: alice@example.org\r\nSubject: big\r\nMIME-Version: 1.0\r\n\
                   Content-Type: multipart/mixed; boundary=big\r\n\r\n--big\r\nContent-Type: text/plain\r\n\r\n\
                   twenty megabytes attached\r\n--big\r\nContent-Type: application/octet-stream; name=big.bin\r\n\
                   Content-Disposition: attachment; filename=big.bin\r\nContent-Transfer-Encoding: base64\r\n\r\n"
        .to_string();
    for line in encoded.as_bytes().chunks(76) {
        raw.push_str(std::str::from_utf8(line).unwrap());
        raw.push_str("\r\n");
    }
    raw.push_str("--big--\r\n");
    let (token, id, listed) = with_mail(&s, &[("big", raw.into_bytes())]).await;
    let mid = id_of(&listed, "big");
    let (st, m) = s.call("GET", &format!("/v1/accounts/{id}/messages/{mid}"), Some(&token), None).await;
    assert_eq!(st, StatusCode::OK, "{m}");
    assert_eq!(m["text"], "twenty megabytes attached");
    assert_eq!(m["attachments"][0]["size"], data.len());
    let (st, headers, bytes) = s.get_bytes(&format!("/v1/accounts/{id}/messages/{mid}/attachments/2"), &token).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/octet-stream");
    assert!(headers.get("content-length").is_none(), "the attachment was read whole, not streamed: {headers:?}");
    assert_eq!(bytes.len(), data.len());
    assert!(bytes == data, "the attachment's bytes differ");
}

async fn the_cache_keeps_the_most_recently_read_within_its_cap(db: TestDb) {
    // Room for about two of the views below (each is ~1.5 KB of JSON).
    let s = server(db, |a| a.body_cache_bytes = 3_500).await;
    let mail: Vec<(&str, Vec<u8>)> =
        ["one", "two", "three"].iter().map(|subject| (*subject, padded(subject, 1_000))).collect();
    let (token, id, listed) = with_mail(&s, &mail).await;
    for subject in ["one", "two", "three", "two"] {
        let (st, m) =
            s.call("GET", &format!("/v1/accounts/{id}/messages/{}", id_of(&listed, subject)), Some(&token), None).await;
        assert_eq!(st, StatusCode::OK, "{m}");
        let (n, bytes) = s.storage.cached_views(&id).await.expect("cache");
        assert!(bytes <= 3_500 && n <= 2, "{n} views, {bytes} bytes cached");
    }
    // "one" was least recently used: it went; "two" and "three" stay.
    let cached: Vec<String> = sqlx::query_scalar::<_, i64>("SELECT uid FROM message_views ORDER BY uid")
        .fetch_all(s.storage.pool())
        .await
        .expect("cached uids")
        .iter()
        .map(|uid| listed.iter().find(|m| m["uid"] == *uid).unwrap()["subject"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(cached, ["two", "three"]);
}

fn padded(subject: &str, body: usize) -> Vec<u8> {
    let mut raw = mail(subject);
    raw.extend(std::iter::repeat_n(b'x', body));
    raw.extend_from_slice(b"\r\n");
    raw
}

async fn a_message_gone_from_the_server_is_a_404_and_leaves_the_cache(db: TestDb) {
    let s = server(db, |_| {}).await;
    let inbox = vec![("keep", mail("keep")), ("gone", mail("gone"))];
    let (token, id, listed) = with_mail(&s, &inbox).await;
    let path = format!("/v1/accounts/{id}/messages/{}", id_of(&listed, "gone"));
    let (st, _) = s.call("GET", &path, Some(&token), None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(s.storage.cached_views(&id).await.unwrap().0, 1);
    tokio::task::block_in_place(|| s.dovecot.expunge("alice", "INBOX", &["subject", "gone"])).expect("expunge");
    // What is read from the server answers 404 at once, before the sync
    // has seen the expunge; the cached view goes with the row the sync
    // deletes, within a poll.
    for route in [format!("{path}/raw"), format!("{path}/attachments/1")] {
        let (st, v) = s.call("GET", &route, Some(&token), None).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{route}: {v}");
        assert_eq!(v["error"]["code"], "not_found");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (st, v) = s.call("GET", &path, Some(&token), None).await;
        if st == StatusCode::NOT_FOUND {
            assert_eq!(v["error"]["code"], "not_found");
            break;
        }
        assert_eq!(st, StatusCode::OK, "{v}");
        assert!(Instant::now() < deadline, "the expunged message still reads: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(s.storage.cached_views(&id).await.unwrap().0, 0, "the expunged message's view is still cached");
    let (st, _) =
        s.call("GET", &format!("/v1/accounts/{id}/messages/{}", id_of(&listed, "keep")), Some(&token), None).await;
    assert_eq!(st, StatusCode::OK);
    // A part the message does not have, and a part number that is none.
    let keep = format!("/v1/accounts/{id}/messages/{}", id_of(&listed, "keep"));
    let (st, v) = s.call("GET", &format!("{keep}/attachments/7"), Some(&token), None).await;
    assert_eq!((st, v["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")), "{v}");
    let (st, v) = s.call("GET", &format!("{keep}/attachments/1.MIME"), Some(&token), None).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().starts_with("part:"), "{v}");
}

async fn an_unreachable_server_is_a_502_and_cached_messages_still_read(db: TestDb) {
    let s = server(db, |_| {}).await;
    let inbox = vec![("read-before", mail("read-before")), ("never-read", mail("never-read"))];
    let (token, id, listed) = with_mail(&s, &inbox).await;
    let before = format!("/v1/accounts/{id}/messages/{}", id_of(&listed, "read-before"));
    let (st, first) = s.call("GET", &before, Some(&token), None).await;
    assert_eq!(st, StatusCode::OK);
    tokio::task::block_in_place(|| s.dovecot.stop());
    let (st, v) = s
        .call("GET", &format!("/v1/accounts/{id}/messages/{}", id_of(&listed, "never-read")), Some(&token), None)
        .await;
    assert_eq!(st, StatusCode::BAD_GATEWAY, "{v}");
    assert_eq!(v["error"]["code"], "imap_unavailable");
    assert!(v["error"]["message"].as_str().unwrap().contains(&id), "{v}");
    let (st, again) = s.call("GET", &before, Some(&token), None).await;
    assert_eq!(st, StatusCode::OK, "{again}");
    assert_eq!(again["text"], first["text"]);
}

/// The `.eml` files mail-parser's crate ships for its own tests (RFC
/// examples, third-party and legacy mail, malformed MIME): real mail we did
/// not write, in the registry sources cargo extracted to build this test
/// (the version Cargo.lock names).
fn mail_parser_corpus() -> Vec<(String, Vec<u8>)> {
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.lock")).expect("Cargo.lock");
    let version = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"mail-parser\""))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = \"")))
        .map(|v| v.trim_end_matches('"').to_string())
        .expect("mail-parser in Cargo.lock");
    let home =
        std::env::var("CARGO_HOME").unwrap_or_else(|_| format!("{}/.cargo", std::env::var("HOME").expect("HOME")));
    let root = std::fs::read_dir(format!("{home}/registry/src"))
        .expect("cargo's registry sources")
        .map(|d| d.unwrap().path().join(format!("mail-parser-{version}/resources/eml")))
        .find(|p| p.is_dir())
        .unwrap_or_else(|| panic!("mail-parser {version}'s sources are not under {home}/registry/src"));
    let mut files = Vec::new();
    for dir in std::fs::read_dir(&root).unwrap_or_else(|e| panic!("{}: {e}", root.display())) {
        for f in std::fs::read_dir(dir.unwrap().path()).unwrap() {
            let path = f.unwrap().path();
            if path.extension().is_some_and(|e| e == "eml") {
                let name = path.strip_prefix(&root).unwrap().display().to_string();
                files.push((name, std::fs::read(&path).unwrap()));
            }
        }
    }
    files.sort();
    assert!(files.len() > 100, "only {} .eml files under {}", files.len(), root.display());
    files
}

async fn the_eml_corpus_mail_parser_ships_is_read_whole(db: TestDb) {
    let s = server(db, |_| {}).await;
    let corpus = mail_parser_corpus();
    let mut refused = Vec::new();
    for (name, raw) in &corpus {
        if let Err(e) = tokio::task::block_in_place(|| s.dovecot.append("alice", "INBOX", raw)) {
            refused.push(format!("{name}: {e}"));
        }
    }
    let stored = corpus.len() - refused.len();
    let token = s.user("alice@example.org").await;
    let id = s.add_account(&token, "alice").await;
    let listed = s.wait_listed(&token, &id, stored).await;
    let mut unreadable = Vec::new();
    for m in &listed {
        let mid = m["id"].as_str().unwrap();
        let (st, shown) = s.call("GET", &format!("/v1/accounts/{id}/messages/{mid}"), Some(&token), None).await;
        let (raw_st, _, raw) = s.get_bytes(&format!("/v1/accounts/{id}/messages/{mid}/raw"), &token).await;
        if st != StatusCode::OK || raw_st != StatusCode::OK {
            unreadable.push(format!("uid {}: {st} / raw {raw_st}: {shown}", m["uid"]));
            continue;
        }
        let Some(parsed) = MessageParser::default().parse(&raw) else {
            continue;
        };
        let mut wrong = Vec::new();
        if shown["headers"]["subject"].as_str() != parsed.subject() {
            wrong.push("subject");
        }
        if shown["attachments"].as_array().map(Vec::len) != Some(parsed.attachments.len()) {
            wrong.push("attachments");
        }
        if let Some(first) = parsed.body_text(0) {
            if !shown["text"].as_str().is_some_and(|t| t.starts_with(first.as_ref())) {
                wrong.push("text");
            }
        }
        if shown["text"].is_null() && shown["html"].is_null() && shown["attachments"].as_array().unwrap().is_empty() {
            wrong.push("nothing to show");
        }
        for a in shown["attachments"].as_array().unwrap() {
            let path = format!("/v1/accounts/{id}/messages/{mid}/attachments/{}", a["part"].as_str().unwrap());
            let (st, _, bytes) = s.get_bytes(&path, &token).await;
            if st != StatusCode::OK || bytes.len() as u64 != a["size"].as_u64().unwrap() {
                wrong.push("an attachment");
            }
        }
        if !wrong.is_empty() {
            unreadable.push(format!("uid {} ({:?}): {wrong:?}", m["uid"], parsed.subject()));
        }
    }
    eprintln!(
        "mail-parser's corpus: {} .eml files, {} refused by Dovecot, {} stored and read, {} unreadable",
        corpus.len(),
        refused.len(),
        listed.len(),
        unreadable.len()
    );
    assert!(refused.len() * 10 < corpus.len(), "Dovecot refused many: {refused:#?}");
    assert!(unreadable.is_empty(), "{unreadable:#?}");
}

/// A multipart/mixed message with a base64 and a quoted-printable
/// attachment (line breaks, soft breaks, `=XX`, trailing whitespace and a
/// bare `=` that is no escape, across every chunk boundary there may be).
fn encoded_attachments() -> (Vec<u8>, Vec<u8>) {
    use base64::Engine as _;
    let data: Vec<u8> = (0..300_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    let encoded = base64::engine::general_purpose::STANDARD.encode(&data);
    let mut qp = String::new();
    for i in 0..20_000 {
        qp.push_str(&format!("line {i} caf=C3=A9 =3D a=\r\nsoft break, trailing space  \r\n= not an escape\t \r\n"));
    }
    let mut raw = "From: carol@example.org\r\nTo: alice@example.org\r\nSubject: streamed\r\nMIME-Version: 1.0\r\n\
                   Content-Type: multipart/mixed; boundary=\"s-t-r\"\r\n\r\n--s-t-r\r\nContent-Type: text/plain\r\n\r\n\
                   two attached\r\n--s-t-r\r\nContent-Type: application/octet-stream; name=\"data.bin\"\r\n\
                   Content-Disposition: attachment; filename=\"data.bin\"\r\nContent-Transfer-Encoding: base64\r\n\r\n"
        .to_string();
    for line in encoded.as_bytes().chunks(76) {
        raw.push_str(std::str::from_utf8(line).unwrap());
        raw.push_str("\r\n");
    }
    raw.push_str(
        "--s-t-r\r\nContent-Type: application/x-notes\r\nContent-Disposition: inline; filename*=UTF-8''n%C3%B6tes\r\n\
         Content-Transfer-Encoding: quoted-printable\r\n\r\n",
    );
    raw.push_str(&qp);
    raw.push_str("last line=\r\n--s-t-r--\r\n");
    (raw.into_bytes(), data)
}

async fn streamed_attachments_and_raw_are_what_mail_parser_reads(db: TestDb) {
    // Every message streams its attachments, however small.
    let s = server(db, |a| a.stream_from_bytes = 0).await;
    let (streamed, data) = encoded_attachments();
    let mut mail = corpus();
    mail.push(("streamed", streamed.clone()));
    let (token, id, listed) = with_mail(&s, &mail).await;

    // Before the view is cached, then with it: the same bytes.
    let mid = id_of(&listed, "streamed");
    let parsed = MessageParser::default().parse(&streamed).expect("mail-parser reads it");
    let expected: Vec<&[u8]> = parsed.attachments().map(|p| p.contents()).collect();
    assert_eq!(expected[0], &data[..]);
    for round in ["uncached", "cached"] {
        for (n, want) in [("2", expected[0]), ("3", expected[1])] {
            let (st, headers, bytes) =
                s.get_bytes(&format!("/v1/accounts/{id}/messages/{mid}/attachments/{n}"), &token).await;
            assert_eq!(st, StatusCode::OK, "{round} {n}");
            assert!(bytes == want, "{round} part {n}: {} bytes, mail-parser's {}", bytes.len(), want.len());
            // A decoded part's size is known only at its end: no Content-Length is how it shows it streamed.
            assert!(headers.get("content-length").is_none(), "{round} part {n} was not streamed: {headers:?}");
            if n == "3" {
                assert_eq!(headers["content-type"], "application/x-notes");
                assert_eq!(headers["content-disposition"], "inline; filename=\"n_tes\"; filename*=UTF-8''n%C3%B6tes");
            }
        }
        let (st, m) = s.call("GET", &format!("/v1/accounts/{id}/messages/{mid}"), Some(&token), None).await;
        assert_eq!(st, StatusCode::OK, "{m}");
    }
    let (st, headers, bytes) = s.get_bytes(&format!("/v1/accounts/{id}/messages/{mid}/raw"), &token).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(headers["content-length"].to_str().unwrap(), streamed.len().to_string());
    assert!(bytes == streamed, "the raw message differs");

    // The awkward mail too, each part streamed or (text, a forwarded
    // message) read whole, as mail-parser reads it.
    for (subject, raw) in &mail {
        let mid = id_of(&listed, subject);
        let (st, m) = s.call("GET", &format!("/v1/accounts/{id}/messages/{mid}"), Some(&token), None).await;
        assert_eq!(st, StatusCode::OK, "{subject}: {m}");
        let parsed = MessageParser::default().parse(raw).expect("mail-parser reads it");
        for (shown, part) in m["attachments"].as_array().unwrap().iter().zip(parsed.attachments()) {
            let path = format!("/v1/accounts/{id}/messages/{mid}/attachments/{}", shown["part"].as_str().unwrap());
            let (st, headers, bytes) = s.get_bytes(&path, &token).await;
            assert_eq!(st, StatusCode::OK, "{subject} {shown}");
            assert!(bytes == part.contents(), "{subject} {shown}");
            assert_eq!(headers["content-type"].to_str().unwrap(), shown["content_type"].as_str().unwrap());
        }
        let (st, _, bytes) = s.get_bytes(&format!("/v1/accounts/{id}/messages/{mid}/raw"), &token).await;
        assert_eq!(st, StatusCode::OK);
        assert!(bytes == *raw, "{subject}: the raw message differs");
    }
}
