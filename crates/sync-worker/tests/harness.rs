//! The test harness itself (`sync_worker::testing`) against the real servers:
//! what a real IMAP client sees of a private Dovecot, and fresh Postgres
//! databases. These fail, never skip, when Dovecot or Postgres is missing.

use std::time::{Duration, Instant};

use sync_worker::testing::mail_gen::{self, MailGen};
use sync_worker::testing::{
    unique_name, Dovecot, DovecotOptions, ImapProxy, ImapSession, Postgres, PostgresServer, SPECIAL_FOLDERS,
};

fn dovecot_with(user: &str) -> Dovecot {
    let dovecot = Dovecot::start().unwrap_or_else(|e| panic!("start Dovecot: {e}"));
    dovecot.add_user(user, "secret").expect("add a user");
    dovecot
}

/// `(UIDVALIDITY, HIGHESTMODSEQ)` of INBOX from a SELECT with CONDSTORE.
fn select_state(session: &mut ImapSession) -> (u32, u64) {
    let reply = session.ok("SELECT INBOX (CONDSTORE)").expect("select");
    let code = |name: &str| -> u64 {
        reply
            .untagged
            .iter()
            .find_map(|line| line.split(&format!("[{name} ")).nth(1)?.split(']').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {:?}", reply.untagged))
    };
    (code("UIDVALIDITY") as u32, code("HIGHESTMODSEQ"))
}

#[test]
fn an_appended_message_is_seen_by_a_real_imap_client() {
    let dovecot = dovecot_with("alice");
    let message = mail_gen::message(1, 0);
    let appended = dovecot.append("alice", "INBOX", &message.raw).expect("append");
    assert_eq!(appended.uid, 1);

    let mut imap = dovecot.imap("alice").expect("login");
    let select = imap.ok("SELECT INBOX").expect("select");
    assert!(select.untagged.iter().any(|l| l == "* 1 EXISTS"), "{:?}", select.untagged);
    assert!(select.untagged.iter().any(|l| l.contains(&format!("[UIDVALIDITY {}]", appended.uid_validity))));
    let fetch = imap.ok("UID FETCH 1 (RFC822.SIZE BODY.PEEK[])").expect("fetch");
    let body = fetch.lines_of("1 FETCH").next().expect("a FETCH line");
    assert!(body.contains(&format!("RFC822.SIZE {}", message.raw.len())), "{body:.200}");
    assert!(body.contains(std::str::from_utf8(&message.raw).expect("ascii mail")), "the whole message comes back");
    imap.logout();

    let status = dovecot.mailbox_status("alice", "INBOX").expect("status");
    assert_eq!((status.messages, status.uid_next, status.uid_validity), (1, 2, appended.uid_validity));
}

#[test]
fn many_appends_keep_order_and_every_size_matches() {
    let dovecot = dovecot_with("bulk");
    let messages: Vec<_> = MailGen::new(9).take(40).collect();
    let appended =
        dovecot.append_many("bulk", "Archive", messages.iter().map(|m| m.raw.as_slice())).expect("append many");
    assert_eq!(appended.iter().map(|a| a.uid).collect::<Vec<_>>(), (1..=40).collect::<Vec<_>>());

    let mut imap = dovecot.imap("bulk").expect("login");
    imap.ok("SELECT Archive").expect("select");
    let fetch = imap.ok("UID FETCH 1:* (RFC822.SIZE BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)])").expect("fetch");
    let lines: Vec<&str> = fetch.lines_of("").filter(|l| l.contains(" FETCH ")).collect();
    assert_eq!(lines.len(), 40);
    for (line, message) in lines.iter().zip(&messages) {
        assert!(line.contains(&format!("RFC822.SIZE {}", message.raw.len())), "{line}");
        assert!(line.contains(&message.message_id), "{line}");
    }
    assert_eq!(dovecot.mailbox_status("bulk", "Archive").expect("status").messages, 40);
}

#[test]
fn capability_offers_idle_condstore_qresync_and_special_use() {
    let dovecot = dovecot_with("carol");
    let mut imap = dovecot.imap("carol").expect("login");
    let reply = imap.ok("CAPABILITY").expect("capability");
    let line = reply.lines_of("CAPABILITY").next().expect("a CAPABILITY line");
    let caps: Vec<&str> = line.split(' ').collect();
    for cap in ["IMAP4rev1", "IDLE", "CONDSTORE", "QRESYNC", "SPECIAL-USE", "UIDPLUS", "LITERAL+", "ENABLE"] {
        assert!(caps.contains(&cap), "{cap} missing from {line}");
    }
}

#[test]
fn list_shows_the_special_use_folders_subscribed() {
    let dovecot = dovecot_with("dave");
    let mut imap = dovecot.imap("dave").expect("login");
    let list = imap.ok(r#"LIST "" "*""#).expect("list");
    let special = imap.ok(r#"LIST (SPECIAL-USE) "" "*""#).expect("list special-use");
    let subscribed = imap.ok(r#"LSUB "" "*""#).expect("lsub");
    for (name, flag) in
        [("Sent", "\\Sent"), ("Drafts", "\\Drafts"), ("Trash", "\\Trash"), ("Junk", "\\Junk"), ("Archive", "\\Archive")]
    {
        let found = |lines: &[String]| lines.iter().any(|l| l.contains(flag) && l.ends_with(&format!("\"/\" {name}")));
        assert!(found(&list.untagged), "{name} {flag} missing from {:?}", list.untagged);
        assert!(found(&special.untagged), "{name} missing from the SPECIAL-USE list {:?}", special.untagged);
        assert!(subscribed.untagged.iter().any(|l| l.ends_with(&format!("\"/\" {name}"))), "{name} not subscribed");
    }
    assert!(list.untagged.iter().any(|l| l.ends_with("\"/\" INBOX")));
    assert!(!special.untagged.iter().any(|l| l.ends_with("INBOX")), "INBOX has no special use");
}

#[test]
fn a_doveadm_expunge_shows_as_vanished_to_a_qresync_client() {
    let dovecot = dovecot_with("erin");
    let messages: Vec<_> = MailGen::new(3).take(3).collect();
    dovecot.append_many("erin", "INBOX", messages.iter().map(|m| m.raw.as_slice())).expect("append");
    let mut imap = dovecot.imap("erin").expect("login");
    imap.ok("ENABLE QRESYNC").expect("enable qresync");
    let (uid_validity, modseq) = select_state(&mut imap);
    imap.ok("UNSELECT").expect("unselect");

    dovecot.expunge("erin", "INBOX", &["uid", "2"]).expect("doveadm expunge");

    let reselect = imap.ok(&format!("SELECT INBOX (QRESYNC ({uid_validity} {modseq}))")).expect("qresync select");
    assert!(reselect.untagged.iter().any(|l| l == "* VANISHED (EARLIER) 2"), "{:?}", reselect.untagged);
    let search = imap.ok("UID SEARCH ALL").expect("search");
    assert_eq!(search.lines_of("SEARCH").next(), Some("* SEARCH 1 3"));
    assert_eq!(dovecot.mailbox_status("erin", "INBOX").expect("status").messages, 2);
}

#[test]
fn a_doveadm_flag_change_shows_with_changedsince() {
    let dovecot = dovecot_with("frank");
    dovecot.append("frank", "INBOX", &mail_gen::message(4, 0).raw).expect("append");
    dovecot.append("frank", "INBOX", &mail_gen::message(4, 1).raw).expect("append");
    let mut imap = dovecot.imap("frank").expect("login");
    let (_, modseq) = select_state(&mut imap);

    dovecot.add_flags("frank", "INBOX", "\\Seen \\Flagged", &["uid", "2"]).expect("doveadm flags add");

    imap.ok("NOOP").expect("noop");
    let changed = imap.ok(&format!("UID FETCH 1:* (FLAGS) (CHANGEDSINCE {modseq})")).expect("changedsince");
    let lines: Vec<&str> = changed.lines_of("").filter(|l| l.contains(" FETCH ")).collect();
    assert_eq!(lines.len(), 1, "only the changed message: {lines:?}");
    assert!(
        lines[0].contains("UID 2") && lines[0].contains("\\Seen") && lines[0].contains("\\Flagged"),
        "{}",
        lines[0]
    );
    assert!(dovecot.mailbox_status("frank", "INBOX").expect("status").highest_modseq > modseq);
}

#[test]
fn a_uidvalidity_change_is_visible() {
    let dovecot = dovecot_with("gina");
    let before = dovecot.append("gina", "INBOX", &mail_gen::message(5, 0).raw).expect("append");
    let new_validity = before.uid_validity.wrapping_add(1000);
    dovecot.set_uid_validity("gina", "INBOX", new_validity).expect("doveadm mailbox update");

    let mut imap = dovecot.imap("gina").expect("login");
    let status = imap.ok("STATUS INBOX (UIDVALIDITY MESSAGES)").expect("status");
    let line = status.lines_of("STATUS").next().expect("a STATUS line");
    assert!(line.contains(&format!("UIDVALIDITY {new_validity}")) && line.contains("MESSAGES 1"), "{line}");
    assert_eq!(dovecot.mailbox_status("gina", "INBOX").expect("status").uid_validity, new_validity);
}

#[test]
fn killing_the_imap_process_drops_only_that_users_connection() {
    let dovecot = dovecot_with("hank");
    dovecot.add_user("ivy", "secret").expect("add ivy");
    let mut hank = dovecot.imap("hank").expect("login hank");
    hank.ok("SELECT INBOX").expect("select");
    let mut ivy = dovecot.imap("ivy").expect("login ivy");

    assert_eq!(dovecot.kill_imap_processes("hank").expect("kill"), 1);

    assert!(hank.command("NOOP").is_err(), "the killed connection is gone");
    ivy.ok("NOOP").expect("ivy's connection lives on");
    let mut again = dovecot.imap("hank").expect("hank logs in again");
    again.ok("SELECT INBOX").expect("select again");
    assert_eq!(dovecot.kill_imap_processes("nobody").expect("kill none"), 0);
}

#[test]
fn five_hundred_users_are_cheap_and_a_wrong_password_is_refused() {
    let dovecot = Dovecot::start().expect("start Dovecot");
    let names: Vec<String> = (0..500).map(|i| format!("user{i:03}")).collect();
    dovecot.add_users(names.iter().map(|n| (n.as_str(), "pw"))).expect("add 500 users");
    dovecot.imap("user000").expect("first").ok("SELECT INBOX").expect("select");
    dovecot.imap("user499").expect("last").ok("SELECT Sent").expect("select");

    let refused = ImapSession::login(dovecot.port(), "user001", "wrong").expect_err("a wrong password fails");
    assert!(refused.to_string().contains("AUTHENTICATIONFAILED"), "{refused}");
    assert!(dovecot.add_user("user001", "pw").is_err(), "a duplicate user is refused");
    assert!(dovecot.add_user("bad:name", "pw").is_err(), "a bad name is refused");
    assert!(dovecot.append("stranger", "INBOX", b"Subject: x\r\n\r\nx\r\n").is_err(), "unknown user");
}

#[test]
fn each_postgres_handle_is_a_database_of_its_own_dropped_on_drop() {
    let a = Postgres::fresh("harness_a").unwrap_or_else(|e| panic!("{e}"));
    let b = Postgres::fresh("harness_b").unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(a.name(), b.name());
    assert_ne!(a.url(), b.url());
    a.execute("CREATE TABLE marker (who text); INSERT INTO marker VALUES ('a')").expect("write a");
    assert_eq!(a.query_one("SELECT who FROM marker").expect("read a"), "a");
    assert!(b.query("SELECT who FROM marker").is_err(), "b does not see a's table");
    b.execute("CREATE TABLE marker (who text, n int)").expect("b has its own");
    b.execute("INSERT INTO marker VALUES ('b\nwith a line break', 1), (NULL, 2)").expect("write b");
    assert_eq!(
        b.query("SELECT who, n FROM marker ORDER BY n").expect("read b"),
        vec![vec!["b\nwith a line break".to_owned(), "1".to_owned()], vec![String::new(), "2".to_owned()]]
    );

    let name = a.name().to_owned();
    let exists = format!("SELECT count(*) FROM pg_database WHERE datname = '{name}'");
    assert_eq!(b.query_one(&exists).expect("catalog"), "1");
    drop(a);
    assert_eq!(b.query_one(&exists).expect("catalog"), "0", "dropping the handle drops the database");
}

#[test]
fn a_private_postgres_survives_a_kill_and_restart_with_committed_data() {
    let server = PostgresServer::start().unwrap_or_else(|e| panic!("{e}"));
    let db = server.fresh_database("fault").expect("fresh database");
    db.execute("CREATE TABLE t (n int); INSERT INTO t VALUES (1), (2)").expect("write");

    server.kill();
    assert!(db.query("SELECT 1").is_err(), "a killed server answers nothing");
    server.restart().expect("restart");
    assert_eq!(db.query_one("SELECT sum(n) FROM t").expect("read after restart"), "3");
    assert!(db.url().contains(&format!(":{}/", server.port())));
}

#[test]
fn unique_names_are_unique_and_plain() {
    if std::env::var_os("HARNESS_CHILD_USES_POSTGRES").is_some() {
        // Run as a child of the leftover test: a new process's first database.
        drop(Postgres::fresh("child").unwrap_or_else(|e| panic!("{e}")));
    }
    let (a, b) = (unique_name("Some Test::name"), unique_name("Some Test::name"));
    assert_ne!(a, b);
    assert!(a.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'), "{a}");
}

#[test]
fn an_idling_client_hears_of_new_mail_at_once() {
    let dovecot = dovecot_with("jack");
    let mut idler = dovecot.imap("jack").expect("login");
    idler.ok("SELECT INBOX").expect("select");
    assert_eq!(dovecot.idle_sessions().expect("count"), 0);
    idler.idle_start().expect("idle");
    let deadline = Instant::now() + Duration::from_secs(5);
    while dovecot.idle_sessions().expect("count") != 1 {
        assert!(Instant::now() < deadline, "the idling session is never seen as IDLE");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(idler.idle_wait(Duration::from_millis(200)).expect("quiet"), None, "nothing happened yet");

    let appended_at = Instant::now();
    dovecot.append("jack", "INBOX", &mail_gen::message(6, 0).raw).expect("append from another client");
    let heard = idler.idle_wait(Duration::from_secs(2)).expect("wait");
    assert_eq!(heard.as_deref(), Some("* 1 EXISTS"), "after {:?}", appended_at.elapsed());

    dovecot.expunge("jack", "INBOX", &["all"]).expect("doveadm expunge");
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut heard = Vec::new();
    // "* 1 RECENT" may still trail the EXISTS.
    while !heard.iter().any(|l| l == "* 1 EXPUNGE") {
        let wait = deadline.saturating_duration_since(Instant::now());
        match idler.idle_wait(wait).expect("wait") {
            Some(line) => heard.push(line),
            None => panic!("no EXPUNGE within 2 s of doveadm expunge: {heard:?}"),
        }
    }
    assert!(idler.idle_done().expect("done").is_ok());
}

#[test]
fn flags_internal_dates_and_many_folders_are_set_as_asked() {
    let dovecot = dovecot_with("kim");
    let folders: Vec<String> = (0..20).map(|i| format!("Projects/p{i:02}")).collect();
    dovecot.create_folders("kim", &folders.iter().map(String::as_str).collect::<Vec<_>>()).expect("create");
    let at = 1_718_454_645; // 2024-06-15 12:30:45 UTC
    dovecot
        .append_with("kim", "Projects/p07", &["\\Seen", "$Important"], Some(at), &mail_gen::message(7, 0).raw)
        .expect("append with flags and date");

    let mut imap = dovecot.imap("kim").expect("login");
    let list = imap.ok(r#"LIST "" "Projects/*""#).expect("list");
    assert_eq!(list.untagged.len(), 20, "{:?}", list.untagged);
    imap.ok("SELECT Projects/p07").expect("select");
    let fetch = imap.ok("UID FETCH 1 (FLAGS INTERNALDATE)").expect("fetch");
    let line = fetch.lines_of("1 FETCH").next().expect("a FETCH line");
    assert!(line.contains("\\Seen") && line.contains("$Important"), "{line}");
    assert!(line.contains(r#"INTERNALDATE "15-Jun-2024 12:30:45 +0000""#), "{line}");
}

#[test]
fn a_restart_drops_every_connection_and_keeps_the_mail() {
    let dovecot = dovecot_with("lee");
    dovecot.append("lee", "INBOX", &mail_gen::message(8, 0).raw).expect("append");
    let mut before = dovecot.imap("lee").expect("login");
    before.ok("SELECT INBOX").expect("select");

    // anvil, behind doveadm who, learns of a login a moment after it.
    let deadline = Instant::now() + Duration::from_secs(5);
    let old_imap = loop {
        let pids = imap_pids(&dovecot, "lee");
        if !pids.is_empty() || Instant::now() > deadline {
            break pids;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(old_imap.len(), 1, "one imap process serves the connection");

    dovecot.restart().expect("restart");

    assert!(imap_pids(&dovecot, "lee").is_empty(), "no imap process survives the restart");
    let noop = before.command("NOOP");
    assert!(noop.is_err(), "the old connection is gone: {noop:?}");
    assert!(!std::path::Path::new(&format!("/proc/{}", old_imap[0])).exists(), "the old imap process is gone");
    let mut after = dovecot.imap("lee").expect("login after the restart");
    let select = after.ok("SELECT INBOX").expect("select");
    assert!(select.untagged.iter().any(|l| l == "* 1 EXISTS"), "{:?}", select.untagged);
    assert!(dovecot.log_tail().contains("starting up"), "the log is kept: {}", dovecot.log_tail());
}

/// The pids of `user`'s imap processes, from `doveadm who` (the tool's own view).
fn imap_pids(dovecot: &Dovecot, user: &str) -> Vec<u32> {
    let who = dovecot.doveadm(&["who", "-1"]).expect("doveadm who");
    who.lines()
        .skip(1)
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|fields| fields.first() == Some(&user))
        .filter_map(|fields| fields.get(2)?.parse().ok())
        .collect()
}

#[test]
fn the_proxy_records_every_command_and_can_cut_connections() {
    let dovecot = dovecot_with("mia");
    let proxy = ImapProxy::start(dovecot.port()).expect("proxy");
    let mut imap = ImapSession::login(proxy.port(), "mia", "secret").expect("login through the proxy");
    imap.append("INBOX", &["\\Seen"], &mail_gen::message(10, 0).raw).expect("append a literal through it");
    imap.ok("SELECT INBOX").expect("select");
    imap.ok("UID FETCH 1 (FLAGS)").expect("fetch");
    imap.idle_start().expect("idle");
    imap.idle_done().expect("done");

    let verbs: Vec<String> = proxy.commands().into_iter().map(|c| c.verb).collect();
    assert_eq!(verbs, ["LOGIN", "APPEND", "SELECT", "UID FETCH", "IDLE", "DONE"]);
    assert!(!proxy.commands()[0].line.contains("secret"), "no password is recorded");
    assert_eq!((proxy.count("UID FETCH"), proxy.count("FETCH"), proxy.connections()), (1, 0, 1));

    proxy.clear();
    proxy.cut_all();
    assert!(imap.command("NOOP").is_err(), "the cut connection is gone");
    assert!(proxy.commands().iter().all(|c| c.verb == "NOOP"));
    ImapSession::login(proxy.port(), "mia", "secret").expect("a new connection goes through").ok("NOOP").expect("noop");
    assert_eq!(proxy.connections(), 2);
}

#[test]
fn a_database_left_by_a_killed_process_is_dropped_by_the_next() {
    // A process that dies without running Drop leaves its database behind.
    let leftover = format!("lh_harness_leftover_{}_0_0", dead_pid());
    let live = format!("lh_harness_live_{}_0_0", std::process::id());
    let db = Postgres::fresh("harness_probe").unwrap_or_else(|e| panic!("{e}"));
    db.execute(&format!("CREATE DATABASE \"{leftover}\"")).expect("create the leftover");
    db.execute(&format!("CREATE DATABASE \"{live}\"")).expect("a live process's database");
    let exists = |name: &str| db.query_one(&format!("SELECT count(*) FROM pg_database WHERE datname = '{name}'"));
    assert_eq!(exists(&leftover).expect("catalog"), "1");

    // A new process (this test binary, running one other test) cleans up at its first database.
    let status = std::process::Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", "unique_names_are_unique_and_plain", "--quiet"])
        .env("HARNESS_CHILD_USES_POSTGRES", "1")
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run a child test process");
    assert!(status.success());
    assert_eq!(exists(&leftover).expect("catalog"), "0", "the dead process's database is dropped");
    assert_eq!(exists(&live).expect("catalog"), "1", "a live process's database is kept");
    db.execute(&format!("DROP DATABASE \"{live}\"")).expect("clean up");
}

/// A pid no process has: one past the kernel's limit.
fn dead_pid() -> u64 {
    let max: u64 =
        std::fs::read_to_string("/proc/sys/kernel/pid_max").expect("pid_max").trim().parse().expect("a number");
    max + 1
}

#[test]
fn a_plainer_dovecot_hides_idle_condstore_qresync_and_special_use() {
    let mut options = DovecotOptions::without(&["IDLE", "CONDSTORE", "QRESYNC"]);
    options.special_use = false;
    let dovecot = Dovecot::start_with(&options).unwrap_or_else(|e| panic!("{e}"));
    dovecot.add_user("old", "secret").expect("add a user");
    let mut imap = dovecot.imap("old").expect("login");
    let reply = imap.ok("CAPABILITY").expect("capability");
    let caps: Vec<&str> = reply.lines_of("CAPABILITY").next().expect("a CAPABILITY line").split(' ').collect();
    for hidden in ["IDLE", "CONDSTORE", "QRESYNC"] {
        assert!(!caps.contains(&hidden), "{hidden} is still offered: {caps:?}");
    }
    assert!(caps.contains(&"UIDPLUS") && caps.contains(&"SPECIAL-USE"), "the rest is kept: {caps:?}");

    let list = imap.ok(r#"LIST "" "*""#).expect("list");
    for (name, flag) in SPECIAL_FOLDERS {
        let line = list.untagged.iter().find(|l| l.ends_with(&format!("\"/\" {name}"))).expect("the folder exists");
        assert!(!line.contains(flag), "{name} carries no special-use flag: {line}");
    }
}
