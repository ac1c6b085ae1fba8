//! The test harness itself (`sync_worker::testing`) against the real servers:
//! what a real IMAP client sees of a private Dovecot, and fresh Postgres
//! databases. These fail, never skip, when Dovecot or Postgres is missing.

use sync_worker::testing::mail_gen::{self, MailGen};
use sync_worker::testing::{unique_name, Dovecot, ImapSession, Postgres, PostgresServer};

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
    let (a, b) = (unique_name("Some Test::name"), unique_name("Some Test::name"));
    assert_ne!(a, b);
    assert!(a.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'), "{a}");
}
