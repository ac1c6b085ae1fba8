//! At most `IMAP_CONNECTS_PER_HOST` connection attempts at once go to one
//! server host: a slow server sees the attempts queue, not pile up.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sync_worker::imap::{ConnectGate, ImapSettings, ImapSource};
use sync_worker::storage::{AccountAuth, Credentials, Security};

/// A server that greets after 200 ms and takes any login; it counts the
/// attempts in flight (accepted, login not yet answered), and the most seen.
fn slow_server() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (in_flight, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let seen = most.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let (in_flight, most) = (in_flight.clone(), most.clone());
            std::thread::spawn(move || {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(200));
                let _ = conn.write_all(b"* OK [CAPABILITY IMAP4rev1 SASL-IR AUTH=PLAIN] slow\r\n");
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                let tag = line.split(' ').next().unwrap_or("a").to_string();
                in_flight.fetch_sub(1, Ordering::SeqCst);
                let _ = conn.write_all(format!("{tag} OK logged in\r\n").as_bytes());
                line.clear();
                if reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                    let tag = line.split(' ').next().unwrap_or("a").to_string();
                    let _ = conn.write_all(format!("* BYE\r\n{tag} OK bye\r\n").as_bytes());
                }
            });
        }
    });
    (port, seen)
}

async fn many_logins(port: u16, settings: &ImapSettings, n: usize) {
    let creds = Credentials {
        host: "127.0.0.1".into(),
        port,
        security: Security::Plain,
        username: "u".into(),
        auth: AccountAuth::Password("p".into()),
    };
    let logins: Vec<_> = (0..n)
        .map(|_| {
            let (creds, settings) = (creds.clone(), settings.clone());
            tokio::spawn(async move { ImapSource::verify_login(&creds, &settings).await })
        })
        .collect();
    for l in logins {
        l.await.unwrap().expect("the login works");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_to_one_host_queue_at_the_cap() {
    let (port, most) = slow_server();
    let capped = ImapSettings { connect_gate: ConnectGate::new(NonZeroUsize::new(3).unwrap()), ..Default::default() };
    many_logins(port, &capped, 12).await;
    assert_eq!(most.load(Ordering::SeqCst), 3, "attempts in flight at most");

    // The default lets 8 go at once.
    let (port, most) = slow_server();
    many_logins(port, &ImapSettings::default(), 20).await;
    assert_eq!(most.load(Ordering::SeqCst), 8);
}
