//! Sharded collection by the pytest agents (`hopper run -j N --discover
//! pytest`): each agent collects a share of the test files, their node ids
//! together are the discovery, and a test of a file an agent did not collect
//! is still run (that agent collects its file on request).
//!
//! These run the real pytest of the venv `cargo xtask setup` makes, and the
//! plugin shipped inside hopper; a missing tool fails them.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use common::{junit_cases, spawn_worker, texts, venv_bin, Project, RAN_LOG_VAR};
use leasehold_redis::test_support::{redis_url, unique_prefix};
use quick_junit::TestCaseStatus;

/// Logs `import <file> <pid>` when a test module is imported, `collect
/// <file> <pid>` when its tests are made into items, and `ran <test> <pid>`
/// when a test runs.
fn helper() -> String {
    "import os\n\n\ndef log(what):\n    with open(os.environ['RAN_LOG'], 'a') as out:\n        out.write('%s %d\\n' % (what, os.getpid()))\n".to_owned()
}

/// A test module: logs its import and its collection (pytest calls a
/// module's `pytest_generate_tests` only while it makes the module's items),
/// then defines the `first` text and `fast` tests (parametrized, with ids
/// that have spaces, brackets, quotes and unicode).
fn module(name: &str, fast: usize, first: &str) -> String {
    let params: Vec<String> = (0..fast).map(|i| format!("\"{name} v{i} [a b] 'q' é\"")).collect();
    format!(
        "import time\n\nimport pytest\n\nfrom helper import log\n\nlog('import {name}')\n_collected = []\n\n\n\
         def pytest_generate_tests(metafunc):\n    if not _collected:\n        _collected.append(1)\n        \
         log('collect {name}')\n\n\n{first}\n\n@pytest.mark.parametrize('v', [{}])\ndef test_fast(v):\n    log('ran ' + v)\n",
        params.join(", ")
    )
}

/// A project of pytest files under `tests/`, with the helper they log through.
fn sharded_project(files: &[(String, String)]) -> Project {
    let mut all = vec![("tests/helper.py".to_owned(), helper())];
    all.extend(files.iter().map(|(name, text)| (format!("tests/{name}"), text.clone())));
    Project::new(&all)
}

/// `(what, pid)` of every log line, e.g. `("ran a v0 [a b] 'q' é", 123)`.
fn logged(project: &Project) -> Vec<(String, u32)> {
    project
        .ran_lines()
        .iter()
        .map(|line| {
            let (what, pid) = line.rsplit_once(' ').expect("a pid");
            (what.to_owned(), pid.parse().expect("a pid"))
        })
        .collect()
}

/// How often each test ran.
fn ran(project: &Project) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (what, _) in logged(project) {
        if let Some(test) = what.strip_prefix("ran ") {
            *counts.entry(test.to_owned()).or_insert(0) += 1;
        }
    }
    counts
}

fn files(names: &[(&str, usize, &str)]) -> Vec<(String, String)> {
    names.iter().map(|(name, fast, first)| (format!("test_{name}.py"), module(name, *fast, first))).collect()
}

const PYTEST: [&str; 6] = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider"];

fn assert_every_test_once(project: &Project, output: &Output, total: usize) {
    let (stdout, stderr) = texts(output);
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(output.status.code(), Some(0), "{context}");
    assert!(stdout.contains(&format!("PASSED: {total} units, {total} passed")), "{context}");
    let cases = junit_cases(&project.junit());
    assert_eq!(cases.len(), total, "{:?}", cases.keys());
    assert!(cases.values().all(|c| matches!(c, TestCaseStatus::Success { .. })), "{cases:?}");
    let ran = ran(project);
    assert_eq!(ran.len(), total, "{ran:?}");
    assert!(ran.values().all(|n| *n == 1), "each test ran once: {ran:?}");
}

/// pytest's own count of the project's tests.
fn pytest_count(project: &Project) -> usize {
    let output = Command::new(venv_bin().join("python"))
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only"])
        .current_dir(project.path())
        .env(RAN_LOG_VAR, project.path().join("collect.log"))
        .output()
        .expect("pytest --collect-only");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().rev().find(|l| l.contains(" collected")).expect("a count line");
    line.split_whitespace().next().and_then(|n| n.parse().ok()).expect("a count")
}

#[test]
fn the_agents_split_the_files_and_together_run_every_test_once() {
    let project = sharded_project(&files(&[("a", 7, ""), ("b", 5, ""), ("c", 6, ""), ("d", 4, ""), ("e", 3, "")]));
    assert_eq!(pytest_count(&project), 25);
    let output = project
        .hopper_in_venv()
        .args(["run", "-j", "2", "--no-timings", "--discover", "pytest", "--junit", "out.xml", "--"])
        .args(PYTEST)
        .output()
        .expect("run hopper");
    assert_every_test_once(&project, &output, 25);
    let cases = junit_cases(&project.junit());
    assert!(cases.contains_key("tests/test_a.py::test_fast[a v0 [a b] 'q' \\xe9]"), "{:?}", cases.keys());

    // Two agents collected, and before any test ran each file's tests were
    // made by one of them only; each imported every file, as one pytest would.
    let logged = logged(&project);
    let first_run = logged.iter().position(|(what, _)| what.starts_with("ran ")).expect("tests ran");
    let mut importers: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    let mut collectors = importers.clone();
    for (what, pid) in &logged[..first_run] {
        match what.split_once(' ') {
            Some(("import", file)) => importers.entry(file).or_default().insert(*pid),
            Some(("collect", file)) => collectors.entry(file).or_default().insert(*pid),
            _ => panic!("only imports and collections before the first test: {what}"),
        };
    }
    assert_eq!(collectors.len(), 5, "every file was collected: {collectors:?}");
    assert!(collectors.values().all(|pids| pids.len() == 1), "each file by one agent: {collectors:?}");
    let agents: BTreeSet<u32> = collectors.values().flatten().copied().collect();
    assert_eq!(agents.len(), 2, "both agents collected a share: {collectors:?}");
    assert!(importers.len() == 5 && importers.values().all(|pids| *pids == agents), "{importers:?}");
}

#[test]
fn a_test_of_a_file_its_agent_did_not_collect_is_collected_on_request() {
    // `a` goes to shard 0 and `b` to shard 1. b's first test holds its agent
    // while b's other tests wait in the worker's pool; the agent of shard 0,
    // done with `a`, takes them and collects b itself.
    let slow = "def test_0_slow():\n    log('ran slow')\n    time.sleep(6)\n";
    let project = sharded_project(&files(&[("a", 2, ""), ("b", 30, slow)]));
    let output = project
        .hopper_in_venv()
        .args(["run", "-j", "2", "--no-timings", "--discover", "pytest", "--junit", "out.xml", "--"])
        .args(PYTEST)
        .output()
        .expect("run hopper");
    assert_every_test_once(&project, &output, 33);
    let logged = logged(&project);
    let pid_of = |what: &str| logged.iter().find(|(w, _)| w == what).map(|(_, pid)| *pid).expect(what);
    let (a_agent, b_agent) = (pid_of("collect a"), pid_of("collect b"));
    assert_ne!(a_agent, b_agent, "{logged:?}");
    assert_eq!(pid_of("ran slow"), b_agent);
    let b_by_a = logged.iter().filter(|(w, pid)| w.starts_with("ran b ") && *pid == a_agent).count();
    assert!(b_by_a > 0, "shard 0's agent took some of b's tests: {logged:?}");
    let collections_of_b: Vec<u32> = logged.iter().filter(|(w, _)| w == "collect b").map(|(_, pid)| *pid).collect();
    assert_eq!(collections_of_b, [b_agent, a_agent], "b was collected by its own agent, then on request: {logged:?}");
}

#[test]
fn agents_that_see_different_files_are_refused_and_nothing_runs() {
    let mut project_files = files(&[("a", 3, ""), ("b", 3, ""), ("c", 3, "")]);
    // The agent of shard 1 does not see test_c.py.
    project_files.push((
        "conftest.py".to_owned(),
        "import os\n\ncollect_ignore = ['test_c.py'] if os.environ.get('HOPPER_SHARD', '').startswith('1/') else []\n"
            .to_owned(),
    ));
    let project = sharded_project(&project_files);
    let output = project
        .hopper_in_venv()
        .args(["run", "-j", "2", "--no-timings", "--discover", "pytest", "--"])
        .args(PYTEST)
        .output()
        .expect("run hopper");
    let (stdout, stderr) = texts(&output);
    assert_ne!(output.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stderr.contains("saw different test files"), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(ran(&project).is_empty(), "nothing ran: {:?}", ran(&project));
}

#[test]
fn the_plugin_deals_each_file_to_one_shard_and_collects_another_on_request() {
    let project = sharded_project(&files(&[("a", 3, ""), ("b", 2, ""), ("c", 4, "")]));
    let plugin_dir = tempfile::tempdir().unwrap();
    let plugin = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/agent/hopper_pytest.py");
    std::fs::copy(plugin, plugin_dir.path().join("hopper_pytest.py")).unwrap();
    let mut shards = Vec::new();
    for k in 0..2 {
        let out = project.path().join(format!("collected-{k}.json"));
        let mut agent = Command::new(venv_bin().join("python"))
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "hopper_pytest"])
            .current_dir(project.path())
            .env("PYTHONPATH", plugin_dir.path())
            .env("HOPPER_PYTEST_MODE", "agent")
            .env("HOPPER_SHARD", format!("{k}/2"))
            .env("HOPPER_COLLECT_OUT", &out)
            .env(RAN_LOG_VAR, project.ran_log())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start an agent");
        // Shard 1 is asked for a test of a file of shard 0.
        let request = if k == 1 {
            "{\"op\":\"run\",\"seq\":1,\"test\":\"tests/test_a.py::test_fast[a v1 [a b] 'q' \\\\xe9]\"}\n"
        } else {
            ""
        };
        let mut stdin = agent.stdin.take().unwrap();
        stdin.write_all(format!("{request}{{\"op\":\"exit\"}}\n").as_bytes()).unwrap();
        drop(stdin);
        let output = agent.wait_with_output().unwrap();
        let (stdout, stderr) = texts(&output);
        assert!(output.status.success() || output.status.code() == Some(5), "{stdout}\n{stderr}");
        let collected: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        shards.push((collected, stdout));
    }
    let tests = |k: usize| -> Vec<String> {
        shards[k].0["tests"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(shards[0].0["files"], shards[1].0["files"], "both saw the same files");
    let (zero, one) = (tests(0), tests(1));
    assert_eq!(zero.len() + one.len(), 9, "{zero:?} {one:?}");
    assert!(zero.iter().all(|t| !one.contains(t)), "no test in two shards: {zero:?} {one:?}");
    // Dealt by size in pytest's order: a to shard 0, b to shard 1, then c to
    // the lighter one, shard 1 (b is smaller than a).
    assert!(zero.iter().all(|t| t.starts_with("tests/test_a.py::")), "{zero:?}");
    assert!(one.iter().all(|t| t.starts_with("tests/test_b.py::") || t.starts_with("tests/test_c.py::")), "{one:?}");
    assert_eq!(shards[0].0["collected"], 3);
    // Shard 1's agent ran the test of test_a.py it was sent, after importing it.
    assert!(shards[1].1.contains("\"seq\":1,\"outcome\":\"passed\""), "{}", shards[1].1);
    let logged = logged(&project);
    let pid_of_b = logged.iter().find(|(w, _)| w == "collect b").map(|(_, p)| *p).unwrap();
    assert!(logged.contains(&("ran a v1 [a b] 'q' é".to_owned(), pid_of_b)), "{logged:?}");
    // a: collected by shard 0, then by shard 1 on request; imported once by each.
    assert_eq!(logged.iter().filter(|(w, _)| w == "collect a").count(), 2, "{logged:?}");
    assert_eq!(logged.iter().filter(|(w, _)| w == "import a").count(), 2, "{logged:?}");
}

/// One worker of a Redis build, running sharded pytest agents on two slots.
fn pytest_worker(project: &Project, shared: &[&str], name: &str) -> Child {
    let args = [&["-j", "2", "--discover", "pytest", "--"][..], &PYTEST[..]].concat();
    spawn_worker(project, shared, name, &args)
}

#[test]
fn two_redis_workers_with_sharded_agents_run_every_test_once() {
    let project = sharded_project(&files(&[("a", 20, ""), ("b", 15, ""), ("c", 25, ""), ("d", 10, "")]));
    let queue = redis_url();
    let build = format!("b-{}", unique_prefix("agent-shards"));
    let shared = ["--queue", queue.as_str(), "--build", build.as_str(), "--key-prefix", "hopper-agent-test"];
    let workers = [pytest_worker(&project, &shared, "w1"), pytest_worker(&project, &shared, "w2")];
    for worker in workers {
        let output = worker.wait_with_output().unwrap();
        let (stdout, stderr) = texts(&output);
        assert_eq!(output.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    }
    let report =
        project.hopper_in_venv().arg("report").args(shared).args(["--junit", "out.xml"]).output().expect("report");
    assert_every_test_once(&project, &report, 70);
}

#[test]
fn tests_named_on_the_command_line_are_split_too_and_each_runs_once() {
    let project = sharded_project(&files(&[("a", 4, ""), ("b", 3, ""), ("c", 5, "")]));
    // A file named with its test (every agent must collect it), a whole file, and a file left out.
    let args = ["tests/test_a.py::test_fast", "tests/test_c.py"];
    let output = project
        .hopper_in_venv()
        .args(["run", "-j", "2", "--no-timings", "--discover", "pytest", "--junit", "out.xml", "--"])
        .args(PYTEST)
        .args(args)
        .output()
        .expect("run hopper");
    assert_every_test_once(&project, &output, 9);
    assert!(ran(&project).keys().all(|t| !t.starts_with("b ")), "{:?}", ran(&project));
}
