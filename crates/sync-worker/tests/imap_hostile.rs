//! Hostile and broken servers cost little: small fake servers (a thread
//! with a std TcpListener) send an endless greeting, a 4 MiB line, a flood
//! of untagged responses, a 100 MiB literal, random bytes, or another
//! protocol's banner. Each must end in an error that says what happened in
//! words, after a few MiB at most, and cost the client well under a second
//! of CPU, measured on the client's own thread (the server runs on
//! another). The bound is a fault bound, not a benchmark.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use sync_worker::imap::{ImapSettings, ImapSource, LoginError};
use sync_worker::storage::{AccountAuth, Credentials, Security};

/// CPU time (user + system) of the calling thread.
fn thread_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a whole rusage into the pointer it is given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage: {}", std::io::Error::last_os_error());
    // SAFETY: getrusage succeeded, so the struct is initialised.
    let u = unsafe { usage.assume_init() };
    let tv = |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// What a fake server does with one connection.
type Script = fn(&mut TcpStream, &mut BufReader<TcpStream>) -> std::io::Result<()>;

/// A fake server on loopback running `script` for each connection.
fn fake_server(script: Script) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            // The client hanging up ends the script with an error: expected.
            let _ = script(&mut stream, &mut reader);
        }
    });
    port
}

/// Writes `chunk` until the client hangs up.
fn forever(s: &mut TcpStream, chunk: &[u8]) -> std::io::Result<()> {
    loop {
        s.write_all(chunk)?;
    }
}

/// Reads the client's next command and returns its tag.
fn command(r: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    Ok(line.split(' ').next().unwrap_or("*").to_string())
}

fn creds(port: u16) -> Credentials {
    Credentials {
        host: "127.0.0.1".into(),
        port,
        security: Security::Plain,
        username: "u".into(),
        auth: AccountAuth::Password("p".into()),
    }
}

/// Runs the login check against `script` on this thread; the error's words
/// and the CPU this thread spent.
fn check(script: Script) -> (String, Duration) {
    let port = fake_server(script);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let settings = ImapSettings { connect_timeout: Duration::from_secs(20), ..ImapSettings::default() };
    let before = thread_cpu();
    let r = rt.block_on(ImapSource::verify_login(&creds(port), &settings));
    let spent = thread_cpu() - before;
    let e = r.expect_err("a hostile server must not pass the login check");
    assert!(matches!(e, LoginError::Unusable { .. }), "{e:?}");
    let text = sync_worker::errors::error_chain(&e);
    eprintln!("client CPU {spent:?}: {text}");
    // Words, never async-imap's or nom's dumps.
    assert!(!text.contains("input: [") && !text.contains("Error {") && !text.contains("code: "), "{text}");
    assert!(spent < Duration::from_secs(1), "the client spent {spent:?} of CPU: {text}");
    (text, spent)
}

#[test]
fn an_endless_greeting_is_cut_at_the_line_limit() {
    let (text, _) = check(|s, _| {
        s.write_all(b"* OK ")?;
        forever(s, &[b'a'; 64 << 10])
    });
    assert!(text.contains("response line longer than 65536 bytes"), "{text}");
}

#[test]
fn a_4_mib_line_is_cut_at_the_line_limit() {
    let (text, _) = check(|s, _| {
        let mut line = b"* OK ".to_vec();
        line.extend(std::iter::repeat_n(b'x', 4 << 20));
        line.extend_from_slice(b"\r\n");
        s.write_all(&line)
    });
    assert!(text.contains("response line longer than"), "{text}");
}

#[test]
fn a_flood_of_untagged_responses_is_cut_after_a_mib() {
    let (text, _) = check(|s, r| {
        s.write_all(b"* OK ready\r\n")?;
        command(r)?;
        forever(s, &b"* OK still here\r\n".repeat(4096))
    });
    assert!(text.contains("more than 1048576 bytes without being asked"), "{text}");
}

#[test]
fn a_100_mib_literal_is_refused_before_it_is_read() {
    let (text, _) = check(|s, r| {
        s.write_all(b"* OK ready\r\n")?;
        command(r)?;
        s.write_all(b"* CAPABILITY {104857600}\r\n")?;
        forever(s, &[b'x'; 64 << 10])
    });
    assert!(text.contains("literal of 104857600 bytes"), "{text}");
}

#[test]
fn random_bytes_are_not_imap() {
    let (text, _) = check(|s, _| {
        // xorshift: the same bytes every run, with NULs, CRs and LFs among them.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let bytes: Vec<u8> = (0..(8 << 20))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        s.write_all(&bytes)
    });
    assert!(text.contains("does not speak IMAP") || text.contains("longer than"), "{text}");
}

#[test]
fn another_protocols_banner_is_quoted_in_words() {
    let (text, _) = check(|s, r| {
        s.write_all(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")?;
        let _ = command(r);
        Ok(())
    });
    assert!(text.contains("does not speak IMAP") && text.contains("\"SSH-2.0-OpenSSH_9.2p1 Debian-2\""), "{text}");
    let (text, _) = check(|s, _| s.write_all(b"220 smtp.example.org ESMTP ready\r\n"));
    assert!(text.contains("does not speak IMAP") && text.contains("220 smtp.example.org ESMTP"), "{text}");
}

#[test]
fn a_bye_greeting_is_the_servers_own_words() {
    let (text, _) = check(|s, _| s.write_all(b"* BYE Too many connections from your IP\r\n"));
    assert!(text.contains("ended the connection during the greeting: Too many connections"), "{text}");
}

/// A logged-in session (the engine's, as a worker runs it) whose server
/// answers LIST with an endless line, or floods it with long lines: the
/// poll fails in words, within the CPU bound, and the error is recorded.
fn logged_in_check(script: Script) -> (String, Duration) {
    use leasehold_core::{FencingToken, WorkerId};
    use sync_worker::storage::{Email, NewAccount};
    use sync_worker::testing::TestDb;
    use sync_worker::{Fence, MailSource, Scope};

    let port = fake_server(script);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let db = TestDb::sqlite("hostile").unwrap();
        let storage = db.open().await.unwrap();
        let user = storage.add_user(&"ann@example.org".parse::<Email>().unwrap()).await.unwrap();
        let c = creds(port);
        let account = storage
            .add_account(&NewAccount {
                user: user.id,
                host: c.host,
                port,
                security: c.security,
                username: c.username,
                auth: c.auth,
            })
            .await
            .unwrap();
        let fence = Fence {
            account,
            worker: WorkerId::new("w1").unwrap(),
            token: FencingToken(1),
            deadline: sync_worker::deadline::LeaseDeadline::unbounded(),
        };
        let source = ImapSource::new(storage.clone(), ImapSettings::default());
        let before = thread_cpu();
        let mut conn = source.connect(&fence).await.unwrap_or_else(|e| panic!("connect: {e}"));
        let e = conn.poll(Scope::Special).await.expect_err("a hostile LIST must fail the poll");
        let spent = thread_cpu() - before;
        let text = sync_worker::errors::error_chain(&e);
        eprintln!("client CPU {spent:?}: {text}");
        assert!(!text.contains("input: [") && !text.contains("Error {") && !text.contains("code: "), "{text}");
        assert!(spent < Duration::from_secs(1), "the client spent {spent:?} of CPU: {text}");
        (text, spent)
    })
}

/// Greets (offering LOGIN), accepts LOGIN, answers CAPABILITY; returns at
/// the next command.
fn log_in(s: &mut TcpStream, r: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    s.write_all(b"* OK [CAPABILITY IMAP4rev1] ready\r\n")?;
    let tag = command(r)?;
    s.write_all(format!("{tag} OK logged in\r\n").as_bytes())?;
    let tag = command(r)?;
    s.write_all(format!("* CAPABILITY IMAP4rev1\r\n{tag} OK done\r\n").as_bytes())?;
    command(r)
}

#[test]
fn a_logged_in_server_answering_list_with_an_endless_line_is_cut() {
    let (text, _) = logged_in_check(|s, r| {
        log_in(s, r)?;
        s.write_all(b"* LIST () \"/\" ")?;
        forever(s, &[b'a'; 64 << 10])
    });
    assert!(text.contains("LIST") && text.contains("response line longer than 1048576 bytes"), "{text}");
}

#[test]
fn a_logged_in_server_flooding_long_lines_is_cut() {
    let (text, _) = logged_in_check(|s, r| {
        log_in(s, r)?;
        // Lines just under the limit, one after another: each alone is
        // allowed, their re-parsing together is not.
        let mut line = b"* OK ".to_vec();
        line.extend(std::iter::repeat_n(b'a', (1 << 20) - 100));
        line.extend_from_slice(b"\r\n");
        forever(s, &line)
    });
    assert!(text.contains("LIST") && text.contains("would cost more than"), "{text}");
}
