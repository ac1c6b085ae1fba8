//! `cargo xtask`: the project's one entry point for tests and benchmarks.
//!
//! * `cargo xtask test` installs what the tests need when it is missing
//!   (redis-server, dovecot-imapd, postgresql and its client from Debian's
//!   packages), makes sure Postgres answers at 127.0.0.1:5432 (or at
//!   `TEST_POSTGRES_URL`), starting the machine's cluster when it is down,
//!   then runs the format check,
//!   clippy with `-D warnings` and every test of the workspace. It starts one
//!   private 3-master Redis Cluster on loopback for the cluster suites (passed
//!   on as `REDIS_CLUSTER_URL` unless that is already set); other tests start
//!   their own private servers on free loopback ports. Before the tests it
//!   runs the library examples (`examples/library`) on `mem://` and on a
//!   private redis-server.
//! * `cargo xtask bench NAME` runs one benchmark in release mode; it prints
//!   readable lines and ends with one JSON line of figures.
//! * `cargo xtask bench --list` names the benchmarks.
//! * `cargo xtask examples` runs only the library examples, as `test` does.
//! * `cargo xtask soak [--secs N] [--seed N]` runs sync-worker's fencing
//!   soak (two worker processes, 20 accounts, 20 random pauses, kills and
//!   empty Redis restarts while mail changes) for 5 minutes; `test` runs
//!   the same soak for 45 s.
//! * `cargo xtask demo` installs Dovecot when it is missing, then runs
//!   sync-worker's first-run demo (`crates/sync-worker/examples/demo.rs`): a
//!   private Dovecot with a demo mailbox and `serve` with a login that
//!   already has its account; it prints the URL and the login.
//! * `cargo xtask imports [--root DIR]` lists the import circles of more than
//!   two files in hopper's and sync-worker's `src/` (of this workspace, or of
//!   the workspace at DIR), and fails when there is one (see [`imports`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

mod imports;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "leasehold's test and benchmark driver")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Format check, clippy -D warnings and every test of the workspace.
    Test {
        /// Skip the format check and clippy (tests only).
        #[arg(long)]
        no_lint: bool,
        /// Extra arguments passed to the test runner (e.g. a test name filter).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Run one benchmark (release build); ends with one JSON line of figures.
    Bench {
        /// The benchmark to run.
        name: Option<String>,
        /// List the benchmarks.
        #[arg(long)]
        list: bool,
    },
    /// Install what the tests need: redis-server, redis-tools, openssl, dovecot-imapd, postgresql,
    /// postgresql-client, chromium, ruby-rspec, ruby-rspec-retry (Debian), a venv with pytest, pytest-xdist, pytest-rerunfailures and junitparser (target/pytest-venv), one with schemathesis (target/schemathesis-venv).
    Setup,
    /// Run the library examples (examples/library) on mem:// and on a private redis-server.
    Examples,
    /// sync-worker's fencing soak: 2 worker processes, 20 accounts, random pauses, kills and empty
    /// Redis restarts while mail is appended, expunged and flagged (5 minutes, 20 faults by default).
    Soak {
        /// Its length in seconds.
        #[arg(long, default_value_t = 300)]
        secs: u64,
        /// How many faults it injects, spread evenly (default: 20 for 5 minutes or more).
        #[arg(long)]
        faults: Option<u64>,
        /// The random seed (a run prints its own, to replay a failure).
        #[arg(long)]
        seed: Option<u64>,
    },
    /// sync-worker's first-run demo: a private Dovecot with demo mail (a new message every 20 s) and
    /// `sync-worker serve` with a demo login that has the account; prints the URL and the login.
    Demo,
    /// List the import circles of more than two files in hopper's and sync-worker's src/.
    Imports {
        /// The workspace whose apps to read (default: this one).
        #[arg(long)]
        root: Option<PathBuf>,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root()?;
    match cli.command {
        Cmd::Test { no_lint, args } => test(&root, no_lint, &args),
        Cmd::Bench { name, list } => bench(&root, name.as_deref(), list),
        Cmd::Setup => setup(&root),
        Cmd::Examples => run_library_examples(&root),
        Cmd::Soak { secs, faults, seed } => soak(&root, secs, faults, seed),
        Cmd::Demo => demo(&root),
        Cmd::Imports { root: other } => print_import_circles(other.as_deref().unwrap_or(&root)),
    }
}

/// Runs the fencing soak test of `crates/sync-worker/tests/fence.rs` with
/// its length, fault count and seed.
fn soak(root: &Path, secs: u64, faults: Option<u64>, seed: Option<u64>) -> Result<()> {
    setup(root)?;
    ensure_postgres()?;
    let mut cmd = cargo();
    cmd.current_dir(root)
        .args(["test", "-p", "sync-worker", "--test", "fence", "--", "--exact", "--nocapture"])
        .arg("a_soak_of_pauses_kills_and_empty_redis_restarts_keeps_every_row_fenced")
        .env("SOAK_SECS", secs.to_string());
    if let Some(faults) = faults {
        cmd.env("SOAK_FAULTS", faults.to_string());
    }
    if let Some(seed) = seed {
        cmd.env("SOAK_SEED", seed.to_string());
    }
    run("soak", cmd)
}

/// Installs Dovecot when it is missing (nothing else the tests need), then
/// runs the demo example.
fn demo(root: &Path) -> Result<()> {
    install_packages(DEMO_PACKAGES)?;
    let mut cmd = cargo();
    cmd.current_dir(root).args(["run", "-q", "-p", "sync-worker", "--features", "test-support", "--example", "demo"]);
    run("demo", cmd)
}

/// What the demo needs of [`SYSTEM_PACKAGES`]: Dovecot.
const DEMO_PACKAGES: &[(&str, &str)] = &[("/usr/lib/dovecot/imap", "dovecot-imapd"), ("doveadm", "dovecot-core")];

/// Prints each app's import circles; fails when any app has one.
fn print_import_circles(root: &Path) -> Result<()> {
    let mut total = 0;
    for (src, found) in imports::app_circles(root)? {
        println!("{}: {} import circle(s) of more than two files", root.join(&src).display(), found.len());
        for circle in &found {
            print!("{circle}");
        }
        total += found.len();
    }
    if total > 0 {
        bail!("{total} import circle(s) of more than two files (a crate's own errors.rs is left out)");
    }
    Ok(())
}

fn workspace_root() -> Result<PathBuf> {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().map(Path::to_path_buf).context("xtask lives one level below the workspace root")
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    // `cargo xtask` runs this as xtask's package (CARGO_PKG_NAME=xtask and
    // such); build scripts such as ring's track those variables, so passing
    // them on would make every build here differ from a plain `cargo build`
    // and rebuild ring and all above it.
    for (name, _) in std::env::vars_os() {
        let set_by_cargo_run = name.to_str().is_some_and(|n| {
            ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_BIN_", "CARGO_CRATE_"].iter().any(|p| n.starts_with(p))
                || n == "CARGO_PRIMARY_PACKAGE"
                || n == "OUT_DIR"
        });
        if set_by_cargo_run {
            cmd.env_remove(&name);
        }
    }
    cmd
}

fn run(step: &str, mut cmd: Command) -> Result<()> {
    eprintln!("xtask: {step}: {cmd:?}");
    let status = cmd.status().with_context(|| format!("{step}: could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{step} failed ({status})");
    }
    Ok(())
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program} >/dev/null 2>&1")])
        .status()
        .is_ok_and(|s| s.success())
        // Daemons such as dovecot live in sbin, which a user's PATH may lack.
        || ["/usr/sbin", "/sbin"].iter().any(|dir| Path::new(dir).join(program).is_file())
        // A library package is proved by a file of its own.
        || (program.starts_with('/') && Path::new(program).is_file())
}

/// System packages the tests need: (binary that proves it is installed, Debian package).
const SYSTEM_PACKAGES: &[(&str, &str)] = &[
    ("redis-server", "redis-server"),
    ("redis-cli", "redis-tools"),
    // hopper's RSpec agent tests.
    ("rspec", "ruby-rspec"),
    // hopper's rediss:// test makes its certificates with the openssl command.
    ("openssl", "openssl"),
    // sync-worker's IMAP tests start a private Dovecot (sync_worker::testing).
    ("/usr/lib/dovecot/imap", "dovecot-imapd"),
    ("doveadm", "dovecot-core"),
    // Its Postgres tests: databases made with psql, private servers from initdb.
    ("psql", "postgresql-client"),
    ("pg_ctlcluster", "postgresql"),
    // hopper's HTML timeline is checked in headless Chromium; its batch verdicts on rspec.
    ("chromium", "chromium"),
    ("chromedriver", "chromium-driver"),
    ("rspec", "ruby-rspec"),
    // hopper's RSpec agent tells a pass after rspec-retry's tries as flaky.
    ("/usr/share/doc/ruby-rspec-retry/copyright", "ruby-rspec-retry"),
];

fn setup(root: &Path) -> Result<()> {
    install_system_packages()?;
    install_venvs(root)
}

fn install_system_packages() -> Result<()> {
    install_packages(SYSTEM_PACKAGES)
}

fn install_packages(packages: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = packages.iter().filter(|(bin, _)| !have(bin)).map(|(_, pkg)| *pkg).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !have("apt-get") {
        bail!("the tests need {missing:?} and apt-get is not available: install them with your package manager");
    }
    eprintln!("xtask: installing {missing:?} from Debian's packages");
    let mut update = Command::new("apt-get");
    update.args(["update", "-qq"]);
    run("apt-get update", update)?;
    let mut install = Command::new("apt-get");
    install.env("DEBIAN_FRONTEND", "noninteractive").args(["install", "-y", "-qq", "--no-install-recommends"]);
    install.args(&missing);
    run("apt-get install", install)?;
    Ok(())
}

/// A Python virtual environment under `target/` that `cargo xtask setup`
/// makes with the packages some tests run. Each tool has its own: a
/// package that registers pytest plugins (schemathesis brings hypothesis)
/// would otherwise load into every pytest that hopper's tests and benches
/// start, and add seconds to each.
struct Venv {
    /// Where it lives, from the workspace root.
    dir: &'static str,
    /// What it is for (for messages).
    purpose: &'static str,
    /// The PyPI packages it holds.
    packages: &'static [&'static str],
    /// The modules that must import once they are installed.
    modules: &'static str,
}

/// hopper's pytest tests and benches: pytest; pytest-xdist (hopper's agents
/// turn its `-n` off); pytest-rerunfailures (a pass on its rerun is flaky);
/// junitparser (a second reader of hopper's JUnit).
const PYTEST_VENV: &str = "target/pytest-venv";

/// sync-worker's API tests: schemathesis, against the OpenAPI document.
const SCHEMATHESIS_VENV: &str = "target/schemathesis-venv";

const VENVS: [Venv; 2] = [
    Venv {
        dir: PYTEST_VENV,
        purpose: "hopper's pytest tests",
        packages: &["pytest", "pytest-xdist", "pytest-rerunfailures", "junitparser"],
        modules: "pytest, xdist, pytest_rerunfailures, junitparser",
    },
    Venv {
        dir: SCHEMATHESIS_VENV,
        purpose: "sync-worker's schemathesis tests",
        packages: &["schemathesis"],
        modules: "schemathesis",
    },
];

/// The tests run real pytest and schemathesis from private venvs, so they
/// never depend on (or change) the system's Python packages.
fn install_venvs(root: &Path) -> Result<()> {
    VENVS.iter().try_for_each(|venv| install_venv(root, venv))
}

fn install_venv(root: &Path, spec: &Venv) -> Result<()> {
    let venv = root.join(spec.dir);
    let python = venv.join("bin/python");
    let import = format!("import {}", spec.modules);
    let works = |python: &Path| Command::new(python).args(["-c", &import]).output().is_ok_and(|o| o.status.success());
    if works(&python) {
        return Ok(());
    }
    if !have("python3") {
        bail!("{} need python3 (3.8 or newer, with its venv module) to make {}", spec.purpose, venv.display());
    }
    if !python.exists() {
        let mut make = Command::new("python3");
        make.args(["-m", "venv"]).arg(&venv);
        run("python3 -m venv", make)
            .with_context(|| format!("could not make {}; on Debian, install python3-venv", venv.display()))?;
    }
    eprintln!("xtask: installing {} into {}", spec.packages.join(", "), venv.display());
    let mut install = Command::new(&python);
    install.args(["-m", "pip", "install", "--quiet"]).args(spec.packages);
    run("pip install", install)?;
    if !works(&python) {
        bail!("pip installed {} but `{} -c '{import}'` still fails", spec.packages.join(", "), python.display());
    }
    Ok(())
}

fn test(root: &Path, no_lint: bool, args: &[String]) -> Result<()> {
    setup(root)?;
    ensure_postgres()?;
    if !no_lint {
        let mut fmt = cargo();
        fmt.current_dir(root).args(["fmt", "--all", "--", "--check"]);
        run("format check", fmt)?;
        let mut clippy = cargo();
        clippy.current_dir(root).args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ]);
        run("clippy", clippy)?;
    }
    run_library_examples(root)?;
    // One cluster for every test process: starting one per process costs ~2 s each.
    let _cluster = match std::env::var_os("REDIS_CLUSTER_URL") {
        Some(_) => None,
        None => {
            let cluster = leasehold_redis::test_support::RedisCluster::start(3)
                .map_err(|e| anyhow::anyhow!("could not start the private Redis Cluster for the tests: {e}"))?;
            eprintln!("xtask: private Redis Cluster at {}", cluster.url());
            Some(cluster)
        }
    };
    let mut tests = cargo();
    tests.current_dir(root);
    if let Some(cluster) = &_cluster {
        tests.env("REDIS_CLUSTER_URL", cluster.url());
    }
    if has_nextest() {
        tests.args(["nextest", "run", "--workspace", "--all-features", "--no-fail-fast"]);
    } else {
        tests.args(["test", "--workspace", "--all-features", "--no-fail-fast"]);
    }
    tests.args(args);
    run("tests", tests)?;
    if !has_nextest() {
        return Ok(());
    }
    // nextest does not run doctests.
    let mut doc = cargo();
    doc.current_dir(root).args(["test", "--workspace", "--all-features", "--doc"]);
    run("doctests", doc)
}

/// The library examples (`examples/library`), each run to its end on memory
/// and on a private Redis; each checks its own promises and exits non-zero
/// when one breaks.
const LIBRARY_EXAMPLES: [&str; 2] = ["lease_job", "queue_consumer"];

fn run_library_examples(root: &Path) -> Result<()> {
    // Built once, so the runs below time only the programs.
    let mut build = cargo();
    build.current_dir(root).args(["build", "--quiet", "-p", "leasehold-examples", "--examples"]);
    run("build the library examples", build)?;
    let redis = leasehold_redis::test_support::RedisServer::start()
        .map_err(|e| anyhow::anyhow!("could not start a private redis-server for the library examples: {e}"))?;
    for example in LIBRARY_EXAMPLES {
        for url in ["mem://".to_owned(), redis.url()] {
            let mut cmd = cargo();
            cmd.current_dir(root).args(["run", "--quiet", "-p", "leasehold-examples", "--example", example, "--"]);
            cmd.arg(&url);
            run(&format!("example {example} on {url}"), cmd)?;
        }
    }
    Ok(())
}

/// The machine's Postgres, which the storage tests use when `TEST_POSTGRES_URL` is unset.
const MACHINE_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Makes sure the Postgres the tests use answers: `TEST_POSTGRES_URL` as it
/// is, or the machine's server at 127.0.0.1:5432, whose cluster is started
/// with `pg_ctlcluster` when it is down.
fn ensure_postgres() -> Result<()> {
    if let Some(url) = std::env::var("TEST_POSTGRES_URL").ok().filter(|u| !u.is_empty()) {
        return postgres_answers(&url).map_err(|e| {
            anyhow::anyhow!("TEST_POSTGRES_URL does not answer (a Postgres the tests may create databases on): {e}")
        });
    }
    if postgres_answers(MACHINE_POSTGRES).is_ok() {
        return Ok(());
    }
    let clusters = Command::new("pg_lsclusters").arg("-h").output().context(
        "no Postgres answers at 127.0.0.1:5432 and pg_lsclusters cannot run: install Debian's postgresql package          or set TEST_POSTGRES_URL",
    )?;
    let listing = String::from_utf8_lossy(&clusters.stdout);
    // `pg_lsclusters -h`: version, name, port, status, owner, data dir, log.
    let Some((version, name)) = listing.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(2) == Some(&"5432")).then(|| (fields[0].to_owned(), fields[1].to_owned()))
    }) else {
        bail!(
            "no Postgres answers at 127.0.0.1:5432 and no cluster is set up on that port (pg_lsclusters: {listing:?}): \
             create one (`pg_createcluster --start 15 main`) with trust auth for 127.0.0.1, or set TEST_POSTGRES_URL"
        );
    };
    let mut start = Command::new("pg_ctlcluster");
    start.args([&version, &name, "start"]);
    run(&format!("start the Postgres cluster {version}/{name}"), start)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match postgres_answers(MACHINE_POSTGRES) {
            Ok(()) => return Ok(()),
            Err(e) if std::time::Instant::now() > deadline => bail!(
                "the Postgres cluster {version}/{name} started but {MACHINE_POSTGRES} does not answer: {e}\n\
                 (the tests connect as postgres without a password: pg_hba.conf needs \
                 `host all all 127.0.0.1/32 trust`; or set TEST_POSTGRES_URL)"
            ),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(200)),
        }
    }
}

/// `SELECT 1` through psql; psql's own complaint when that fails.
fn postgres_answers(url: &str) -> std::result::Result<(), String> {
    let out = Command::new("psql")
        .env("PGCONNECT_TIMEOUT", "3")
        .args(["-X", "-q", "-At", "-d", url, "-c", "SELECT 1"])
        .output()
        .map_err(|e| format!("cannot run psql: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

fn has_nextest() -> bool {
    cargo().args(["nextest", "--version"]).output().is_ok_and(|o| o.status.success())
}

/// Runs one benchmark of `leasehold-benches` in release mode; the binary
/// itself names them (`--list`), so no list is kept here.
fn bench(root: &Path, name: Option<&str>, list: bool) -> Result<()> {
    let mut cmd = cargo();
    cmd.current_dir(root).args(["run", "--release", "--quiet", "-p", "leasehold-benches", "--"]);
    match (name, list) {
        (_, true) => {
            cmd.arg("--list");
        }
        (Some(name), false) => {
            cmd.arg(name);
        }
        (None, false) => bail!("name a benchmark (cargo xtask bench --list shows them)"),
    }
    run("bench", cmd)
}
