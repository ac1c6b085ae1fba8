//! TLS against a private Dovecot with `ssl = required` and certificates
//! from a private CA made with openssl: `tls` and `starttls` work with
//! `IMAP_CA_FILE`, and each fails in words without it, with a wrong name,
//! with an expired or a self-signed certificate. And `plain` goes only to
//! loopback addresses unless `IMAP_ALLOW_PLAIN` says otherwise.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpListener};
use std::time::Duration;

use sync_worker::imap::{CaFile, ImapSettings, ImapSource, LoginError, TlsSettings};
use sync_worker::storage::{AccountAuth, Credentials, Security};
use sync_worker::testing::{Dovecot, DovecotOptions, PrivateCa, ServerCert};

const USER: &str = "alice";
const PASSWORD: &str = "secret";

fn settings(ca: Option<&PrivateCa>) -> ImapSettings {
    let tls = match ca {
        Some(ca) => TlsSettings::with_ca_file(Some(&CaFile::load(&ca.ca_file()).unwrap())),
        None => TlsSettings::default(),
    };
    ImapSettings { connect_timeout: Duration::from_secs(15), tls, ..ImapSettings::default() }
}

fn creds(host: &str, port: u16, security: Security) -> Credentials {
    Credentials {
        host: host.into(),
        port,
        security,
        username: USER.into(),
        auth: AccountAuth::Password(PASSWORD.into()),
    }
}

fn dovecot(cert: &ServerCert) -> Dovecot {
    let d = Dovecot::start_with(&DovecotOptions::tls(cert)).unwrap();
    d.add_user(USER, PASSWORD).unwrap();
    d
}

/// Both ways in: TLS from the first byte, and STARTTLS.
fn both(d: &Dovecot, host: &str) -> [Credentials; 2] {
    [creds(host, d.tls_port().unwrap(), Security::Tls), creds(host, d.port(), Security::Starttls)]
}

/// The login check's error, in full, for both ways in; never "could not reach".
async fn refusals(d: &Dovecot, host: &str, settings: &ImapSettings) -> Vec<String> {
    let mut out = Vec::new();
    for c in both(d, host) {
        let e = ImapSource::verify_login(&c, settings).await.expect_err("the login check should fail");
        let text = sync_worker::errors::error_chain(&e);
        assert!(matches!(e, LoginError::Unusable { .. }), "{:?}: {text}", c.security);
        assert!(!text.contains("could not reach"), "{text}");
        out.push(text);
    }
    out
}

#[tokio::test]
async fn tls_and_starttls_work_with_the_ca_file() {
    let ca = PrivateCa::new().unwrap();
    let cert = ca.issue("server", &["IP:127.0.0.1", "DNS:localhost"], 2).unwrap();
    let d = dovecot(&cert);
    for host in ["127.0.0.1", "localhost"] {
        for c in both(&d, host) {
            ImapSource::verify_login(&c, &settings(Some(&ca)))
                .await
                .unwrap_or_else(|e| panic!("{host} {:?}: {}", c.security, sync_worker::errors::error_chain(&e)));
        }
    }
}

#[tokio::test]
async fn without_the_ca_file_the_issuer_is_named() {
    let ca = PrivateCa::new().unwrap();
    let cert = ca.issue("server", &["IP:127.0.0.1"], 2).unwrap();
    let d = dovecot(&cert);
    for text in refusals(&d, "127.0.0.1", &settings(None)).await {
        assert!(text.contains("not trusted") && text.contains("CN=Leasehold Test CA"), "{text}");
        assert!(text.contains("IMAP_CA_FILE"), "{text}");
    }
}

#[tokio::test]
async fn a_wrong_name_is_named() {
    let ca = PrivateCa::new().unwrap();
    let cert = ca.issue("server", &["DNS:mail.example.org"], 2).unwrap();
    let d = dovecot(&cert);
    for text in refusals(&d, "127.0.0.1", &settings(Some(&ca))).await {
        assert!(text.contains("name does not match"), "{text}");
        assert!(text.contains("mail.example.org") && text.contains("127.0.0.1"), "{text}");
    }
}

#[tokio::test]
async fn an_expired_certificate_is_named() {
    let ca = PrivateCa::new().unwrap();
    let cert = ca.issue("server", &["IP:127.0.0.1"], -1).unwrap();
    let d = dovecot(&cert);
    for text in refusals(&d, "127.0.0.1", &settings(Some(&ca))).await {
        assert!(text.contains("the certificate has expired"), "{text}");
    }
}

#[tokio::test]
async fn a_self_signed_certificate_is_named() {
    let ca = PrivateCa::new().unwrap();
    let cert = ca.self_signed("server", &["IP:127.0.0.1"]).unwrap();
    let d = dovecot(&cert);
    for text in refusals(&d, "127.0.0.1", &settings(Some(&ca))).await {
        assert!(text.contains("self-signed") && text.contains("CN=leasehold self-signed"), "{text}");
    }
}

/// This machine's address on its way out: not loopback.
fn outside_address() -> IpAddr {
    for target in ["192.0.2.1:9", "10.255.255.1:9", "8.8.8.8:53"] {
        let Ok(udp) = std::net::UdpSocket::bind("0.0.0.0:0") else { continue };
        // A UDP connect sends nothing: it only picks the route's source address.
        if udp.connect(target).is_ok() {
            if let Ok(addr) = udp.local_addr() {
                if !addr.ip().is_loopback() && !addr.ip().is_unspecified() {
                    return addr.ip();
                }
            }
        }
    }
    panic!("this machine has no address besides loopback: the plain-to-a-non-loopback-address test needs one");
}

/// A plaintext IMAP server on every address that greets and accepts any
/// LOGIN (and LOGOUT), one connection at a time.
fn accepting_server() -> u16 {
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let _ = stream.write_all(b"* OK fake IMAP ready\r\n");
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                let tag = line.split(' ').next().unwrap_or("*").to_string();
                let _ = stream.write_all(format!("{tag} OK done\r\n").as_bytes());
                line.clear();
            }
        }
    });
    port
}

#[tokio::test]
async fn plain_goes_only_to_loopback_unless_allowed() {
    let port = accepting_server();
    let outside = outside_address().to_string();
    let e = ImapSource::verify_login(&creds(&outside, port, Security::Plain), &settings(None)).await.unwrap_err();
    let text = sync_worker::errors::error_chain(&e);
    assert!(matches!(e, LoginError::Unusable { .. }), "{text}");
    assert!(text.contains("only allowed to loopback") && text.contains(&outside), "{text}");
    assert!(text.contains("IMAP_ALLOW_PLAIN"), "{text}");
    // Loopback, in two spellings, is allowed: the tests' own Dovecots use it.
    ImapSource::verify_login(&creds("127.0.0.1", port, Security::Plain), &settings(None)).await.unwrap();
    ImapSource::verify_login(&creds("localhost", port, Security::Plain), &settings(None)).await.unwrap();
    let allowed = ImapSettings { allow_plain: true, ..settings(None) };
    ImapSource::verify_login(&creds(&outside, port, Security::Plain), &allowed).await.unwrap();
}

/// The binary as an operator runs it: the system roots come from
/// `SSL_CERT_FILE`, `IMAP_CA_FILE` adds roots, and a bad `IMAP_CA_FILE`
/// stops the start with words.
#[test]
fn the_binary_honours_ssl_cert_file_and_imap_ca_file() {
    use std::io::Write as _;
    use std::process::Stdio;
    use sync_worker::testing::{sync_worker_command, TestDb, TEST_SECRET_KEY};

    let ca = PrivateCa::new().unwrap();
    let cert = ca.issue("server", &["IP:127.0.0.1"], 2).unwrap();
    let d = dovecot(&cert);
    // Added before any login: Dovecot rereads its passwd-file by mtime.
    d.add_user("bob", PASSWORD).unwrap();
    let db = TestDb::sqlite("tls-cli").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let run = |env: &[(&str, &std::path::Path)], args: &[&str]| {
        let mut c = sync_worker_command(env!("CARGO_BIN_EXE_sync-worker"), dir.path());
        c.args(args).env("DATABASE_URL", db.url()).env("SECRET_KEY", TEST_SECRET_KEY);
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(format!("{PASSWORD}\n").as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, err) = run(&[], &["user", "add", "--email", "ann@example.org"]);
    assert!(ok, "{err}");
    let tls_port = d.tls_port().unwrap().to_string();
    let starttls_port = d.port().to_string();
    let add = |port: &str, security: &str| {
        vec!["account", "add", "--user", "ann@example.org", "--host", "127.0.0.1"]
            .into_iter()
            .chain(["--port", port, "--security", security, "--username", USER])
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let tls = add(&tls_port, "tls");
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    let starttls = add(&starttls_port, "starttls");
    let starttls: Vec<&str> = starttls.iter().map(String::as_str).collect();
    // No CA of ours: refused, and saying why.
    let (ok, err) = run(&[], &tls);
    assert!(!ok && err.contains("not trusted") && err.contains("Leasehold Test CA"), "{err}");
    // A bad IMAP_CA_FILE stops the start.
    let (ok, err) = run(&[("IMAP_CA_FILE", &empty)], &tls);
    assert!(!ok && err.contains("IMAP_CA_FILE") && err.contains("no PEM certificate"), "{err}");
    // SSL_CERT_FILE replaces the system's roots, as for OpenSSL programs.
    let (ok, err) = run(&[("SSL_CERT_FILE", &ca.ca_file())], &tls);
    assert!(ok, "{err}");
    // So does SSL_CERT_DIR, a directory of hash-named certificates.
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    std::fs::copy(ca.ca_file(), certs.join("ca.pem")).unwrap();
    let rehash = std::process::Command::new("openssl").arg("rehash").arg(&certs).status().unwrap();
    assert!(rehash.success(), "openssl rehash {}", certs.display());
    // Another mailbox on the same server (the first add saved alice's).
    let mut bob = tls.clone();
    *bob.last_mut().unwrap() = "bob";
    let (ok, err) = run(&[("SSL_CERT_DIR", &certs)], &bob);
    assert!(ok, "{err}");
    // IMAP_CA_FILE adds to them.
    let (ok, err) = run(&[("IMAP_CA_FILE", &ca.ca_file())], &starttls);
    assert!(ok, "{err}");
}

/// A hot account over TLS from the first byte, on a Dovecot that hands
/// sessions idle for a second to `imap-hibernate`, its INBOX holding 300
/// messages; its runner started, and its first sync waited for.
struct HotTls {
    dovecot: Dovecot,
    storage: sync_worker::storage::Storage,
    account: leasehold_core::LeaseKey,
    runner: sync_worker::RunnerHandle,
    _db: sync_worker::testing::TestDb,
    _ca: PrivateCa,
}

impl HotTls {
    async fn start() -> Self {
        use leasehold_core::{FencingToken, Tier, WorkerId};
        use std::sync::Arc;
        use sync_worker::deadline::LeaseDeadline;
        use sync_worker::storage::{Email, NewAccount};
        use sync_worker::testing::{mail_gen, TestDb};
        use sync_worker::{Fence, RunnerHandle, RunnerSettings};

        let ca = PrivateCa::new().unwrap();
        let cert = ca.issue("server", &["IP:127.0.0.1"], 2).unwrap();
        let options =
            DovecotOptions { hibernate_idle_after: Some(Duration::from_secs(1)), ..DovecotOptions::tls(&cert) };
        let dovecot = Dovecot::start_with(&options).unwrap();
        dovecot.add_user(USER, PASSWORD).unwrap();
        let msgs: Vec<Vec<u8>> = (0..300).map(|i| mail_gen::message(3, i).raw).collect();
        dovecot.append_many(USER, "INBOX", msgs.iter().map(|m| m.as_slice())).unwrap();
        let db = TestDb::sqlite("tls-hot").unwrap();
        let storage = db.open().await.unwrap();
        let user = storage.add_user(&"alice@example.org".parse::<Email>().unwrap()).await.unwrap();
        let account = storage
            .add_account(&NewAccount {
                user: user.id,
                host: "127.0.0.1".into(),
                port: dovecot.tls_port().unwrap(),
                security: Security::Tls,
                username: USER.into(),
                auth: AccountAuth::Password(PASSWORD.into()),
            })
            .await
            .unwrap();
        let fence = Fence {
            account: account.clone(),
            worker: WorkerId::new("w1").unwrap(),
            token: FencingToken(1),
            deadline: LeaseDeadline::unbounded(),
        };
        // Only the INBOX watch acts within a test; it retries after 1 s.
        let runner_settings = RunnerSettings::from(&sync_worker::Config {
            poll_warm: Duration::from_secs(600),
            poll_cold: Duration::from_secs(600),
            idle_reissue: Duration::from_secs(600),
            ..sync_worker::Config::default()
        });
        let runner = RunnerHandle::spawn(
            Arc::new(ImapSource::new(storage.clone(), settings(Some(&ca)))),
            fence,
            Tier::Hot,
            tokio::time::Instant::now() + Duration::from_secs(3600),
            runner_settings,
        );
        let hot = Self { dovecot, storage, account, runner, _db: db, _ca: ca };
        hot.wait_for(300, Duration::from_secs(30), "the first sync over TLS").await;
        hot
    }

    /// INBOX's messages in the database.
    async fn stored(&self) -> u64 {
        match self.storage.folder_state(&self.account, "INBOX").await.unwrap() {
            Some(st) => self.storage.message_count(&self.account, "INBOX", st.uidvalidity).await.unwrap(),
            None => 0,
        }
    }

    async fn wait_for(&self, count: u64, within: Duration, what: &str) {
        let started = std::time::Instant::now();
        while self.stored().await < count {
            assert!(started.elapsed() < within, "{what}: {} of {count} messages after {within:?}", self.stored().await);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until no imap process holds the session: it hibernated.
    async fn hibernated(&self, what: &str) {
        let waited = std::time::Instant::now();
        while self.dovecot.imap_process_count().unwrap() > 0 {
            assert!(waited.elapsed() < Duration::from_secs(10), "{what}: the IDLE never hibernated");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Dovecot's count of logins by the account over TLS so far.
    fn tls_logins(&self) -> usize {
        let log = std::fs::read_to_string(self.dovecot.log_path()).unwrap_or_default();
        log.lines().filter(|l| l.contains(&format!("Login: user=<{USER}>")) && l.contains(", TLS")).count()
    }

    /// Delivers one new message (seed 4, `n`) to INBOX on the server.
    fn deliver(&self, n: u64) {
        let raw = sync_worker::testing::mail_gen::message(4, n).raw;
        self.dovecot.append_many(USER, "INBOX", std::iter::once(raw.as_slice())).unwrap();
    }
}

/// The first sync of 300 messages goes through the TLS connection with its
/// capped send buffer; then, three times, the IDLE hibernates on the server
/// (no imap process is left) and a new message still wakes it and reaches
/// the database within 3 s.
#[tokio::test]
async fn a_hot_account_over_tls_wakes_from_a_hibernated_idle() {
    let hot = HotTls::start().await;
    for round in 0..3u64 {
        hot.hibernated(&format!("round {round}")).await;
        hot.deliver(round);
        hot.wait_for(301 + round, Duration::from_secs(3), &format!("round {round}: new mail")).await;
    }
    hot.runner.stop(Duration::from_secs(1)).await;
}

/// The server's login processes die, and every TLS session with them (seen
/// when one login process outgrew its memory): the hot account connects
/// again on its own, and mail delivered after the drop reaches the
/// database, then its new IDLE hibernates and wakes as before.
#[tokio::test]
async fn a_hot_account_over_tls_comes_back_after_the_servers_login_processes_die() {
    let hot = HotTls::start().await;
    hot.hibernated("before the kill").await;
    let logins = hot.tls_logins();
    assert!(hot.dovecot.kill_login_processes().unwrap() > 0, "no login process to kill");
    hot.deliver(0);
    // The watch retries after about a second (its retry base), then polls.
    hot.wait_for(301, Duration::from_secs(15), "mail delivered after the drop").await;
    // Dovecot's log process may write the login a moment after it happened.
    let looked = std::time::Instant::now();
    while hot.tls_logins() <= logins {
        assert!(
            looked.elapsed() < Duration::from_secs(5),
            "the session was not dropped: no new TLS login after the kill"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    hot.hibernated("after the reconnect").await;
    hot.deliver(1);
    hot.wait_for(302, Duration::from_secs(3), "mail to the new IDLE").await;
    hot.runner.stop(Duration::from_secs(1)).await;
}
