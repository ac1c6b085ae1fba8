//! Private Redis servers for tests and benchmarks (feature `test-support`).
//!
//! Convention for every Redis-backed test of the workspace:
//!
//! * [`redis_url`]: `REDIS_URL` when it is set, otherwise a private
//!   `redis-server` on a free loopback port with a temp dir, started once per
//!   test process and shared ([`shared_server`]).
//! * [`cluster_url`]: `REDIS_CLUSTER_URL` when it is set (a
//!   `redis+cluster://` URL), otherwise a private 3-master Redis Cluster on
//!   loopback, started once per test process and shared ([`shared_cluster`]).
//! * [`RedisServer::start`]: a server of the test's own, which it may kill and
//!   restart (fault tests).
//! * A missing `redis-server` / `redis-cli` binary is a failure with a clear
//!   message (a panic), never a skip: in CI (`CI=true`) and locally alike.
//!
//! Each test isolates its keys with [`unique_prefix`]. Servers die with the
//! test process: they are spawned from one long-lived thread with
//! `PR_SET_PDEATHSIG`, so even a test binary that is killed leaves no server
//! behind; dropping a [`RedisServer`] kills it at once.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a server may take to answer its first PING.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Panics with a clear message when `program` is not installed.
pub fn require_binary(program: &str) {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false);
    if !found {
        let ci = if is_ci() { " (CI=true: Redis-backed tests never skip)" } else { "" };
        panic!(
            "{program} is not installed, and the Redis-backed tests need it{ci}: install Debian's redis-server and \
             redis-tools packages (`cargo xtask setup` does), or point REDIS_URL (and REDIS_CLUSTER_URL for the \
             cluster tests) at a running Redis"
        );
    }
}

/// Whether this runs in CI (`CI=true`).
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A key prefix no other test (or process) uses: `<tag>-<pid>-<n>-<nanos>`.
pub fn unique_prefix(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{tag}-{}-{}-{nanos}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// The URL of the single Redis tests use: `REDIS_URL`, or the shared private server.
pub fn redis_url() -> String {
    match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => shared_server().url(),
    }
}

/// The URL of the Redis Cluster tests use: `REDIS_CLUSTER_URL`, or the shared private cluster.
pub fn cluster_url() -> String {
    match std::env::var("REDIS_CLUSTER_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => shared_cluster().url(),
    }
}

/// The private server of this process, started on first use.
pub fn shared_server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(|| RedisServer::start().unwrap_or_else(|e| panic!("{e}")))
}

/// The private 3-master cluster of this process, started on first use.
pub fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3).unwrap_or_else(|e| panic!("{e}")))
}

// ---------------------------------------------------------------------------
// Spawning that cannot leak servers
// ---------------------------------------------------------------------------

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `cmd` from a thread that lives as long as the process, with
/// `PR_SET_PDEATHSIG = SIGKILL` (the signal fires when the spawning *thread*
/// exits, so the spawner must be long-lived, not a test's runtime thread).
fn spawn(cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("redis-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let parent = std::process::id() as libc::pid_t;
                    // SAFETY: prctl and getppid are async-signal-safe; the closure
                    // allocates nothing and touches no locks.
                    unsafe {
                        cmd.pre_exec(move || {
                            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                                return Err(std::io::Error::last_os_error());
                            }
                            if libc::getppid() != parent {
                                // The test process died between fork and prctl.
                                libc::_exit(1);
                            }
                            Ok(())
                        });
                    }
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("start the redis-spawner thread");
        Mutex::new(tx)
    });
    let (tx, rx) = mpsc::channel();
    spawner
        .lock()
        .map_err(|_| std::io::Error::other("redis-spawner lock poisoned"))?
        .send((cmd, tx))
        .map_err(|_| std::io::Error::other("redis-spawner thread is gone"))?;
    rx.recv().map_err(|_| std::io::Error::other("redis-spawner thread is gone"))?
}

/// A free loopback port (and, for cluster nodes, its bus port +10000 too).
fn free_port(with_bus: bool) -> Result<u16, String> {
    for _ in 0..100 {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free loopback port: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        if !with_bus {
            return Ok(port);
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return Ok(port);
        }
    }
    Err("no free loopback port pair for a cluster node".into())
}

/// Sends one inline command and returns what the server answered (raw RESP).
fn raw_command(port: u16, command: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(format!("{command}\r\n").as_bytes())?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::new();
    loop {
        let n = stream.read(&mut buf)?;
        out.extend_from_slice(&buf[..n]);
        if n == 0 || out.ends_with(b"\r\n") {
            // A bulk reply may arrive in pieces: stop once the declared length is in.
            let text = String::from_utf8_lossy(&out).into_owned();
            if let Some(rest) = text.strip_prefix('$') {
                if let Some((len, body)) = rest.split_once("\r\n") {
                    if let Ok(len) = len.parse::<usize>() {
                        if body.len() < len + 2 && n != 0 {
                            continue;
                        }
                    }
                }
            }
            return Ok(text);
        }
    }
}

// ---------------------------------------------------------------------------
// One server
// ---------------------------------------------------------------------------

/// A private `redis-server` on a loopback port, with its own temp dir. It is
/// killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    child: Mutex<Option<Child>>,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server (no persistence) on a free loopback port.
    pub fn start() -> Result<Self, String> {
        Self::start_with(&[], false)
    }

    /// Starts a server with extra `redis-server` arguments; `cluster_bus` picks
    /// a port whose cluster bus port is free too.
    pub fn start_with(extra: &[&str], cluster_bus: bool) -> Result<Self, String> {
        require_binary("redis-server");
        let mut last_err = String::new();
        // A free port can be taken by someone else before the server binds it: retry.
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix("leasehold-redis-")
                .tempdir()
                .map_err(|e| format!("cannot make a temp dir for redis-server: {e}"))?;
            let port = free_port(cluster_bus)?;
            let server =
                Self { port, dir, child: Mutex::new(None), extra: extra.iter().map(|s| (*s).to_owned()).collect() };
            match server.launch() {
                Ok(()) => return Ok(server),
                Err(e) => last_err = e,
            }
        }
        Err(last_err)
    }

    fn launch(&self) -> Result<(), String> {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn(cmd).map_err(|e| format!("cannot start redis-server: {e}"))?;
        *self.child.lock().map_err(|_| "server lock poisoned")? = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(reply) = raw_command(self.port, "PING") {
                if reply.starts_with("+PONG") {
                    return Ok(());
                }
            }
            if let Some(status) =
                self.child.lock().ok().and_then(|mut c| c.as_mut().and_then(|c| c.try_wait().ok().flatten()))
            {
                return Err(format!(
                    "redis-server on port {} exited ({status}) before it answered; its log:\n{}",
                    self.port,
                    self.log_tail()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("redis-server on port {} did not answer within {START_TIMEOUT:?}", self.port));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Its temp dir.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Kills the server (SIGKILL) and waits for it to exit. Idempotent.
    pub fn kill(&self) {
        if let Ok(mut child) = self.child.lock() {
            if let Some(mut c) = child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// Starts the server again on the same port (with empty data: no persistence).
    pub fn restart(&self) -> Result<(), String> {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.launch() {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "restart: port not free yet");
                    self.kill();
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends one inline command and returns the raw RESP answer.
    pub fn command(&self, command: &str) -> std::io::Result<String> {
        raw_command(self.port, command)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---------------------------------------------------------------------------
// A cluster
// ---------------------------------------------------------------------------

/// A private Redis Cluster of masters only, on loopback.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` cluster-enabled servers and joins them with
    /// `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`.
    pub fn start(masters: usize) -> Result<Self, String> {
        Self::create(masters, 0, "5000")
    }

    /// Starts `masters` masters with `replicas` replicas each (a cluster that
    /// survives the loss of a master: its replica is promoted), with a
    /// 1 s node timeout so a failover takes about two seconds.
    pub fn start_with_replicas(masters: usize, replicas: usize) -> Result<Self, String> {
        Self::create(masters, replicas, "1000")
    }

    fn create(masters: usize, replicas: usize, node_timeout_ms: &str) -> Result<Self, String> {
        require_binary("redis-server");
        require_binary("redis-cli");
        let count = masters * (1 + replicas);
        let mut nodes = Vec::with_capacity(count);
        for _ in 0..count {
            nodes.push(RedisServer::start_with(
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    node_timeout_ms,
                ],
                true,
            )?);
        }
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run redis-cli --cluster create: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create {addrs:?} --cluster-replicas {replicas} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let cluster = Self { nodes };
        cluster.wait_ok()?;
        Ok(cluster)
    }

    fn wait_ok(&self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        let n = self.nodes.len();
        loop {
            let ready = self.nodes.iter().all(|node| {
                node.command("CLUSTER INFO").is_ok_and(|info| {
                    info.contains("cluster_state:ok")
                        && info.contains("cluster_slots_assigned:16384")
                        && info.contains(&format!("cluster_known_nodes:{n}"))
                })
            });
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("the Redis Cluster on {} did not reach cluster_state:ok in time", self.url()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,...`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// Its nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }
}
