//! Fresh Postgres databases for tests, and private Postgres servers for
//! tests that inject faults.
//!
//! Databases are created and dropped with `psql` (Debian's
//! `postgresql-client`): the harness only runs `CREATE DATABASE` /
//! `DROP DATABASE` and a few checking queries, and a SQL client crate of its
//! own would be a second driver next to the storage's sqlx, for no gain.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use leasehold_core::backend_url::redact_url;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::{chown, Pid, User};

use super::{find_binary, free_port, output, spawn, tail, unique_name, HarnessError, Result};

/// The machine's server, when `TEST_POSTGRES_URL` is not set.
pub const DEFAULT_SERVER_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
/// How long a private server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stopping server may take before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Every test database's name starts with this.
const PREFIX: &str = "lh_";
/// Separates the fields of `psql` output (ASCII unit separator).
const FIELD_SEP: char = '\u{1f}';

/// A fresh, uniquely named database of its own for one test; dropped (with
/// `WITH (FORCE)`, so open connections do not keep it) when this is dropped.
#[derive(Debug)]
pub struct Postgres {
    server_url: String,
    name: String,
    url: String,
    psql: PathBuf,
}

impl Postgres {
    /// The server tests use: `TEST_POSTGRES_URL`, else `postgres://postgres@127.0.0.1:5432/postgres`.
    pub fn server_url() -> String {
        match std::env::var("TEST_POSTGRES_URL") {
            Ok(url) if !url.is_empty() => url,
            _ => DEFAULT_SERVER_URL.to_owned(),
        }
    }

    /// Creates a fresh database on [`server_url`](Self::server_url), named
    /// after `tag` (e.g. the test's name) plus a unique suffix.
    pub fn fresh(tag: &str) -> Result<Self> {
        Self::fresh_on(&Self::server_url(), tag)
    }

    /// Creates a fresh database on the server at `server_url` (any database
    /// URL of that server: the harness connects to it to create the new one).
    pub fn fresh_on(server_url: &str, tag: &str) -> Result<Self> {
        let psql = psql()?;
        drop_leftovers_once(&psql, server_url);
        let name = unique_name(&format!("{PREFIX}{tag}"));
        let url = with_database(server_url, &name)?;
        run_psql(&psql, server_url, &format!("CREATE DATABASE \"{name}\""), "create a test database").map_err(|e| {
            match e {
                HarnessError::Command { what, status, output } => HarnessError::Command {
                    what: format!(
                        "{what} on {} (is Postgres running there? `cargo xtask test` starts the machine's \
                         server; or set TEST_POSTGRES_URL)",
                        redact_url(server_url)
                    ),
                    status,
                    output,
                },
                other => other,
            }
        })?;
        Ok(Self { server_url: server_url.to_owned(), name, url, psql })
    }

    /// The database's URL (`postgres://…/<name>`), e.g. for `DATABASE_URL`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs SQL statements in this database.
    pub fn execute(&self, sql: &str) -> Result<()> {
        run_psql(&self.psql, &self.url, sql, "run SQL in the test database").map(drop)
    }

    /// Runs one query in this database; its rows, each a list of text
    /// values (NULL as the empty string).
    pub fn query(&self, sql: &str) -> Result<Vec<Vec<String>>> {
        let out = run_psql(&self.psql, &self.url, sql, "query the test database")?;
        Ok(out
            .split('\0')
            .map(|row| row.trim_end_matches('\n'))
            .filter(|row| !row.is_empty())
            .map(|row| row.split(FIELD_SEP).map(str::to_owned).collect())
            .collect())
    }

    /// The single value of a one-row, one-column query (e.g. `SELECT count(*) …`).
    pub fn query_one(&self, sql: &str) -> Result<String> {
        let rows = self.query(sql)?;
        match rows.as_slice() {
            [row] if row.len() == 1 => Ok(row[0].clone()),
            _ => Err(HarnessError::Unexpected { what: format!("one value from {sql:?}"), answer: format!("{rows:?}") }),
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        if let Err(e) = run_psql(&self.psql, &self.server_url, &sql, "drop the test database") {
            tracing::warn!(database = %self.name, error = %e, "could not drop a test database");
        }
    }
}

/// Drops, once per process and server, the test databases that killed test
/// processes left behind (a killed process runs no `Drop`): those whose
/// name's pid (`lh_<tag>_<pid>_<n>_<nanos>`) no longer runs. Only on a
/// loopback server: pids mean nothing across machines.
fn drop_leftovers_once(psql: &Path, server_url: &str) {
    static CLEANED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut cleaned = CLEANED.lock().unwrap_or_else(|p| p.into_inner());
    if cleaned.iter().any(|u| u == server_url) {
        return;
    }
    cleaned.push(server_url.to_owned());
    let host = server_url.split("://").nth(1).and_then(|rest| rest.split('/').next()).unwrap_or_default();
    let host = host.rsplit('@').next().unwrap_or_default();
    if !(host.starts_with("127.0.0.1") || host.starts_with("localhost") || host.starts_with("[::1]")) {
        return;
    }
    let listing = format!("SELECT datname FROM pg_database WHERE starts_with(datname, '{PREFIX}')");
    let Ok(names) = run_psql(psql, server_url, &listing, "list test databases") else {
        return;
    };
    for name in names.split('\0').map(str::trim).filter(|n| !n.is_empty()) {
        let Some(pid) = pid_of(name) else { continue };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
        match run_psql(psql, server_url, &sql, "drop a leftover test database") {
            Ok(_) => tracing::info!(database = %name, "dropped a test database left by a dead process"),
            Err(e) => tracing::debug!(database = %name, error = %e, "could not drop a leftover test database"),
        }
    }
}

/// The creating pid in a test database's name: the third field from the end.
fn pid_of(name: &str) -> Option<u32> {
    let mut fields = name.rsplit('_');
    let (_nanos, _n) = (fields.next()?, fields.next()?);
    fields.next()?.parse().ok()
}

fn psql() -> Result<PathBuf> {
    find_binary("psql", &["/usr/bin/psql"]).ok_or(HarnessError::Missing {
        program: "psql".into(),
        install: "install Debian's postgresql-client package (`cargo xtask setup` does)",
    })
}

fn run_psql(psql: &Path, url: &str, sql: &str, what: &str) -> Result<String> {
    let mut cmd = Command::new(psql);
    cmd.env("PGCONNECT_TIMEOUT", "5")
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-0"])
        .arg(format!("--field-separator={FIELD_SEP}"))
        .arg("-d")
        .arg(url)
        .arg("-c")
        .arg(sql);
    output(what, cmd, None)
}

/// `url` with its database (the path) replaced by `database`; a query string is kept.
fn with_database(url: &str, database: &str) -> Result<String> {
    let bad = || {
        HarnessError::Invalid(format!(
            "{} is not a postgres:// URL (expected postgres://user@host:port/database)",
            redact_url(url)
        ))
    };
    let rest = url.strip_prefix("postgres://").or_else(|| url.strip_prefix("postgresql://")).ok_or_else(bad)?;
    let scheme = &url[..url.len() - rest.len()];
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let authority = before_query.split('/').next().filter(|a| !a.is_empty()).ok_or_else(bad)?;
    Ok(match query {
        Some(q) => format!("{scheme}{authority}/{database}?{q}"),
        None => format!("{scheme}{authority}/{database}"),
    })
}

/// A private Postgres server (`initdb` + `postgres` from Debian's
/// `postgresql`) on a free loopback port with trust auth, for a test that
/// kills or restarts its server. Removed on drop.
#[derive(Debug)]
pub struct PostgresServer {
    dir: tempfile::TempDir,
    port: u16,
    bin: PathBuf,
    /// Postgres refuses to run as root: as root, it runs as `postgres`.
    run_as: Option<User>,
    child: Mutex<Option<Child>>,
}

impl PostgresServer {
    /// Runs `initdb` in a temp dir and starts the server on a free port.
    pub fn start() -> Result<Self> {
        let bin = postgres_bin_dir()?;
        let run_as = if nix::unistd::geteuid().is_root() {
            let user = User::from_name("postgres")
                .map_err(|e| HarnessError::Io { what: "look up the postgres user".into(), source: e.into() })?
                .ok_or(HarnessError::Missing {
                    program: "the system user postgres".into(),
                    install: "install Debian's postgresql package",
                })?;
            Some(user)
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("leasehold-postgres-")
            .tempdir()
            .map_err(HarnessError::io("make a temp dir for Postgres"))?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(HarnessError::io("make the Postgres dir readable"))?;
        if let Some(user) = &run_as {
            chown(dir.path(), Some(user.uid), Some(user.gid))
                .map_err(|e| HarnessError::Io { what: "give the Postgres dir to postgres".into(), source: e.into() })?;
        }
        let mut initdb = Command::new(bin.join("initdb"));
        initdb.arg("-D").arg(dir.path().join("data")).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]);
        let server = Self { dir, port: 0, bin, run_as, child: Mutex::new(None) };
        output("initdb", server.as_owner(initdb), None)?;
        let mut last_err = None;
        let mut server = server;
        // A free port can be taken by someone else before the server binds it: retry.
        for _ in 0..5 {
            server.port = free_port()?;
            match server.launch() {
                Ok(()) => return Ok(server),
                Err(e) => {
                    server.kill_group();
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| HarnessError::Invalid("Postgres did not start".into())))
    }

    fn as_owner(&self, mut cmd: Command) -> Command {
        cmd.current_dir(self.dir.path());
        if let Some(user) = &self.run_as {
            cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        cmd
    }

    fn launch(&self) -> Result<()> {
        let log = std::fs::File::create(self.log_path()).map_err(HarnessError::io("create the Postgres log"))?;
        if let Some(user) = &self.run_as {
            chown(&self.log_path(), Some(user.uid), Some(user.gid))
                .map_err(|e| HarnessError::Io { what: "give the Postgres log to postgres".into(), source: e.into() })?;
        }
        let mut cmd = Command::new(self.bin.join("postgres"));
        cmd.arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-p", &self.port.to_string(), "-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.dir.path().display()))
            // fsync only guards against a machine crash, which tests never
            // simulate; commits stay synchronous so a killed server loses nothing.
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let mut cmd = self.as_owner(cmd);
        // Its own process group, so that a kill reaches the backends at once.
        cmd.process_group(0);
        let child = spawn(cmd).map_err(HarnessError::io("start postgres"))?;
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let mut ready = Command::new(self.bin.join("pg_isready"));
            ready.args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres"]);
            if ready.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success()) {
                return Ok(());
            }
            let exited =
                self.child.lock().unwrap_or_else(|p| p.into_inner()).as_mut().and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                return Err(HarnessError::Unexpected {
                    what: format!("postgres on port {} exited ({status}) before it accepted connections", self.port),
                    answer: self.log_tail(),
                });
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Unexpected {
                    what: format!("postgres on port {} did not accept connections within {START_TIMEOUT:?}", self.port),
                    answer: self.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A fresh database on this server.
    pub fn fresh_database(&self, tag: &str) -> Result<Postgres> {
        Postgres::fresh_on(&self.url(), tag)
    }

    /// Its log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    /// The last 50 lines of its log.
    pub fn log_tail(&self) -> String {
        tail(&self.log_path(), 50)
    }

    /// Kills the server and its backends (SIGKILL), as a crash would. Idempotent.
    pub fn kill(&self) {
        self.kill_group();
    }

    /// Stops the server and all its backends where they stand (SIGSTOP), as
    /// a stalled machine would: connections stay open, and nothing answers
    /// until [`resume`](Self::resume). The postmaster first, so it forks no
    /// new backend meanwhile.
    pub fn pause(&self) {
        self.signal_all(Signal::SIGSTOP);
    }

    /// Lets a [`pause`](Self::pause)d server run on (SIGCONT).
    pub fn resume(&self) {
        self.signal_all(Signal::SIGCONT);
    }

    /// Signals the postmaster and each of its children. Not its process
    /// group: every Postgres child calls `setsid`, so each is a group of its own.
    fn signal_all(&self, signal: Signal) {
        let Some(pid) = self.child.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|c| c.id() as i32) else {
            return;
        };
        let _ = kill(Pid::from_raw(pid), signal);
        for child in children_of(pid) {
            let _ = kill(Pid::from_raw(child), signal);
        }
    }

    /// Starts the server again on the same port with the same data (after a
    /// [`kill`](Self::kill), Postgres recovers from its WAL first).
    pub fn restart(&self) -> Result<()> {
        self.kill_group();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.launch() {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "postgres restart: port not free yet");
                    self.kill_group();
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn kill_group(&self) {
        if let Some(mut child) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
    }

    /// Immediate shutdown (SIGQUIT), which, unlike SIGKILL, also frees the
    /// server's shared memory; SIGKILL after a grace period.
    fn stop(&self) {
        let Some(mut child) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGQUIT);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
        let _ = child.wait();
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        // A paused server would not hear the shutdown signal.
        self.resume();
        self.stop();
    }
}

/// The newest `/usr/lib/postgresql/<version>/bin` holding `initdb` and
/// `postgres`, or `pg_config --bindir`.
fn postgres_bin_dir() -> Result<PathBuf> {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            has_server(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|dir| has_server(dir));
    from_pg_config.ok_or(HarnessError::Missing {
        program: "initdb and postgres".into(),
        install: "install Debian's postgresql package (its binaries live in /usr/lib/postgresql/<version>/bin)",
    })
}

/// The pids whose parent is `parent` (from `/proc/*/stat`).
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            // `pid (comm) state ppid ...`; comm may hold spaces, so split after its last ')'.
            std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().is_some_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok())
                    .is_some_and(|ppid| ppid == parent)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_of_a_url_is_replaced() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "t1").expect("valid"),
            "postgres://postgres@127.0.0.1:5432/t1"
        );
        assert_eq!(
            with_database("postgresql://u:p@db:5433?sslmode=disable", "t1").expect("valid"),
            "postgresql://u:p@db:5433/t1?sslmode=disable"
        );
        assert!(with_database("mysql://x/y", "t1").is_err());
        assert!(with_database("postgres:///db", "t1").is_err());
    }

    #[test]
    fn the_creating_pid_is_read_from_a_database_name() {
        assert_eq!(pid_of("lh_some_test_4242_7_123456"), Some(4242));
        assert_eq!(pid_of("lh_x"), None);
        assert!(unique_name("lh_a_b").starts_with("lh_a_b_"));
        assert_eq!(pid_of(&unique_name("lh_a_b")), Some(std::process::id()));
    }

    #[test]
    fn passwords_are_hidden_in_messages() {
        assert_eq!(redact_url("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert!(!redact_url("postgres://secret@h/db").contains("secret"));
    }
}
