//! The operator CLI and the worker binary, run as an operator would, against
//! a private Dovecot, on SQLite and Postgres.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use sync_worker::both_databases;
use sync_worker::testing::{mail_gen, sync_worker_command, Dovecot, TestDb, TEST_SECRET_KEY};

const USER: &str = "carol";
const PASSWORD: &str = "pw-of-carol";

struct Env {
    dovecot: Dovecot,
    url: String,
    key: String,
    dir: tempfile::TempDir,
    _db: TestDb,
}

fn env(db: TestDb) -> Env {
    let dovecot = Dovecot::start().unwrap_or_else(|e| panic!("Dovecot: {e}"));
    dovecot.add_user(USER, PASSWORD).unwrap();
    let url = db.url().to_string();
    let key = TEST_SECRET_KEY.to_string();
    Env { dovecot, url, key, dir: tempfile::tempdir().unwrap(), _db: db }
}

impl Env {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = sync_worker_command(env!("CARGO_BIN_EXE_sync-worker"), self.dir.path());
        c.args(args).env("DATABASE_URL", &self.url).env("SECRET_KEY", &self.key);
        c
    }

    fn run(&self, args: &[&str], stdin: &str) -> Output {
        let mut child = self
            .cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sync-worker");
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }

    fn ok(&self, args: &[&str], stdin: &str) -> String {
        let out = self.run(args, stdin);
        assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    fn fails(&self, args: &[&str], stdin: &str) -> String {
        let out = self.run(args, stdin);
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8(out.stderr).unwrap()
    }

    fn add_account(&self, password: &str) -> Output {
        let port = self.dovecot.port().to_string();
        self.run(
            &[
                "account",
                "add",
                "--user",
                "carol@example.org",
                "--host",
                "127.0.0.1",
                "--port",
                &port,
                "--security",
                "plain",
                "--username",
                USER,
            ],
            &format!("{password}\n"),
        )
    }

    fn list(&self) -> Vec<serde_json::Value> {
        serde_json::from_str(&self.ok(&["account", "list", "--json"], "")).unwrap()
    }

    fn status(&self, id: &str) -> serde_json::Value {
        serde_json::from_str(&self.ok(&["account", "status", id, "--json"], "")).unwrap()
    }
}

both_databases!(
    sync:
    operator_commands_add_list_status_remove,
    bad_input_changes_nothing,
    worker_syncs_and_resumes_after_a_kill
);

fn operator_commands_add_list_status_remove(db: TestDb) {
    let e = env(db);
    e.ok(&["user", "add", "--email", "carol@example.org"], "");
    let out = e.add_account(PASSWORD);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let list = e.list();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["id"], id.as_str());
    assert_eq!(list[0]["user"], "carol@example.org");
    assert_eq!(list[0]["host"], "127.0.0.1");
    assert_eq!(list[0]["username"], USER);
    let status = e.status(&id);
    for field in ["id", "tier", "owner", "last_sync_at", "last_error", "folders"] {
        assert!(status.get(field).is_some(), "status lacks {field}: {status}");
    }
    // The password is stored encrypted, nowhere in the clear.
    if let Some(file) = e._db.sqlite_file() {
        let raw = std::fs::read(file).unwrap();
        assert!(!raw.windows(PASSWORD.len()).any(|w| w == PASSWORD.as_bytes()), "password stored in plain text");
    }
    // The provider changed the password: `account update` checks the new
    // one before it saves it (a wrong one changes nothing).
    e.dovecot.set_password(USER, "changed-pw").unwrap();
    let err = e.fails(&["account", "update", &id], "still-wrong\n");
    assert!(err.contains("Authentication failed") && err.contains("nothing changed"), "{err}");
    let err = e.fails(&["account", "update", &id, "--keep-password"], "");
    assert!(err.contains("Authentication failed") && err.contains("nothing changed"), "{err}");
    assert!(e.ok(&["account", "update", &id], "changed-pw\n").contains(&format!("updated {id}")));
    e.ok(&["account", "update", &id, "--keep-password", "--port", &e.dovecot.port().to_string()], "");
    assert!(e.fails(&["account", "update", "no-such-account"], "x\n").contains("no account"));
    e.ok(&["account", "remove", &id], "");
    assert!(e.list().is_empty());
    assert!(e.fails(&["account", "remove", &id], "").contains("no account"));
}

fn bad_input_changes_nothing(db: TestDb) {
    let e = env(db);
    assert!(e.fails(&["user", "add", "--email", "not-an-address"], "").contains("not an e-mail address"));
    e.ok(&["user", "add", "--email", "carol@example.org"], "");
    assert!(e.fails(&["user", "add", "--email", "carol@example.org"], "").contains("already exists"));
    // A wrong password: the server's answer, nothing saved.
    let out = e.add_account("wrong");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Authentication failed") && err.contains("nothing saved"), "{err}");
    assert!(e.list().is_empty());
    // No password at all.
    let out = e.add_account("");
    assert!(String::from_utf8_lossy(&out.stderr).contains("IMAP_PASSWORD"));
    // An unreachable host.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let err = e.fails(
        &[
            "account",
            "add",
            "--user",
            "carol@example.org",
            "--host",
            "127.0.0.1",
            "--port",
            &dead,
            "--security",
            "plain",
            "--username",
            USER,
        ],
        "x\n",
    );
    assert!(err.contains("could not reach") && err.contains("nothing saved"), "{err}");
    assert!(e.list().is_empty());
    // A duplicate.
    assert!(e.add_account(PASSWORD).status.success());
    let out = e.add_account(PASSWORD);
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    assert_eq!(e.list().len(), 1);
    // Bad configuration.
    let err = String::from_utf8(e.cmd(&["account", "list"]).env("DATABASE_URL", "mysql://x").output().unwrap().stderr)
        .unwrap();
    assert!(err.contains("DATABASE_URL"), "{err}");
    let err =
        String::from_utf8(e.cmd(&["account", "list"]).env("SECRET_KEY", "c2hvcnQ=").output().unwrap().stderr).unwrap();
    assert!(err.contains("SECRET_KEY") && err.contains("32 bytes"), "{err}");
    // Another key cannot read the stored password (and says why).
    let other = "CAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAg=";
    let out = e
        .cmd(&["worker"])
        .env("SECRET_KEY", other)
        .env("POLL_WARM", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let _ = nix_kill(out.id());
    let out = out.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not decrypt"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn nix_kill(pid: u32) -> std::io::Result<()> {
    let status = Command::new("kill").arg("-TERM").arg(pid.to_string()).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other("kill failed"))
    }
}

fn inbox_messages(e: &Env, id: &str) -> i64 {
    e.status(id)["folders"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "INBOX")
        .map_or(0, |f| f["messages"].as_i64().unwrap())
}

fn wait_for(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < within, "{what} within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn worker_syncs_and_resumes_after_a_kill(db: TestDb) {
    let e = env(db);
    e.ok(&["user", "add", "--email", "carol@example.org"], "");
    let out = e.add_account(PASSWORD);
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    for slice in 0..6 {
        let msgs: Vec<Vec<u8>> = (slice * 500..(slice + 1) * 500).map(|i| mail_gen::message(42, i).raw).collect();
        e.dovecot
            .append_many(USER, "INBOX", msgs.iter().map(|m| m.as_slice()))
            .unwrap_or_else(|err| panic!("append: {err}"));
    }
    let spawn = || {
        e.cmd(&["worker"])
            .env("POLL_WARM", "1")
            .env("POLL_COLD", "2")
            .env("LEASE_TTL", "3")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut worker = spawn();
    wait_for("a first batch", Duration::from_secs(30), || inbox_messages(&e, &id) >= 500);
    // SIGKILL in the middle of the initial sync.
    worker.kill().unwrap();
    worker.wait().unwrap();
    let partial = inbox_messages(&e, &id);
    assert!(partial < 3000, "the sync ended before the kill ({partial}); the test proves nothing");
    let mut worker = spawn();
    wait_for("the resumed sync", Duration::from_secs(60), || inbox_messages(&e, &id) == 3000);
    // New mail shows up at the next poll.
    e.dovecot.append(USER, "INBOX", &mail_gen::message(43, 0).raw).unwrap();
    wait_for("new mail", Duration::from_secs(10), || inbox_messages(&e, &id) == 3001);
    assert_eq!(e.dovecot.mailbox_status(USER, "INBOX").unwrap().messages, 3001);
    let status = e.status(&id);
    assert!(status["last_error"].is_null(), "{status}");
    assert!(status["owner"].is_string(), "{status}");
    nix_kill(worker.id()).unwrap();
    assert!(worker.wait().unwrap().success(), "SIGTERM: the worker releases its leases and exits 0");
}
