//! A private Dovecot IMAP server for tests and benchmarks.
//!
//! Dovecot runs as root with a config of its own (`-c`), so that it can
//! switch users, but its login processes run as `dovenull` and its mail
//! processes as `dovecot`. Everything it writes (runtime sockets, state,
//! log, users' mail) stays in one temp dir that is removed on drop.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::{chown, Pid, User};

use super::{find_binary, free_port, output, spawn, tail, HarnessError, ImapSession, Result};

/// How long Dovecot may take to greet its first client.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a stopping Dovecot may take before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// What to do when Dovecot is missing.
const INSTALL: &str = "install Debian's dovecot-imapd package (`cargo xtask setup` does)";

/// The special-use folders every user gets (RFC 6154), created and subscribed at login.
pub const SPECIAL_FOLDERS: [(&str, &str); 5] =
    [("Drafts", "\\Drafts"), ("Sent", "\\Sent"), ("Trash", "\\Trash"), ("Junk", "\\Junk"), ("Archive", "\\Archive")];

/// What Dovecot 2.3 offers after login, by default.
const FULL_CAPABILITY: &str = "IMAP4rev1 SASL-IR LOGIN-REFERRALS ID ENABLE IDLE SORT SORT=DISPLAY THREAD=REFERENCES \
     THREAD=REFS THREAD=ORDEREDSUBJECT MULTIAPPEND URL-PARTIAL CATENATE UNSELECT CHILDREN NAMESPACE UIDPLUS \
     LIST-EXTENDED I18NLEVEL=1 CONDSTORE QRESYNC ESEARCH ESORT SEARCHRES WITHIN CONTEXT=SEARCH LIST-STATUS BINARY \
     MOVE SNIPPET=FUZZY PREVIEW=FUZZY PREVIEW STATUS=SIZE SAVEDATE LITERAL+ NOTIFY SPECIAL-USE";

/// How a [`Dovecot`] differs from the full-featured default, to test the
/// engine's fallbacks (NOOP polling, flag rescans, folders found by name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DovecotOptions {
    /// Capabilities not to advertise after login (e.g. `IDLE`, `CONDSTORE`,
    /// `QRESYNC`). Dovecot still answers such commands if a client sends
    /// them anyway: a well-behaved client reads CAPABILITY first.
    pub hidden_capabilities: Vec<String>,
    /// Whether Sent, Drafts, Trash, Junk and Archive carry their RFC 6154
    /// special-use flags (they exist and are subscribed either way).
    pub special_use: bool,
    /// TLS: `ssl = required` with this certificate, STARTTLS on
    /// [`Dovecot::port`] and TLS from the first byte on [`Dovecot::tls_port`].
    pub tls: Option<DovecotTls>,
    /// `auth_mechanisms` for password logins (default `plain login`).
    pub auth_mechanisms: String,
    /// Capabilities advertised on top of Dovecot's own, before and after
    /// login (e.g. `LOGINDISABLED`: Dovecot still takes LOGIN then).
    pub extra_capabilities: Vec<String>,
    /// OAuth2 logins (OAUTHBEARER and XOAUTH2, or those given), with
    /// tokens checked at this introspection URL (an [`super::OAuthServer`]'s).
    pub oauth2: Option<DovecotOAuth2>,
    /// Hand a session that has been in IDLE this long to `imap-hibernate`
    /// (Dovecot's `imap_hibernate_timeout`): a held IDLE then costs the
    /// server a few KiB in one process, not an imap process of its own.
    pub hibernate_idle_after: Option<Duration>,
    /// How many connections it must hold at once (default 2,000): sizes the
    /// process and client limits, and spreads TLS sessions (which the login
    /// processes keep, two descriptors each) over several login processes.
    pub max_clients: usize,
}

/// How a [`Dovecot`] takes OAuth2 logins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DovecotOAuth2 {
    /// Where tokens are checked (RFC 7662, `introspection_mode = post`).
    pub introspection_url: String,
    /// The mechanisms offered (`oauthbearer xoauth2`).
    pub mechanisms: String,
}

impl DovecotOAuth2 {
    /// OAUTHBEARER and XOAUTH2, checked at `introspection_url`.
    pub fn new(introspection_url: String) -> Self {
        Self { introspection_url, mechanisms: "oauthbearer xoauth2".into() }
    }
}

/// The certificate a TLS [`Dovecot`] presents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DovecotTls {
    /// Its certificate (PEM), e.g. from [`super::PrivateCa::issue`].
    pub cert: PathBuf,
    /// Its key (PEM).
    pub key: PathBuf,
}

impl Default for DovecotOptions {
    fn default() -> Self {
        Self {
            hidden_capabilities: Vec::new(),
            special_use: true,
            tls: None,
            auth_mechanisms: "plain login".into(),
            extra_capabilities: Vec::new(),
            oauth2: None,
            hibernate_idle_after: None,
            max_clients: DEFAULT_MAX_CLIENTS,
        }
    }
}

/// What a default [`Dovecot`] is sized for: 500 hot accounts and the
/// transient sessions beside them.
const DEFAULT_MAX_CLIENTS: usize = 2000;

impl DovecotOptions {
    /// The default, with `ssl = required` and this certificate.
    pub fn tls(cert: &super::ServerCert) -> Self {
        Self { tls: Some(DovecotTls { cert: cert.cert.clone(), key: cert.key.clone() }), ..Self::default() }
    }
}

impl DovecotOptions {
    /// The default, minus these capabilities.
    pub fn without(capabilities: &[&str]) -> Self {
        Self { hidden_capabilities: capabilities.iter().map(|c| (*c).to_owned()).collect(), ..Self::default() }
    }
}

/// Where an APPEND put a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The folder's UIDVALIDITY.
    pub uid_validity: u32,
    /// The message's UID.
    pub uid: u32,
}

/// A folder's counters, as Dovecot itself reports them (`doveadm mailbox status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MailboxStatus {
    /// Messages in the folder.
    pub messages: u32,
    /// The next UID.
    pub uid_next: u32,
    /// The UIDVALIDITY.
    pub uid_validity: u32,
    /// The HIGHESTMODSEQ.
    pub highest_modseq: u64,
}

/// A private Dovecot on a free loopback port; stopped and removed on drop.
#[derive(Debug)]
pub struct Dovecot {
    dir: tempfile::TempDir,
    port: u16,
    tls_port: Option<u16>,
    dovecot: PathBuf,
    doveadm: PathBuf,
    child: Mutex<Option<Child>>,
    /// name -> password, for the harness's own logins.
    users: Mutex<HashMap<String, String>>,
}

impl Dovecot {
    /// Starts Dovecot (IMAP only, no TLS, plaintext LOGIN allowed) with IDLE,
    /// CONDSTORE, QRESYNC and SPECIAL-USE folders, and no users yet.
    pub fn start() -> Result<Self> {
        Self::start_with(&DovecotOptions::default())
    }

    /// Starts Dovecot with fewer features (see [`DovecotOptions`]).
    pub fn start_with(options: &DovecotOptions) -> Result<Self> {
        let dovecot = find_binary("dovecot", &["/usr/sbin/dovecot"])
            .ok_or(HarnessError::Missing { program: "dovecot".into(), install: INSTALL })?;
        let doveadm = find_binary("doveadm", &["/usr/bin/doveadm"])
            .ok_or(HarnessError::Missing { program: "doveadm".into(), install: INSTALL })?;
        // dovecot-core alone has the master but no IMAP server.
        if !Path::new("/usr/lib/dovecot/imap").is_file() {
            return Err(HarnessError::Missing { program: "/usr/lib/dovecot/imap".into(), install: INSTALL });
        }
        if !nix::unistd::geteuid().is_root() {
            return Err(HarnessError::Invalid(
                "the Dovecot harness must run as root: dovecot starts as root and switches its login and mail \
                 processes to the dovenull and dovecot users"
                    .into(),
            ));
        }
        let mail_user = system_user("dovecot")?;
        system_user("dovenull")?;
        let mut last_err = None;
        // A free port can be taken by someone else before Dovecot binds it: retry.
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix("leasehold-dovecot-")
                .tempdir()
                .map_err(HarnessError::io("make a temp dir for Dovecot"))?;
            let port = free_port()?;
            let tls_port = match options.tls {
                Some(_) => Some(free_port()?),
                None => None,
            };
            prepare_dir(dir.path(), &mail_user)?;
            std::fs::write(dir.path().join("oauth2.conf.ext"), oauth2_config(options))
                .map_err(HarnessError::io("write oauth2.conf.ext"))?;
            std::fs::write(dir.path().join("dovecot.conf"), config(dir.path(), port, tls_port, options))
                .map_err(HarnessError::io("write dovecot.conf"))?;
            let server = Self {
                dir,
                port,
                tls_port,
                dovecot: dovecot.clone(),
                doveadm: doveadm.clone(),
                child: Mutex::new(None),
                users: Mutex::new(HashMap::new()),
            };
            match server.launch() {
                Ok(()) => return Ok(server),
                Err(e) => {
                    server.stop();
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| HarnessError::Invalid("Dovecot did not start".into())))
    }

    fn launch(&self) -> Result<()> {
        let dovecot = &self.dovecot;
        let stderr = std::fs::File::create(self.dir.path().join("dovecot.stderr"))
            .map_err(HarnessError::io("create dovecot.stderr"))?;
        let mut cmd = Command::new(dovecot);
        cmd.arg("-F").arg("-c").arg(self.config_path()).stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr);
        // Its own process group: imap processes outlive a stopped master
        // while their clients stay connected, and stop() must reach them.
        cmd.process_group(0);
        let child = spawn(cmd).map_err(HarnessError::io(format!("start {}", dovecot.display())))?;
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if ImapSession::connect(self.port).is_ok() {
                return Ok(());
            }
            let exited =
                self.child.lock().unwrap_or_else(|p| p.into_inner()).as_mut().and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                return Err(HarnessError::Unexpected {
                    what: format!("dovecot on port {} exited ({status}) before it greeted", self.port),
                    answer: format!("{}\n{}", tail(&self.dir.path().join("dovecot.stderr"), 20), self.log_tail()),
                });
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Unexpected {
                    what: format!("dovecot on port {} did not greet within {START_TIMEOUT:?}", self.port),
                    answer: self.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its IMAP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its port for TLS from the first byte (imaps), when started with
    /// [`DovecotOptions::tls`].
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// Its host: `127.0.0.1`.
    pub fn host(&self) -> &'static str {
        "127.0.0.1"
    }

    /// Its temp dir (config, log, users' homes).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Its config file, for running Dovecot's tools by hand (`doveadm -c`).
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("dovecot.conf")
    }

    /// Its log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("dovecot.log")
    }

    /// The last 50 lines of its log.
    pub fn log_tail(&self) -> String {
        tail(&self.log_path(), 50)
    }

    /// Adds one user (an IMAP login) with this password.
    pub fn add_user(&self, name: &str, password: &str) -> Result<()> {
        self.add_users([(name, password)])
    }

    /// Adds many users with one write (cheap: 500 users take milliseconds).
    /// Their folders are created at their first login.
    pub fn add_users<'a>(&self, users: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<()> {
        let mut known = self.users.lock().unwrap_or_else(|p| p.into_inner());
        let mut lines = String::new();
        let mut added = Vec::new();
        for (name, password) in users {
            check_user(name, password)?;
            if known.contains_key(name) || added.iter().any(|(n, _)| n == name) {
                return Err(HarnessError::Invalid(format!("Dovecot user {name:?} already exists")));
            }
            let _ = writeln!(lines, "{name}:{{PLAIN}}{password}");
            added.push((name.to_owned(), password.to_owned()));
        }
        let path = self.dir.path().join("users");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(HarnessError::io(format!("open {}", path.display())))?;
        file.write_all(lines.as_bytes()).map_err(HarnessError::io(format!("write {}", path.display())))?;
        known.extend(added);
        Ok(())
    }

    /// Changes the password of an existing user (Dovecot rereads the file
    /// at the next login; sessions already logged in stay).
    pub fn set_password(&self, name: &str, password: &str) -> Result<()> {
        check_user(name, password)?;
        let mut known = self.users.lock().unwrap_or_else(|p| p.into_inner());
        if !known.contains_key(name) {
            return Err(HarnessError::Invalid(format!("no Dovecot user {name:?}: add it with add_user first")));
        }
        known.insert(name.to_owned(), password.to_owned());
        let mut lines = String::new();
        for (n, p) in known.iter() {
            let _ = writeln!(lines, "{n}:{{PLAIN}}{p}");
        }
        let path = self.dir.path().join("users");
        let tmp = self.dir.path().join("users.new");
        std::fs::write(&tmp, lines).map_err(HarnessError::io(format!("write {}", tmp.display())))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))
            .map_err(HarnessError::io(format!("chmod {}", tmp.display())))?;
        std::fs::rename(&tmp, &path).map_err(HarnessError::io(format!("replace {}", path.display())))?;
        Ok(())
    }

    fn password(&self, user: &str) -> Result<String> {
        self.users
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(user)
            .cloned()
            .ok_or_else(|| HarnessError::Invalid(format!("no Dovecot user {user:?}: add it with add_user first")))
    }

    /// A logged-in IMAP session of `user`.
    pub fn imap(&self, user: &str) -> Result<ImapSession> {
        ImapSession::login(self.port, user, &self.password(user)?)
    }

    /// APPENDs one raw RFC 5322 message to `folder` of `user` over IMAP.
    pub fn append(&self, user: &str, folder: &str, raw_message: &[u8]) -> Result<Appended> {
        let mut session = self.imap(user)?;
        let appended = session.append(folder, &[], raw_message)?;
        session.logout();
        Ok(appended)
    }

    /// APPENDs many messages to `folder` of `user` over one IMAP connection
    /// (pipelined), in order.
    pub fn append_many<'m>(
        &self,
        user: &str,
        folder: &str,
        raw_messages: impl IntoIterator<Item = &'m [u8]>,
    ) -> Result<Vec<Appended>> {
        let mut session = self.imap(user)?;
        let appended = session.append_many(folder, &[], raw_messages)?;
        session.logout();
        Ok(appended)
    }

    /// APPENDs one message with flags (e.g. `["\\Seen"]`) and, when given, an
    /// INTERNALDATE (seconds since the Unix epoch) instead of now.
    pub fn append_with(
        &self,
        user: &str,
        folder: &str,
        flags: &[&str],
        internal_date: Option<i64>,
        raw_message: &[u8],
    ) -> Result<Appended> {
        let mut session = self.imap(user)?;
        let appended = match internal_date {
            Some(date) => session.append_at(folder, flags, date, raw_message)?,
            None => session.append(folder, flags, raw_message)?,
        };
        session.logout();
        Ok(appended)
    }

    /// Creates folders of `user` (`/` separates levels: `Projects/2024`).
    pub fn create_folders(&self, user: &str, folders: &[&str]) -> Result<()> {
        let mut args = vec!["mailbox", "create", "-u", user];
        args.extend_from_slice(folders);
        self.doveadm(&args).map(drop)
    }

    /// Runs `doveadm -c <config> <args>` (acting as another client) and
    /// returns its stdout.
    pub fn doveadm(&self, args: &[&str]) -> Result<String> {
        let mut cmd = Command::new(&self.doveadm);
        cmd.arg("-c").arg(self.config_path()).args(args);
        output(&format!("doveadm {}", args.join(" ")), cmd, None)
    }

    /// A folder's counters, as Dovecot reports them.
    pub fn mailbox_status(&self, user: &str, folder: &str) -> Result<MailboxStatus> {
        let out = self.doveadm(&[
            "-f",
            "tab",
            "mailbox",
            "status",
            "-u",
            user,
            "messages uidnext uidvalidity highestmodseq",
            folder,
        ])?;
        parse_status(&out).ok_or_else(|| HarnessError::Unexpected {
            what: format!("doveadm mailbox status of {user}/{folder}"),
            answer: out,
        })
    }

    /// Expunges the messages of `folder` that match a doveadm search query
    /// (e.g. `["all"]`, `["uid", "1:500"]`).
    pub fn expunge(&self, user: &str, folder: &str, query: &[&str]) -> Result<()> {
        let mut args = vec!["expunge", "-u", user, "mailbox", folder];
        args.extend_from_slice(query);
        self.doveadm(&args).map(drop)
    }

    /// Adds flags (e.g. `\Seen`) to the messages of `folder` that match `query`.
    pub fn add_flags(&self, user: &str, folder: &str, flags: &str, query: &[&str]) -> Result<()> {
        let mut args = vec!["flags", "add", "-u", user, flags, "mailbox", folder];
        args.extend_from_slice(query);
        self.doveadm(&args).map(drop)
    }

    /// Gives `folder` a new UIDVALIDITY, as a server that rebuilt it would.
    pub fn set_uid_validity(&self, user: &str, folder: &str, uid_validity: u32) -> Result<()> {
        self.doveadm(&["mailbox", "update", "-u", user, "--uid-validity", &uid_validity.to_string(), folder]).map(drop)
    }

    /// How many imap sessions are in IDLE right now (their process title
    /// says so), e.g. to know that hot accounts have settled.
    pub fn idle_sessions(&self) -> Result<usize> {
        let master = self.master_pid()?;
        Ok(imap_processes(master, "")?.into_iter().filter(|(_, title)| title.ends_with(" IDLE]")).count())
    }

    /// How many imap processes run right now: one per session, except the
    /// sessions handed to `imap-hibernate` (see
    /// [`DovecotOptions::hibernate_idle_after`]).
    pub fn imap_process_count(&self) -> Result<usize> {
        Ok(imap_processes(self.master_pid()?, "")?.len())
    }

    fn master_pid(&self) -> Result<u32> {
        self.child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|c| c.id())
            .ok_or_else(|| HarnessError::Invalid("Dovecot is stopped".into()))
    }

    /// SIGKILLs the server-side imap processes of `user` (their clients see
    /// the connection drop) and waits until they are gone; returns how many.
    pub fn kill_imap_processes(&self, user: &str) -> Result<usize> {
        let master = self.master_pid()?;
        let pids: Vec<i32> = imap_processes(master, &format!("{user} "))?.into_iter().map(|(pid, _)| pid).collect();
        kill_all(&pids, &format!("imap processes of {user}"))
    }

    /// SIGKILLs the login processes, and with them every TLS session they
    /// carry (a login process keeps a session's TLS for its whole life; the
    /// master starts new ones). Returns how many were killed.
    pub fn kill_login_processes(&self) -> Result<usize> {
        let master = self.master_pid()?;
        let pids: Vec<i32> = children_titled(master, "dovecot/imap-login")?.into_iter().map(|(pid, _)| pid).collect();
        kill_all(&pids, "the login service")
    }

    /// Starts Dovecot again on the same port with the same users and mail
    /// (after [`stop`](Self::stop), or to drop every connection at once).
    pub fn restart(&self) -> Result<()> {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.launch() {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "dovecot restart: port not free yet");
                    self.stop();
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Stops Dovecot and every process of it, imap processes with clients
    /// included (SIGTERM to its process group, SIGKILL to what is left after
    /// a grace period). Idempotent.
    pub fn stop(&self) {
        let Some(mut child) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        let group = Pid::from_raw(child.id() as i32);
        let _ = killpg(group, Signal::SIGTERM);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline && !matches!(child.try_wait(), Ok(Some(_))) {
            std::thread::sleep(Duration::from_millis(10));
        }
        // ESRCH once the whole group is gone: nothing left to kill.
        let _ = killpg(group, Signal::SIGKILL);
        let _ = child.wait();
        while killpg(group, None).is_ok() && Instant::now() < deadline + STOP_TIMEOUT {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Dovecot {
    fn drop(&mut self) {
        self.stop();
    }
}

fn system_user(name: &str) -> Result<User> {
    User::from_name(name)
        .map_err(|e| HarnessError::Io { what: format!("look up the system user {name}"), source: e.into() })?
        .ok_or(HarnessError::Missing { program: format!("the system user {name}"), install: INSTALL })
}

/// The temp dir is readable by Dovecot's unprivileged processes; the homes
/// belong to the mail user.
fn prepare_dir(dir: &Path, mail_user: &User) -> Result<()> {
    let what = || format!("prepare the Dovecot dir {}", dir.display());
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(HarnessError::io(what()))?;
    let home = dir.join("home");
    std::fs::create_dir(&home).map_err(HarnessError::io(what()))?;
    chown(&home, Some(mail_user.uid), Some(mail_user.gid))
        .map_err(|e| HarnessError::Io { what: what(), source: e.into() })?;
    std::fs::write(dir.join("users"), "").map_err(HarnessError::io(what()))?;
    std::fs::set_permissions(dir.join("users"), std::fs::Permissions::from_mode(0o644))
        .map_err(HarnessError::io(what()))
}

/// User names become paths and passwd-file fields: keep them plain.
fn check_user(name: &str, password: &str) -> Result<()> {
    let name_ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'))
        && !name.starts_with('.');
    if !name_ok {
        return Err(HarnessError::Invalid(format!(
            "Dovecot user name {name:?} is not usable: 1-64 ASCII letters, digits, '.', '_', '-' or '@', \
             not starting with '.'"
        )));
    }
    if password.is_empty() || password.contains([':', '\n', '\r']) {
        return Err(HarnessError::Invalid(format!(
            "the password of Dovecot user {name:?} must be non-empty and hold no ':' or line break"
        )));
    }
    Ok(())
}

/// The OAuth2 passdb's settings (empty without OAuth2).
fn oauth2_config(options: &DovecotOptions) -> String {
    match &options.oauth2 {
        Some(o) => format!(
            "introspection_mode = post\nintrospection_url = {}\nforce_introspection = yes\n\
             username_attribute = username\nactive_attribute = active\nactive_value = true\n",
            o.introspection_url
        ),
        None => String::new(),
    }
}

/// The config: everything in `dir`, one listener on `127.0.0.1:port`.
fn config(dir: &Path, port: u16, tls_port: Option<u16>, options: &DovecotOptions) -> String {
    let dir = dir.display();
    // The harness's own sessions stay plaintext on loopback: Dovecot
    // counts a connection from its own address as secured, so LOGIN works
    // there even with ssl = required, while clients of other addresses and
    // every TLS handshake see the certificate.
    let (ssl, imaps) = match (&options.tls, tls_port) {
        (Some(t), Some(tls_port)) => (
            format!("ssl = required\nssl_cert = <{}\nssl_key = <{}", t.cert.display(), t.key.display()),
            format!("  inet_listener imaps {{\n    address = 127.0.0.1\n    port = {tls_port}\n    ssl = yes\n  }}\n"),
        ),
        _ => ("ssl = no".to_string(), String::new()),
    };
    let mut folders = String::new();
    for (name, use_) in SPECIAL_FOLDERS {
        let special = if options.special_use { format!("\n    special_use = {use_}") } else { String::new() };
        let _ = write!(folders, "  mailbox {name} {{{special}\n    auto = subscribe\n  }}\n");
    }
    let extra = options.extra_capabilities.join(" ");
    let capability = if options.hidden_capabilities.is_empty() {
        if extra.is_empty() {
            String::new()
        } else {
            format!("  imap_capability = +{extra}\n")
        }
    } else {
        let mut kept: Vec<&str> = FULL_CAPABILITY
            .split_whitespace()
            .filter(|c| !options.hidden_capabilities.iter().any(|h| h.eq_ignore_ascii_case(c)))
            .collect();
        kept.extend(options.extra_capabilities.iter().map(String::as_str));
        format!("  imap_capability = {}\n", kept.join(" "))
    };
    let (mechanisms, oauth2_passdb, password_mechanisms) = match &options.oauth2 {
        Some(o) => (
            format!("{} {}", options.auth_mechanisms, o.mechanisms),
            format!(
                "passdb {{\n  driver = oauth2\n  mechanisms = {}\n  args = {dir}/oauth2.conf.ext\n}}\n",
                o.mechanisms
            ),
            format!("\n  mechanisms = {}", options.auth_mechanisms),
        ),
        None => (options.auth_mechanisms.clone(), String::new(), String::new()),
    };
    let clients = options.max_clients.max(DEFAULT_MAX_CLIENTS);
    // Every held IDLE is an imap process unless it hibernates.
    let limits = format!(
        "# {clients} connections at once, each its own imap process until it hibernates.\n\
         default_process_limit = {}\ndefault_client_limit = {}\n",
        clients + 100,
        (3 * clients + 400).max(6400),
    );
    // A login process keeps each TLS session (OpenSSL's buffers, about
    // 90 KB, and its proxy socket) for the session's life: a thousand per
    // process stays inside its descriptors and 1 GiB of address space. At
    // Dovecot's default 256 MiB, a sync-hot run of 3,000 TLS sessions in
    // one login process lost them all at once.
    let login_processes = if clients > DEFAULT_MAX_CLIENTS {
        format!("  process_min_avail = {}\n  client_limit = 1000\n  vsz_limit = 1G\n", clients.div_ceil(1000))
    } else {
        "  process_min_avail = 1\n".to_string()
    };
    let hibernate = match options.hibernate_idle_after {
        Some(after) => format!(
            "imap_hibernate_timeout = {}s\n\
             service imap {{\n  unix_listener imap-master {{\n    user = $default_internal_user\n  }}\n  \
             extra_groups = $default_internal_group\n}}\n\
             service imap-hibernate {{\n  client_limit = {}\n  unix_listener imap-hibernate {{\n    mode = 0660\n    \
             group = $default_internal_group\n  }}\n}}\n",
            after.as_secs().max(1),
            clients + 100,
        ),
        None => String::new(),
    };
    format!(
        r#"# A private Dovecot for leasehold's tests (sync_worker::testing::Dovecot).
protocols = imap
listen = 127.0.0.1
base_dir = {dir}/run
state_dir = {dir}/state
log_path = {dir}/dovecot.log
{ssl}
disable_plaintext_auth = no
auth_mechanisms = {mechanisms}
auth_verbose = yes
default_login_user = dovenull
default_internal_user = dovecot
default_internal_group = dovecot
first_valid_uid = 1
mail_location = maildir:~/Maildir
mail_fsync = never
verbose_proctitle = yes
{limits}{oauth2_passdb}passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {dir}/users{password_mechanisms}
}}
userdb {{
  driver = static
  args = uid=dovecot gid=dovecot home={dir}/home/%u
}}
service imap-login {{
  chroot =
  # High-performance mode: a few login processes serve every connection.
  service_count = 0
{login_processes}  inet_listener imap {{
    address = 127.0.0.1
    port = {port}
  }}
{imaps}}}
service anvil {{
  chroot =
}}
{hibernate}protocol imap {{
  mail_max_userip_connections = 1000
{capability}}}
namespace inbox {{
  inbox = yes
  separator = /
{folders}}}
"#
    )
}

/// Parses `doveadm -f tab mailbox status 'messages uidnext uidvalidity highestmodseq'`.
fn parse_status(out: &str) -> Option<MailboxStatus> {
    let mut lines = out.lines();
    let names: Vec<&str> = lines.next()?.split('\t').collect();
    let values: Vec<&str> = lines.next()?.split('\t').collect();
    let get = |name: &str| names.iter().position(|n| *n == name).and_then(|i| values.get(i)).copied();
    Some(MailboxStatus {
        messages: get("messages")?.parse().ok()?,
        uid_next: get("uidnext")?.parse().ok()?,
        uid_validity: get("uidvalidity")?.parse().ok()?,
        highest_modseq: get("highestmodseq")?.parse().ok()?,
    })
}

/// The imap processes (pid, title) under this Dovecot's master whose title
/// (`verbose_proctitle`: `dovecot/imap [<user> <ip> <state>]`) continues
/// with `user_prefix` after the bracket (`"alice "`: alice's; `""`: all).
fn imap_processes(master: u32, user_prefix: &str) -> Result<Vec<(i32, String)>> {
    children_titled(master, &format!("dovecot/imap [{user_prefix}"))
}

/// SIGKILLs `pids` (processes of `whose`) and waits until they are gone;
/// returns how many there were.
fn kill_all(pids: &[i32], whose: &str) -> Result<usize> {
    for pid in pids {
        // A process that already exited is fine: it is gone either way.
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    while pids.iter().any(|pid| is_running(*pid)) {
        if Instant::now() > deadline {
            return Err(HarnessError::Invalid(format!("processes {pids:?} of {whose} survived SIGKILL")));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(pids.len())
}

/// The children of `master` (pid, title) whose title starts with `title`.
fn children_titled(master: u32, title: &str) -> Result<Vec<(i32, String)>> {
    let mut pids = Vec::new();
    let proc_dir = std::fs::read_dir("/proc").map_err(HarnessError::io("list /proc"))?;
    for entry in proc_dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        // Processes come and go while we look: skip the ones that vanish.
        let (Ok(stat), Ok(cmdline)) =
            (std::fs::read_to_string(entry.path().join("stat")), std::fs::read(entry.path().join("cmdline")))
        else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline);
        let cmdline = cmdline.trim_end_matches('\0');
        if parent_of(&stat) == Some(master) && cmdline.starts_with(title) {
            pids.push((pid, cmdline.to_owned()));
        }
    }
    Ok(pids)
}

/// The parent pid from `/proc/<pid>/stat` (the field after `(comm) state`).
fn parent_of(stat: &str) -> Option<u32> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.split_whitespace().nth(1)?.parse().ok()
}

/// Whether `pid` still runs (a zombie waiting for its reaper does not).
fn is_running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()) != Some("Z"),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_parsed_from_doveadm_tab_output() {
        let out = "messages\tuidnext\tuidvalidity\thighestmodseq\n3\t4\t1796113302\t7\n";
        assert_eq!(
            parse_status(out),
            Some(MailboxStatus { messages: 3, uid_next: 4, uid_validity: 1796113302, highest_modseq: 7 })
        );
        assert_eq!(parse_status("messages\n"), None);
    }

    #[test]
    fn parent_pid_is_read_past_the_command_name() {
        assert_eq!(parent_of("4242 (imap (weird) name) S 77 4242 4242 0"), Some(77));
    }

    #[test]
    fn user_names_and_passwords_are_checked() {
        assert!(check_user("user-001@example.test", "pw").is_ok());
        assert!(check_user("../etc", "pw").is_err());
        assert!(check_user("alice", "a:b").is_err());
        assert!(check_user("", "pw").is_err());
    }
}
