//! `rediss://`: a build and its report over TLS, against a private
//! `redis-server --tls-port` with a certificate made here by the `openssl`
//! command (a missing `openssl` or `redis-server` fails the test). The
//! worker trusts the test's CA the way a user would: `SSL_CERT_FILE`.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{hopper, junit_cases, texts, Suite};
use leasehold_redis::test_support::{require_binary, unique_prefix, RedisServer};

/// A CA and a server certificate for 127.0.0.1 signed by it, in `dir`.
struct Certs {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl").args(args).current_dir(dir).stdin(Stdio::null()).output().expect("openssl");
    assert!(output.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
}

fn make_certs(dir: &Path) -> Certs {
    require_binary("openssl");
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    let key = ["-newkey", "rsa:2048", "-nodes"];
    openssl(
        dir,
        &[
            &["req", "-x509", "-days", "1", "-subj", "/CN=hopper test CA"][..],
            &key,
            &["-keyout", "ca.key", "-out", "ca.pem"],
        ]
        .concat(),
    );
    openssl(
        dir,
        &[&["req", "-subj", "/CN=127.0.0.1"][..], &key, &["-keyout", "server.key", "-out", "server.csr"]].concat(),
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "1",
            "-extfile",
            "san.ext",
        ],
    );
    Certs { ca: dir.join("ca.pem"), cert: dir.join("server.pem"), key: dir.join("server.key") }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn a_build_and_its_report_run_over_rediss() {
    let certs_dir = tempfile::tempdir().unwrap();
    let certs = make_certs(certs_dir.path());
    let tls_port = free_port();
    let server = RedisServer::start_with(
        &[
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            certs.cert.to_str().unwrap(),
            "--tls-key-file",
            certs.key.to_str().unwrap(),
            "--tls-ca-cert-file",
            certs.ca.to_str().unwrap(),
            "--tls-auth-clients",
            "no",
        ],
        false,
    )
    .unwrap();
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let build = format!("b-{}", unique_prefix("tls"));
    let mut suite = Suite::new();
    suite.passing("a.sh").passing("b.sh").failing("c.sh");
    let queue = ["--queue", url.as_str(), "--build", build.as_str()];

    // Without trusting the CA, the certificate is refused, and the message says so.
    let untrusted = hopper(suite.path())
        .args(["run", "--no-timings"])
        .args(queue)
        .arg("--units-from")
        .arg(suite.unit_list())
        .args(["--", "sh", "{unit}"])
        .output()
        .unwrap();
    let (_, stderr) = texts(&untrusted);
    assert_eq!(untrusted.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("cannot reach Redis at {url}")) && stderr.contains("certificate"), "{stderr}");
    assert!(!stderr.contains("retrying"), "waiting cannot mend a certificate: {stderr}");

    let worker = hopper(suite.path())
        .env("SSL_CERT_FILE", &certs.ca)
        .args(["run", "--no-timings", "-j", "2"])
        .args(queue)
        .arg("--units-from")
        .arg(suite.unit_list())
        .args(["--", "sh", "{unit}"])
        .output()
        .unwrap();
    assert_eq!(worker.status.code(), Some(0), "{:?}", texts(&worker));

    let junit = suite.path().join("junit.xml");
    let report = hopper(suite.path())
        .env("SSL_CERT_FILE", &certs.ca)
        .arg("report")
        .args(queue)
        .arg("--junit")
        .arg(&junit)
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&report);
    assert_eq!(report.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("FAILED: 3 units, 2 passed (0 flaky), 1 failed, 0 unfinished"), "{stdout}");
    assert_eq!(junit_cases(&junit).len(), 3);
    // The plain port of the same server saw the build: it really went through this server.
    let keys = server.command("DBSIZE").unwrap();
    assert!(keys.trim_start_matches(':').trim().parse::<u64>().unwrap() > 0, "{keys}");
}
