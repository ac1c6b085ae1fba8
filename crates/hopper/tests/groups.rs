//! Fleet-wide groups (`--group NAME=LIMIT:GLOB`), end to end with real
//! pytest agents: a group of limit 1 across 3 workers of 2 slots each on one
//! Redis build, where every test records when it started and ended. No two
//! of the group's tests overlap, the build is green, and the other tests ran
//! alongside the group rather than after it. A worker SIGKILLed inside a
//! group test gives its place back within the reclaim timeout. On the memory
//! queue (one worker, 4 slots) the group holds the same way.

mod common;

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{pytest_command, sigkill, sigkill_group, spawn_worker, texts, wait_for, Build, Project};
use leasehold_redis::test_support::RedisServer;

/// A test body that records `start`/`end` lines (name, worker, process group,
/// wall time) in `times.log`; `HANG` makes the first run of `test_db_0` hang
/// (it is killed) and its later runs pass.
const RECORDER: &str = r#"
import os, time

LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "times.log")
HANG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hang")

def record(what, name):
    with open(LOG, "a") as log:
        log.write(f"{what} {name} {os.environ.get('HOPPER_WORKER', '-')} {os.getpgid(0)} {time.time():.6f}\n")

def run(name, seconds):
    record("start", name)
    if name == "test_db_0" and os.path.exists(HANG):
        os.remove(HANG)
        time.sleep(120)
    time.sleep(seconds)
    record("end", name)
"#;

fn project() -> Project {
    let mut db = String::from("from recorder import run\n");
    for i in 0..6 {
        db.push_str(&format!("\ndef test_db_{i}():\n    run('test_db_{i}', 1.0)\n"));
    }
    let mut other = String::from("from recorder import run\n");
    for i in 0..12 {
        other.push_str(&format!("\ndef test_other_{i}():\n    run('test_other_{i}', 0.5)\n"));
    }
    Project::new(&[
        ("tests/recorder.py", RECORDER.to_owned()),
        ("tests/db/test_db.py", db),
        ("tests/test_other.py", other),
        ("tests/conftest.py", "import os, sys\nsys.path.insert(0, os.path.dirname(__file__))\n".to_owned()),
    ])
}

const GROUP: &str = "db=1:tests/db/**";

/// One recorded run of a test.
#[derive(Debug, Clone)]
struct Span {
    name: String,
    worker: String,
    pgid: i32,
    start: f64,
    end: Option<f64>,
}

/// The runs `times.log` records, in start order.
fn spans(dir: &Path) -> Vec<Span> {
    let text = std::fs::read_to_string(dir.join("times.log")).unwrap_or_default();
    let mut spans: Vec<Span> = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let [what, name, worker, pgid, at] = fields[..] else { panic!("bad line {line:?}") };
        let at: f64 = at.parse().unwrap();
        match what {
            "start" => spans.push(Span {
                name: name.into(),
                worker: worker.into(),
                pgid: pgid.parse().unwrap(),
                start: at,
                end: None,
            }),
            _ => {
                let open = spans.iter_mut().rev().find(|s| s.name == name && s.end.is_none()).expect("a started run");
                open.end = Some(at);
            }
        }
    }
    spans.sort_by(|a, b| a.start.total_cmp(&b.start));
    spans
}

/// No two runs of the group overlap (each starts after the one before ended).
fn assert_group_never_overlaps(spans: &[Span]) {
    let group: Vec<&Span> = spans.iter().filter(|s| s.name.starts_with("test_db_")).collect();
    for pair in group.windows(2) {
        let ended = pair[0].end.expect("a group test that ended");
        assert!(pair[1].start >= ended, "{} started before {} ended: {group:#?}", pair[1].name, pair[0].name);
    }
}

fn worker(project: &Project, build: &Build, name: &str, extra: &[&str]) -> Child {
    let shared = build.args();
    let shared: Vec<&str> = shared.iter().map(String::as_str).collect();
    let pytest = pytest_command();
    let mut args = vec!["-j", "2", "--group", GROUP];
    args.extend(extra);
    args.extend(["--discover", "pytest", "--"]);
    args.extend(pytest.iter().map(String::as_str));
    spawn_worker(project, &shared, name, &args)
}

/// Waits for every worker; each must exit 0 (the verdict is the report's).
fn wait_all(workers: impl IntoIterator<Item = Child>) {
    for child in workers {
        let output = child.wait_with_output().unwrap();
        let (stdout, stderr) = texts(&output);
        assert_eq!(output.status.code(), Some(0), "a worker:\n{stdout}\n{stderr}");
    }
}

fn report(project: &Project, build: &Build) -> (Option<i32>, String) {
    let output = build.report(project.path(), &project.junit()).wait_with_output().unwrap();
    let (stdout, stderr) = texts(&output);
    (output.status.code(), format!("stdout:\n{stdout}\nstderr:\n{stderr}"))
}

#[test]
fn a_group_of_limit_one_never_overlaps_across_three_workers_and_the_others_are_not_held_up() {
    let project = project();
    let build = Build::on_shared_redis("hopper-groups");
    // One process per test: each slot takes one unit at a time, so the three
    // workers share the build however fast each one starts.
    let workers: Vec<Child> =
        ["w1", "w2", "w3"].iter().map(|w| worker(&project, &build, w, &["--per-process"])).collect();
    wait_all(workers);
    let (code, shown) = report(&project, &build);
    assert_eq!(code, Some(0), "{shown}");
    assert!(shown.contains("18 units, 18 passed"), "{shown}");
    let spans = spans(project.path());
    assert_eq!(spans.len(), 18, "each test ran once: {spans:#?}");
    assert_group_never_overlaps(&spans);
    // The group runs one at a time (6 s in all); the others ran beside it,
    // not queued behind it: none started after the group's last test did.
    let last_group_start = spans.iter().filter(|s| s.name.starts_with("test_db_")).map(|s| s.start).fold(0.0, f64::max);
    let late: Vec<&Span> =
        spans.iter().filter(|s| s.name.starts_with("test_other_") && s.start > last_group_start).collect();
    let table: Vec<String> =
        spans.iter().map(|s| format!("{} {} {:.2}-{:.2}", s.name, s.worker, s.start, s.end.unwrap_or(0.0))).collect();
    assert!(late.is_empty(), "tests outside the group waited for it: {late:?}\n{}", table.join("\n"));
    let workers: std::collections::BTreeSet<&str> = spans.iter().map(|s| s.worker.as_str()).collect();
    assert!(workers.len() >= 2, "the build was shared: {workers:?}\n{}", table.join("\n"));
}

#[test]
fn a_group_never_overlaps_across_three_workers_with_pytest_agents() {
    let project = project();
    let build = Build::on_shared_redis("hopper-groups-agents");
    let workers: Vec<Child> = ["w1", "w2", "w3"].iter().map(|w| worker(&project, &build, w, &[])).collect();
    wait_all(workers);
    let (code, shown) = report(&project, &build);
    assert_eq!(code, Some(0), "{shown}");
    let spans = spans(project.path());
    assert_eq!(spans.len(), 18, "each test ran once: {spans:#?}");
    assert_group_never_overlaps(&spans);
}

#[test]
fn a_worker_killed_inside_a_group_test_gives_its_place_back_within_the_timeout() {
    let project = project();
    std::fs::write(project.path().join("hang"), "").unwrap();
    let redis = RedisServer::start().expect("a private redis-server");
    let build = Build::on(redis.url(), "groups-kill");
    let timeout = ["--timeout", "3"];
    let mut workers = vec![("w1", worker(&project, &build, "w1", &timeout))];
    let started = wait_for(Duration::from_secs(60), || spans(project.path()).iter().any(|s| s.name == "test_db_0"));
    assert!(started, "test_db_0 never started");
    workers.push(("w2", worker(&project, &build, "w2", &timeout)));
    let victim = spans(project.path()).into_iter().find(|s| s.name == "test_db_0").unwrap();
    // Let w2 join, then kill the worker inside the group test, and its agent.
    std::thread::sleep(Duration::from_secs(2));
    let index = workers.iter().position(|(name, _)| *name == victim.worker).expect("the victim's worker");
    let (_, mut doomed) = workers.remove(index);
    sigkill(doomed.id() as i32);
    sigkill_group(victim.pgid);
    let _ = doomed.wait();
    let killed_at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(120);
    wait_all(workers.into_iter().map(|(_, child)| child));
    assert!(Instant::now() < deadline);
    let (code, shown) = report(&project, &build);
    assert_eq!(code, Some(0), "the killed test was reclaimed and passed\n{shown}");
    let spans = spans(project.path());
    let group: Vec<&Span> = spans.iter().filter(|s| s.name.starts_with("test_db_") && s.end.is_some()).collect();
    assert_eq!(group.len(), 6, "every group test ended once: {spans:#?}");
    assert_group_never_overlaps(&spans.iter().filter(|s| s.end.is_some()).cloned().collect::<Vec<_>>());
    let next = group.iter().map(|s| s.start).filter(|&t| t > killed_at).fold(f64::MAX, f64::min);
    assert!(
        next - killed_at <= 3.0 + 3.0,
        "the group's place came back {:.1} s after the kill, over the 3 s timeout and a 3 s margin: {spans:#?}",
        next - killed_at
    );
}

/// A Redis restart (from its AOF) while the group's other units wait for
/// their place: the build pauses, then goes on; the waiting units are not
/// lost, none runs twice, and the group never runs two at once.
#[test]
fn a_redis_restart_while_group_units_wait_costs_a_pause_not_the_limit() {
    let project = project();
    let redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"], false)
        .expect("a private redis-server");
    let build = Build::on(redis.url(), "groups-restart");
    // Reclaims would rerun units: the timeout is far longer than the outage.
    let options = ["--per-process", "--timeout", "60"];
    let workers = vec![worker(&project, &build, "w1", &options), worker(&project, &build, "w2", &options)];
    let started = wait_for(Duration::from_secs(60), || spans(project.path()).iter().any(|s| s.name == "test_db_0"));
    assert!(started, "the group's first test never started");
    std::thread::sleep(Duration::from_millis(300));
    let waiting = redis.command(&format!("KEYS *{}*parked*", build.id())).unwrap_or_default();
    assert!(waiting.contains("parked"), "group units wait for their place when Redis goes: {waiting:?}");
    redis.kill();
    std::thread::sleep(Duration::from_secs(3));
    redis.restart().expect("redis-server starts again on its port, from its AOF");
    wait_all(workers);
    let (code, shown) = report(&project, &build);
    assert_eq!(code, Some(0), "{shown}");
    assert!(shown.contains("18 units, 18 passed") && !shown.contains("ANOMALY"), "{shown}");
    let spans = spans(project.path());
    assert_eq!(spans.len(), 18, "each test ran once: {spans:#?}");
    assert_group_never_overlaps(&spans);
}

#[test]
fn a_group_holds_on_the_memory_queue_too() {
    let project = project();
    let output = project
        .worker("local")
        .args(["run", "--no-timings", "-j", "4", "--group", GROUP, "--group", "unused=1:nothing/**"])
        .args(["--discover", "pytest", "--"])
        .args(pytest_command())
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stderr.contains("--group unused=1:nothing/** matched no unit"),
        "a rule that matches nothing is named\n{stderr}"
    );
    let spans = spans(project.path());
    assert_eq!(spans.len(), 18, "{spans:#?}");
    assert_group_never_overlaps(&spans);

    let output = project.worker("local").args(["run", "--group", "db=0:tests/db/**", "--", "true"]).output().unwrap();
    let (_, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not a whole number of at least 1"), "{stderr}");
}
