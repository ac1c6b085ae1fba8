//! The web console in a real headless Chromium, against `serve` (API and
//! worker in one process) over a private Dovecot: what a user sees is what
//! the database holds, live, through a first sync, a disconnect and the end
//! of a session.

use std::time::{Duration, Instant};

use serde_json::Value;
use sync_worker::testing::{mail_gen, TestDb};

mod api_harness;
use api_harness::*;
mod browser;
use browser::Browser;

/// Signs `email` up through the page and adds alice's Dovecot account.
async fn sign_up_and_add_alice(b: &Browser, s: &Server, email: &str) {
    b.open(&format!("{}/", s.base)).await;
    b.type_into("#email", email).await;
    b.type_into("#password", USER_PASSWORD).await;
    b.click("#signup").await;
    b.wait_for("return !document.getElementById('app').hidden", Duration::from_secs(10)).await;
    b.type_into("#host", s.dovecot.host()).await;
    // The port follows the security choice.
    b.eval("const s = document.getElementById('security'); s.value = 'plain'; s.dispatchEvent(new Event('change'))")
        .await;
    assert_eq!(b.eval("return document.getElementById('port').value").await, "143");
    b.type_into("#port", &s.dovecot.port().to_string()).await;
    b.type_into("#username", "alice").await;
    b.type_into("#imap-password", IMAP_PASSWORD).await;
    b.click("#add-account").await;
    b.wait_for("return document.querySelector('tr.account')", Duration::from_secs(10)).await;
}

fn page_error() -> &'static str {
    "return document.getElementById('error').textContent"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_an_appended_message_within_2s() {
    let s = server(TestDb::sqlite("console").expect("a test database"), |_| {}).await;
    s.append("alice", "already-there");
    let b = Browser::start().await;
    sign_up_and_add_alice(&b, &s, "alice@example.org").await;
    assert_eq!(b.eval("return document.getElementById('me').textContent").await, "alice@example.org");
    // The account's state in words once synced; tier and owner are details.
    let row = b
        .wait_for(
            "const r = document.querySelector('tr.account'); \
             return r && r.innerText.includes('up to date') ? r.innerText : null",
            Duration::from_secs(20),
        )
        .await;
    assert!(row.as_str().unwrap().contains("alice@127.0.0.1"), "{row}");
    b.click("tr.account").await;
    b.wait_for(
        "return document.getElementById('messages').innerText.includes('already-there')",
        Duration::from_secs(10),
    )
    .await;
    b.wait_for("return document.getElementById('live').textContent === 'live'", Duration::from_secs(5)).await;
    let t0 = Instant::now();
    s.append("alice", "live-in-the-browser");
    b.wait_for(
        "return document.getElementById('messages').rows[0].innerText.includes('live-in-the-browser')",
        Duration::from_secs(2),
    )
    .await;
    eprintln!("the page showed the APPENDed message {:?} after the APPEND", t0.elapsed());
    // The message view: opening marks it read on the server, and its text shows.
    b.click("tr.message").await;
    b.wait_for("return !document.getElementById('view').hidden", Duration::from_secs(10)).await;
    b.wait_for(
        "return document.getElementById('view-body').textContent.includes('Hello, live-in-the-browser')",
        Duration::from_secs(10),
    )
    .await;
    b.screenshot("message-view").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let flags = tokio::task::block_in_place(|| {
            s.dovecot.doveadm(&["fetch", "-u", "alice", "flags", "mailbox", "INBOX", "subject", "live-in-the-browser"])
        })
        .expect("doveadm fetch");
        if flags.contains("\\Seen") {
            break;
        }
        assert!(Instant::now() < deadline, "opening the message never marked it read: {flags}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The counts follow: one of two unread now.
    b.wait_for(
        "return document.getElementById('folder').innerText.includes('INBOX (2, 1 unread)')",
        Duration::from_secs(10),
    )
    .await;
    // Moved to Archive from the view: gone from the list, in Archive on the server and on the page.
    b.eval("document.getElementById('view-folder').value = 'Archive'").await;
    b.click("#view-move").await;
    b.wait_for("return document.getElementById('folder').innerText.includes('Archive (1)')", Duration::from_secs(10))
        .await;
    let archive = tokio::task::block_in_place(|| s.dovecot.mailbox_status("alice", "Archive")).expect("doveadm status");
    assert_eq!(archive.messages, 1, "{archive:?}");
    // Expunged on the server: the row and the count go.
    tokio::task::block_in_place(|| s.dovecot.expunge("alice", "INBOX", &["subject", "already-there"]))
        .expect("expunge");
    b.wait_for(
        "return document.getElementById('folder').innerText.includes('INBOX (0)') && \
                !document.getElementById('messages').innerText.includes('already-there')",
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(b.eval(page_error()).await, "");
}

/// The case: a 3,000-message first sync, watched from the page
/// while it runs. Afterwards the page holds exactly the 3,000 messages, once
/// each; and mail that arrives while the socket is down shows after the
/// reconnect, with no reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_sync_shows_every_message_once_and_a_disconnect_loses_nothing() {
    const N: usize = 3000;
    let s = server(TestDb::sqlite("console_first_sync").expect("a test database"), |_| {}).await;
    let raws: Vec<Vec<u8>> = (0..N as u64).map(|i| mail_gen::message(7, i).raw).collect();
    tokio::task::block_in_place(|| s.dovecot.append_many("alice", "INBOX", raws.iter().map(Vec::as_slice)))
        .expect("APPEND 3,000");
    let b = Browser::start().await;
    sign_up_and_add_alice(&b, &s, "alice@example.org").await;
    b.click("tr.account").await;
    // While it syncs, the page says how far it is (a fast sync may be done
    // before the page looks).
    let seen_progress = b
        .wait_for(
            "const p = document.getElementById('progress').textContent; \
             const f = document.getElementById('folder').innerText; \
             return p || f.includes('INBOX (3000,') ? (p || 'done') : null",
            Duration::from_secs(30),
        )
        .await;
    eprintln!("progress seen on the page: {seen_progress}");
    b.screenshot("first-sync").await;
    b.wait_for(
        "return document.getElementById('progress').textContent === '' && \
                document.getElementById('folder').innerText.includes('INBOX (3000,')",
        Duration::from_secs(90),
    )
    .await;
    // Every page of the list, older and older, each once the list is not
    // busy (a resync after the burst of new mail reloads it meanwhile: CI saw
    // 1,654 of 3,000 rows when the paging began before that reload).
    let deadline = Instant::now() + Duration::from_secs(120);
    b.wait_for(&format!("return {LIST_IDLE}"), Duration::from_secs(30)).await;
    while b.eval("return !document.getElementById('more').hidden").await == true {
        let before = b.eval("return document.querySelectorAll('tr.message').length").await;
        b.click("#more").await;
        // A full last page still has a cursor: its next page is empty.
        b.wait_for(
            &format!(
                "return (document.querySelectorAll('tr.message').length > {before} || \
                 document.getElementById('more').hidden) && {LIST_IDLE}"
            ),
            Duration::from_secs(10),
        )
        .await;
        assert!(Instant::now() < deadline, "paging never ended");
    }
    let (rows, distinct) = counts(&b).await;
    assert_eq!((rows, distinct), (N as u64, N as u64), "rows on the page, distinct ids");

    // The socket goes down; mail arrives meanwhile; it shows after the reconnect.
    b.eval("socket.close()").await;
    s.append("alice", "during-the-outage");
    b.wait_for("return document.getElementById('live').textContent === 'live'", Duration::from_secs(10)).await;
    b.wait_for(
        "return document.getElementById('messages').innerText.includes('during-the-outage')",
        Duration::from_secs(10),
    )
    .await;
    b.wait_for("return document.getElementById('folder').innerText.includes('INBOX (3001,')", Duration::from_secs(10))
        .await;
    // The reload after the reconnect kept the list as deep as it was paged.
    b.wait_for(
        &format!("return document.querySelectorAll('tr.message').length === {}", N + 1),
        Duration::from_secs(10),
    )
    .await;
    let (rows, distinct) = counts(&b).await;
    assert_eq!((rows, distinct), (N as u64 + 1, N as u64 + 1), "rows after the reconnect, distinct ids");
    assert_eq!(b.eval(page_error()).await, "");
}

/// The message list has no reload scheduled and no load running.
const LIST_IDLE: &str = "document.getElementById('message-list').getAttribute('aria-busy') === 'false'";

async fn counts(b: &Browser) -> (u64, u64) {
    let v: Value = b
        .eval(
            "const ids = [...document.querySelectorAll('tr.message')].map(r => r.dataset.id); \
             return [ids.length, new Set(ids).size]",
        )
        .await;
    (v[0].as_u64().unwrap(), v[1].as_u64().unwrap())
}

/// A unicode address signs up and logs in again; logout leaves nothing of
/// the user on the page; a session ended elsewhere (another tab's logout)
/// closes the page's socket and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_start_and_end_cleanly_for_any_address() {
    let s = server(TestDb::sqlite("console_sessions").expect("a test database"), |_| {}).await;
    s.append("alice", "private-subject");
    let b = Browser::start().await;
    let email = "jörg@exämple.org";
    sign_up_and_add_alice(&b, &s, email).await;
    b.click("tr.account").await;
    b.wait_for(
        "return document.getElementById('messages').innerText.includes('private-subject')",
        Duration::from_secs(20),
    )
    .await;
    b.screenshot("accounts-and-mail").await;
    // At 400 px the page fits its width: no sideways scrolling.
    b.cmd("POST", "/window/rect", serde_json::json!({"width": 400, "height": 900})).await;
    let fits = b
        .wait_for(
            "const e = document.documentElement; \
             return window.innerWidth <= 420 ? [e.scrollWidth, e.clientWidth] : null",
            Duration::from_secs(5),
        )
        .await;
    b.screenshot("narrow").await;
    assert!(fits[0].as_u64() <= fits[1].as_u64(), "at 400 px the page is {} px wide", fits[0]);
    b.click("#logout").await;
    b.wait_for("return !document.getElementById('login-section').hidden", Duration::from_secs(5)).await;
    let left = b
        .eval(
            "return ['accounts', 'messages', 'me', 'mail-account', 'folder'] \
             .map(id => document.getElementById(id).textContent).join('')",
        )
        .await;
    assert_eq!(left, "", "the last user's data stays on the page");
    b.type_into("#email", email).await;
    b.type_into("#password", USER_PASSWORD).await;
    b.click("#login").await;
    b.wait_for("return !document.getElementById('app').hidden", Duration::from_secs(10)).await;
    assert_eq!(b.eval("return document.getElementById('me').textContent").await, email);
    b.wait_for("return document.getElementById('live').textContent === 'live'", Duration::from_secs(5)).await;

    // The same session logged out from elsewhere (its token, from the page).
    let token = b.eval("return sessionStorage.getItem('token')").await;
    let (st, _) = s.call("POST", "/v1/logout", Some(token.as_str().unwrap()), None).await;
    assert_eq!(st.as_u16(), 204);
    b.wait_for(
        "return document.getElementById('status').textContent.includes('session ended')",
        Duration::from_secs(2),
    )
    .await;
    assert!(b.eval("return document.getElementById('app').hidden").await == true);
}
