//! How accounts log in, against a private Dovecot: a password goes as
//! AUTHENTICATE PLAIN (in one round trip with SASL-IR, and also where the
//! server says LOGINDISABLED), and an OAuth2 account logs in with
//! OAUTHBEARER or XOAUTH2, using access tokens from a token endpoint in
//! the test that Dovecot's own `oauth2` passdb validates. Tokens are
//! refreshed before they expire, a rotated refresh token is stored, and a
//! revoked one fails once, in words, and is not tried again until the
//! account's login is updated.

use std::io::{BufRead, BufReader, Write};
use std::time::Duration;

use sync_worker::errors::SourceError;
use sync_worker::imap::{ImapSettings, ImapSource, LoginError};
use sync_worker::oauth2::OAuth2Grant;
use sync_worker::source::{MailSource, Scope};
use sync_worker::storage::{AccountAuth, Credentials, Security};
use sync_worker::testing::{
    mail_gen, sync_worker_command, Dovecot, DovecotOAuth2, DovecotOptions, ImapProxy, ImapWorld, OAuthServer, TestDb,
    OAUTH_CLIENT_ID, OAUTH_CLIENT_SECRET, TEST_SECRET_KEY,
};

const USER: &str = ImapWorld::USER;

fn password_login(port: u16) -> Credentials {
    Credentials {
        host: "127.0.0.1".into(),
        port,
        security: Security::Plain,
        username: USER.into(),
        auth: AccountAuth::Password(ImapWorld::PASSWORD.into()),
    }
}

fn grant(oauth: &OAuthServer, refresh_token: String) -> OAuth2Grant {
    OAuth2Grant::new(
        oauth.token_url(),
        OAUTH_CLIENT_ID.into(),
        Some(OAUTH_CLIENT_SECRET.into()),
        refresh_token,
        Some("mail".into()),
    )
    .expect("a valid grant")
}

fn oauth_dovecot(oauth: &OAuthServer, mechanisms: &str) -> DovecotOptions {
    let oauth2 = DovecotOAuth2 { mechanisms: mechanisms.into(), ..DovecotOAuth2::new(oauth.introspection_url()) };
    DovecotOptions { oauth2: Some(oauth2), ..DovecotOptions::default() }
}

/// The mechanisms of alice's OAuth2 logins, from Dovecot's log (its
/// `Login: user=<alice>, method=...` lines; the harness's own appends log
/// in with PLAIN).
fn login_methods(dovecot: &Dovecot) -> Vec<String> {
    let log = std::fs::read_to_string(dovecot.log_path()).unwrap_or_default();
    log.lines()
        .filter(|l| l.contains("imap-login: Info: Login: user=<alice>"))
        .filter_map(|l| l.split("method=").nth(1).and_then(|m| m.split(',').next()).map(str::to_string))
        .filter(|m| m != "PLAIN")
        .collect()
}

#[tokio::test]
async fn a_password_goes_as_authenticate_plain_in_one_round_trip() {
    let dovecot = Dovecot::start().unwrap();
    dovecot.add_user(USER, ImapWorld::PASSWORD).unwrap();
    let proxy = ImapProxy::start(dovecot.port()).unwrap();
    ImapSource::verify_login(&password_login(proxy.port()), &ImapSettings::default()).await.expect("the login works");
    let commands = proxy.commands();
    let first = commands.first().expect("a command was sent");
    // Dovecot's greeting carries its CAPABILITY: no round trip to ask.
    assert_eq!(first.verb, "AUTHENTICATE", "{commands:?}");
    // The credentials went in the command itself (SASL-IR); the proxy hides them.
    assert!(first.line.ends_with("AUTHENTICATE PLAIN <initial response>"), "{}", first.line);
    assert_eq!(proxy.count("LOGIN"), 0, "{commands:?}");
    assert_eq!(proxy.count("CAPABILITY"), 0, "{commands:?}");
}

#[tokio::test]
async fn a_server_saying_logindisabled_gets_authenticate_plain_without_sasl_ir() {
    let options = DovecotOptions {
        hidden_capabilities: vec!["SASL-IR".into()],
        extra_capabilities: vec!["LOGINDISABLED".into()],
        ..DovecotOptions::default()
    };
    let dovecot = Dovecot::start_with(&options).unwrap();
    dovecot.add_user(USER, ImapWorld::PASSWORD).unwrap();
    let proxy = ImapProxy::start(dovecot.port()).unwrap();
    ImapSource::verify_login(&password_login(proxy.port()), &ImapSettings::default()).await.expect("the login works");
    let commands = proxy.commands();
    assert!(commands.iter().any(|c| c.line.ends_with("AUTHENTICATE PLAIN")), "{commands:?}");
    assert_eq!(proxy.count("LOGIN"), 0, "LOGIN sent to a server that disables it: {commands:?}");
    // A wrong password there is the server's refusal, as with LOGIN.
    let mut wrong = password_login(proxy.port());
    wrong.auth = AccountAuth::Password("wrong".into());
    match ImapSource::verify_login(&wrong, &ImapSettings::default()).await {
        Err(LoginError::Refused { answer }) => assert!(answer.contains("AUTHENTICATIONFAILED"), "{answer}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A server that offers no mechanism for the secret: the error says what
/// it offers, and no secret is sent.
#[tokio::test]
async fn a_server_offering_no_usable_mechanism_is_refused_in_words_with_no_secret_sent() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let mut received = Vec::new();
        for _ in 0..2 {
            let (mut conn, _) = listener.accept().unwrap();
            conn.write_all(b"* OK [CAPABILITY IMAP4rev1 LOGINDISABLED AUTH=GSSAPI] ready\r\n").unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut reader = BufReader::new(conn);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {}
            received.push(line);
        }
        received
    });
    let mut oauth_login = password_login(port);
    let g = OAuth2Grant::new("http://127.0.0.1:9/token".into(), "c".into(), None, "r".into(), None).unwrap();
    oauth_login.auth = AccountAuth::OAuth2(g);
    let e = ImapSource::verify_login(&password_login(port), &ImapSettings::default()).await.unwrap_err();
    let text = sync_worker::errors::error_chain(&e);
    assert!(text.contains("LOGINDISABLED") && text.contains("AUTH=GSSAPI"), "{text}");
    assert!(matches!(e, LoginError::Unusable { .. }), "{text}");
    // No token endpoint is up at port 9: the token fetch fails first, in words, before any connection.
    let e = ImapSource::verify_login(&oauth_login, &ImapSettings::default()).await.unwrap_err();
    let text = sync_worker::errors::error_chain(&e);
    assert!(text.contains("could not reach the OAuth2 token endpoint"), "{text}");
    // Unblock the second accept.
    drop(std::net::TcpStream::connect(("127.0.0.1", port)));
    let received = server.join().unwrap();
    assert!(!received[0].contains(ImapWorld::PASSWORD), "the password was sent: {received:?}");
}

async fn oauth_world(db: TestDb, oauth: &OAuthServer, mechanisms: &str) -> ImapWorld {
    let g = grant(oauth, oauth.grant(USER));
    let w = ImapWorld::start_with_auth(db, &oauth_dovecot(oauth, mechanisms), AccountAuth::OAuth2(g)).await;
    w.append("INBOX", 3, 7);
    w
}

sync_worker::both_databases!(
    async:
    an_oauth2_account_syncs_with_oauthbearer_and_refreshes_before_expiry,
    a_revoked_refresh_token_fails_once_in_words_and_waits_for_an_update,
    a_rotated_refresh_token_is_stored_for_the_next_process
);

async fn an_oauth2_account_syncs_with_oauthbearer_and_refreshes_before_expiry(db: TestDb) {
    let oauth = OAuthServer::start(Duration::from_secs(4)).unwrap();
    let w = oauth_world(db, &oauth, "oauthbearer xoauth2").await;
    let source = w.source();
    for token in 1..=2 {
        let mut conn = source.connect(&w.fence(token)).await.unwrap_or_else(|e| panic!("connect: {e:?}"));
        conn.poll(Scope::Inbox).await.expect("poll");
    }
    assert_eq!(w.storage.folder_counts(w.account.as_str()).await.unwrap()[0].messages, 3);
    assert_eq!(oauth.issued(), 1, "the second connection reuses the token");
    assert_eq!(login_methods(&w.dovecot), ["OAUTHBEARER", "OAUTHBEARER"], "{}", w.dovecot.log_tail());
    // 4 s tokens are renewed at 3 s: the next login has a new one, checked by Dovecot.
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    w.append("INBOX", 2, 8);
    let mut conn = source.connect(&w.fence(3)).await.unwrap_or_else(|e| panic!("connect after renewal: {e:?}"));
    conn.poll(Scope::Inbox).await.expect("poll");
    assert_eq!(oauth.issued(), 2, "renewed before it expired");
    assert_eq!(w.storage.folder_counts(w.account.as_str()).await.unwrap()[0].messages, 5);
    assert_eq!(oauth.refused_refreshes(), 0);
    assert_eq!(w.last_error().await, None);

    // XOAUTH2 where OAUTHBEARER is not offered.
    let oauth = OAuthServer::start(Duration::from_secs(60)).unwrap();
    let w = oauth_world(TestDb::sqlite("oauth").unwrap(), &oauth, "xoauth2").await;
    let mut conn = w.source().connect(&w.fence(1)).await.unwrap_or_else(|e| panic!("connect: {e:?}"));
    conn.poll(Scope::Inbox).await.expect("poll");
    assert_eq!(login_methods(&w.dovecot), ["XOAUTH2"]);
}

async fn a_revoked_refresh_token_fails_once_in_words_and_waits_for_an_update(db: TestDb) {
    let oauth = OAuthServer::start(Duration::from_secs(60)).unwrap();
    let w = oauth_world(db, &oauth, "oauthbearer xoauth2").await;
    oauth.revoke_all_of(USER);
    let source = w.source();
    match source.connect(&w.fence(1)).await {
        Err(SourceError::Auth { next_attempt_ms: None, answer, .. }) => {
            assert!(answer.contains("invalid_grant") && answer.contains("authorize the account again"), "{answer}")
        }
        Err(other) => panic!("expected a final refusal, got {other:?}"),
        Ok(_) => panic!("a revoked grant logged in"),
    }
    let last_error = w.last_error().await.expect("last_error is set");
    assert!(last_error.contains("authentication failed") && last_error.contains("account update"), "{last_error}");
    // No retry loop: nothing is sent, to the token endpoint or to the server.
    for token in 2..=4 {
        match source.connect(&w.fence(token)).await {
            Err(SourceError::LoginGivenUp { .. }) => {}
            Err(other) => panic!("expected no more attempts, got {other:?}"),
            Ok(_) => panic!("a revoked grant logged in"),
        }
    }
    assert_eq!((oauth.refreshes(), oauth.refused_refreshes()), (1, 1));
    assert!(login_methods(&w.dovecot).is_empty());
    // The user authorized again: the account update's new grant logs in at once.
    let mut login = w.storage.credentials(&w.account).await.unwrap();
    login.auth = AccountAuth::OAuth2(grant(&oauth, oauth.grant(USER)));
    w.storage.update_login(&w.account, &login, None).await.unwrap();
    let mut conn = source.connect(&w.fence(5)).await.unwrap_or_else(|e| panic!("connect after the update: {e:?}"));
    conn.poll(Scope::Inbox).await.expect("poll");
    assert_eq!(w.storage.folder_counts(w.account.as_str()).await.unwrap()[0].messages, 3);
}

async fn a_rotated_refresh_token_is_stored_for_the_next_process(db: TestDb) {
    let oauth = OAuthServer::start(Duration::from_secs(60)).unwrap();
    oauth.set_rotation(true);
    let w = oauth_world(db, &oauth, "oauthbearer").await;
    let AccountAuth::OAuth2(before) = w.storage.credentials(&w.account).await.unwrap().auth else { panic!() };
    let mut conn = w.source().connect(&w.fence(1)).await.unwrap_or_else(|e| panic!("connect: {e:?}"));
    conn.poll(Scope::Inbox).await.expect("poll");
    let AccountAuth::OAuth2(after) = w.storage.credentials(&w.account).await.unwrap().auth else { panic!() };
    assert_ne!(before.refresh_token, after.refresh_token, "the rotated token is stored");
    // A new process (no kept tokens) refreshes with the stored one: the old one is retired.
    let fresh = ImapSource::new(w.storage.clone(), ImapSettings::default());
    let mut conn = fresh.connect(&w.fence(2)).await.unwrap_or_else(|e| panic!("connect in a new process: {e:?}"));
    conn.poll(Scope::Inbox).await.expect("poll");
    assert_eq!(oauth.refused_refreshes(), 0);
}

/// `account add --auth oauth2` as an operator runs it: the refresh token
/// and the client secret from the environment, the login checked first.
#[test]
fn the_cli_adds_an_oauth2_account_and_refuses_a_bad_one() {
    let oauth = OAuthServer::start(Duration::from_secs(60)).unwrap();
    let dovecot = Dovecot::start_with(&oauth_dovecot(&oauth, "oauthbearer xoauth2")).unwrap();
    dovecot.add_user(USER, ImapWorld::PASSWORD).unwrap();
    dovecot.append(USER, "INBOX", &mail_gen::message(1, 1).raw).unwrap();
    let db = TestDb::sqlite("oauth").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = dovecot.port().to_string();
    let run = |args: &[&str], refresh_token: &str| {
        let mut c = sync_worker_command(env!("CARGO_BIN_EXE_sync-worker"), dir.path());
        c.args(args)
            .env("DATABASE_URL", db.url())
            .env("SECRET_KEY", TEST_SECRET_KEY)
            .env("OAUTH2_REFRESH_TOKEN", refresh_token)
            .env("OAUTH2_CLIENT_SECRET", OAUTH_CLIENT_SECRET)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run sync-worker")
    };
    let out = run(&["user", "add", "--email", "alice@example.org"], "");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let token_url = oauth.token_url();
    let add = [
        "account",
        "add",
        "--user",
        "alice@example.org",
        "--host",
        "127.0.0.1",
        "--port",
        &port,
        "--security",
        "plain",
        "--username",
        USER,
        "--auth",
        "oauth2",
        "--oauth2-token-url",
        &token_url,
        "--oauth2-client-id",
        OAUTH_CLIENT_ID,
    ];
    let out = run(&add, "rt-not-issued");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("invalid_grant") && stderr.contains("nothing saved"), "{stderr}");
    let refresh_token = oauth.grant(USER);
    let out = run(&add, &refresh_token);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let log = std::fs::read_to_string(dovecot.log_path()).unwrap();
    assert!(log.contains("method=OAUTHBEARER"), "{log}");
    // The refresh token is stored encrypted.
    let raw = std::fs::read(db.sqlite_file().unwrap()).unwrap();
    assert!(!raw.windows(refresh_token.len()).any(|w| w == refresh_token.as_bytes()), "stored in the clear");
}
