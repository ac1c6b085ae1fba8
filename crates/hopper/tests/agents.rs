//! End-to-end tests of hopper's persistent agents against the real tools:
//! pytest (from the venv `cargo xtask setup` makes) with the plugin shipped
//! inside hopper, Debian's `rspec`, and test binaries that `cargo nextest
//! list` names, run directly.
//!
//! Every throwaway test appends its name to the file named by `RAN_LOG`
//! when it runs, so the tests check that each test ran as often as it should.
//! A missing tool fails these tests (with what to install); none is skipped.

mod common;

use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{junit_cases, require_rspec, rust_lib_rs, spawn_worker, status_of, survivor_then_report, texts, Project};
use leasehold_redis::test_support::{redis_url, unique_prefix};
use quick_junit::TestCaseStatus;

/// A worker of a Redis build running pytest's agents on one slot, its units
/// reclaimed after 2 s.
const PYTEST_WORKER: &[&str] = &[
    "-j",
    "1",
    "--timeout",
    "2",
    "--discover",
    "pytest",
    "--",
    "python",
    "-m",
    "pytest",
    "-q",
    "-p",
    "no:cacheprovider",
];

fn ran_helper_py() -> String {
    "import os\n\n\ndef ran(name):\n    with open(os.environ['RAN_LOG'], 'a') as log:\n        log.write(name + '\\n')\n"
        .to_owned()
}

/// 20 fast passing tests in two files (one parametrized with awkward ids).
fn fast_files() -> Vec<(&'static str, String)> {
    let mut a = format!("{}\n", ran_helper_py());
    for i in 0..10 {
        a.push_str(&format!("\ndef test_fast_{i}():\n    ran('fast_{i}')\n"));
    }
    let b = format!(
        "import pytest\n{}\n\n@pytest.mark.parametrize('v', [\"a b\", 'c]d', \"e 'f'\", 'g', 'h', 'i', 'j', 'k', 'l', 'm'])\ndef test_param(v):\n    ran('param ' + v)\n",
        ran_helper_py()
    );
    vec![("tests/test_fast_a.py", a), ("tests/test_fast_b.py", b)]
}

/// A failing, a flaky, a hanging and a crashing test.
fn trouble_file() -> (&'static str, String) {
    let text = format!(
        r#"import os
import time
{ran}

def test_fails():
    ran('fails')
    assert 1 + 1 == 3, 'deliberate failure'


def test_flaky():
    ran('flaky')
    marker = os.path.join(os.path.dirname(os.environ['RAN_LOG']), 'flaky.marker')
    if not os.path.exists(marker):
        open(marker, 'w').close()
        assert False, 'first attempt fails'


def test_hangs():
    ran('hangs')
    time.sleep(600)


def test_crashes():
    ran('crashes')
    os._exit(9)
"#,
        ran = ran_helper_py()
    );
    ("tests/test_trouble.py", text)
}

fn failure_message(status: &TestCaseStatus) -> String {
    match status {
        TestCaseStatus::NonSuccess { message, .. } => message.as_ref().map(|m| m.to_string()).unwrap_or_default(),
        other => panic!("not a failure: {other:?}"),
    }
}

#[test]
fn pytest_agents_run_every_test_once_and_survive_failures_hangs_and_crashes() {
    let mut files = fast_files();
    files.push(trouble_file());
    let project = Project::new(&files);
    let started = Instant::now();
    let output = project
        .hopper_in_venv()
        .args(["run", "-j", "2", "--discover", "pytest", "--junit", "out.xml", "--no-timings"])
        .args(["--unit-timeout", "2", "--max-requeues", "1", "--requeue-tolerance", "1"])
        .args(["--", "python", "-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .output()
        .expect("run hopper");
    let (stdout, stderr) = texts(&output);
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(output.status.code(), Some(1), "{context}");
    assert!(stdout.contains("FAILED: 24 units, 21 passed (1 flaky), 3 failed, 0 unfinished"), "{context}");
    // Two attempts of the hanging test at 2 s each, in parallel with the rest.
    assert!(started.elapsed() < Duration::from_secs(40), "{:?}", started.elapsed());

    let cases = junit_cases(&project.junit());
    assert_eq!(cases.len(), 24, "every test exactly once: {:?}", cases.keys());
    let t = |name: &str| format!("tests/test_trouble.py::{name}");
    assert!(failure_message(status_of(&cases, &t("test_fails"))).contains("deliberate failure"), "{context}");
    assert!(failure_message(status_of(&cases, &t("test_hangs"))).contains("timed out after 2.0s"), "{context}");
    assert!(failure_message(status_of(&cases, &t("test_crashes"))).contains("crashed"), "{context}");
    assert!(
        matches!(status_of(&cases, &t("test_flaky")), TestCaseStatus::Success { flaky_runs } if flaky_runs.len() == 1),
        "{context}"
    );
    assert!(stdout.contains(&format!("FLAKY {}", t("test_flaky"))), "{context}");
    for name in ["tests/test_fast_b.py::test_param[a b]", "tests/test_fast_b.py::test_param[c]d]"] {
        assert!(matches!(status_of(&cases, name), TestCaseStatus::Success { .. }), "{name}\n{context}");
    }

    let ran = project.ran();
    for (name, times) in &ran {
        let want = match name.as_str() {
            "fails" | "flaky" | "hangs" | "crashes" => 2,
            _ => 1,
        };
        assert_eq!(*times, want, "{name} ran {times} times\n{context}");
    }
    assert_eq!(ran.len(), 24, "{ran:?}");
}

fn assert_all_passed_once(project: &Project, output: &Output, total: usize) {
    let (stdout, stderr) = texts(output);
    assert_eq!(output.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let cases = junit_cases(&project.junit());
    assert_eq!(cases.len(), total, "{:?}", cases.keys());
    assert!(cases.values().all(|c| matches!(c, TestCaseStatus::Success { .. })), "{cases:?}");
    let ran = project.ran();
    assert_eq!(ran.len(), total, "{ran:?}");
    assert!(ran.values().all(|n| *n == 1), "each test ran once: {ran:?}");
}

#[test]
fn the_documented_pytest_command_works_in_memory_and_on_redis() {
    let project = Project::new(&fast_files());
    let exact =
        ["--discover", "pytest", "--junit", "out.xml", "--", "python", "-m", "pytest", "-q", "-p", "no:cacheprovider"];
    let output = project.hopper_in_venv().args(["run", "-j", "2"]).args(exact).output().expect("run hopper");
    assert_all_passed_once(&project, &output, 20);

    std::fs::remove_file(project.path().join("ran.log")).unwrap();
    std::fs::remove_file(project.junit()).unwrap();
    let queue = redis_url();
    let build = format!("b-{}", unique_prefix("agent-exact"));
    let shared = ["--queue", queue.as_str(), "--build", build.as_str(), "--key-prefix", "hopper-agent-test"];
    let output =
        project.hopper_in_venv().args(["run", "-j", "2"]).args(shared).args(exact).output().expect("run hopper");
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let report =
        project.hopper_in_venv().arg("report").args(shared).args(["--junit", "out.xml"]).output().expect("report");
    assert_all_passed_once(&project, &report, 20);
}

#[test]
fn a_sigkilled_redis_worker_s_tests_are_reclaimed_and_every_test_runs_to_one_verdict() {
    let mut files = fast_files();
    // On the doomed worker this test says it started and hangs; elsewhere it passes.
    files.push((
        "tests/test_0_victim.py",
        format!(
            "import os\nimport time\n{}\n\ndef test_victim():\n    ran('victim ' + os.environ['HOPPER_WORKER'])\n    if os.environ['HOPPER_WORKER'] == 'doomed':\n        with open(os.path.join(os.path.dirname(os.environ['RAN_LOG']), 'victim.pid'), 'w') as f:\n            f.write(str(os.getpid()))\n        time.sleep(600)\n",
            ran_helper_py()
        ),
    ));
    let project = Project::new(&files);
    let queue = redis_url();
    let build = format!("b-{}", unique_prefix("agent-kill"));
    let shared = ["--queue", queue.as_str(), "--build", build.as_str(), "--key-prefix", "hopper-agent-test"];
    // The victim is collected first, so the doomed worker also holds the
    // units it reserved ahead when it dies: those are reclaimed too.
    let mut doomed = spawn_worker(&project, &shared, "doomed", PYTEST_WORKER);
    let pid_file = project.path().join("victim.pid");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pid_file.exists() {
        assert!(Instant::now() < deadline, "the doomed worker never started the victim");
        if let Ok(Some(status)) = doomed.try_wait() {
            let out = doomed.wait_with_output().unwrap();
            panic!("the doomed worker ended early ({status}): {:?}", texts(&out));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(200));
    let survivor = spawn_worker(&project, &shared, "survivor", PYTEST_WORKER);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(doomed.id() as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    let _ = doomed.wait();
    // The orphaned agent (its own process group) is not what is tested.
    if let Ok(pid) = std::fs::read_to_string(&pid_file).unwrap_or_default().trim().parse::<i32>() {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
    let stdout = survivor_then_report(&project, survivor, &shared);
    assert!(stdout.contains("PASSED: 21 units, 21 passed"), "{stdout}");
    assert!(stdout.contains("RECLAIMED tests/test_0_victim.py::test_victim"), "{stdout}");
    let cases = junit_cases(&project.junit());
    assert_eq!(cases.len(), 21, "every test exactly once: {:?}", cases.keys());
    let ran = project.ran();
    assert_eq!(ran.get("victim survivor"), Some(&1), "{ran:?}");
    assert_eq!(ran.get("victim doomed"), Some(&1), "{ran:?}");
}

const SPEC_RB: &str = r#"def ran(name)
  File.open(ENV.fetch('RAN_LOG'), 'a') { |f| f.puts(name) }
end

RSpec.describe 'math' do
  it('adds') { ran('adds'); expect(1 + 1).to eq 2 }
  it('fails') { ran('fails'); expect(1 + 1).to eq 3 }
  it('is flaky') do
    ran('flaky')
    marker = File.join(File.dirname(ENV.fetch('RAN_LOG')), 'flaky.marker')
    unless File.exist?(marker)
      File.write(marker, '')
      raise 'first attempt fails'
    end
  end
  it('hangs') { ran('hangs'); sleep 600 }
  it('crashes') { ran('crashes'); Process.kill('KILL', Process.pid) }
  context "with [brackets] and 'quotes'" do
    it('works') { ran('works') }
  end
end
"#;

#[test]
fn rspec_agents_run_every_example_once_and_survive_failures_hangs_and_crashes() {
    require_rspec();
    let project = Project::new(&[("spec/math_spec.rb", SPEC_RB.to_owned())]);
    let output = project
        .hopper_in_venv()
        .args(["run", "-j", "2", "--discover", "rspec", "--junit", "out.xml", "--no-timings"])
        .args(["--unit-timeout", "2", "--max-requeues", "1", "--requeue-tolerance", "1", "--", "rspec"])
        .output()
        .expect("run hopper");
    let (stdout, stderr) = texts(&output);
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(output.status.code(), Some(1), "{context}");
    assert!(stdout.contains("FAILED: 6 units, 3 passed (1 flaky), 3 failed, 0 unfinished"), "{context}");
    let cases = junit_cases(&project.junit());
    assert_eq!(cases.len(), 6, "{:?}", cases.keys());
    let id = |n: &str| format!("./spec/math_spec.rb[{n}]");
    assert!(failure_message(status_of(&cases, &id("1:2"))).contains("expected: 3"), "{context}");
    assert!(failure_message(status_of(&cases, &id("1:4"))).contains("timed out after 2.0s"), "{context}");
    assert!(failure_message(status_of(&cases, &id("1:5"))).contains("crashed"), "{context}");
    assert!(
        matches!(status_of(&cases, &id("1:3")), TestCaseStatus::Success { flaky_runs } if flaky_runs.len() == 1),
        "{context}"
    );
    let ran = project.ran();
    let want: BTreeMap<String, usize> =
        [("adds", 1), ("fails", 2), ("flaky", 2), ("hangs", 2), ("crashes", 2), ("works", 1)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
    assert_eq!(ran, want, "{context}");
}

const NEXTEST_CARGO_TOML: &str =
    "[package]\nname = \"agent-demo\"\nversion = \"0.3.0\"\nedition = \"2021\"\n\n[workspace]\n";

/// The items of its `mod tests`.
const NEXTEST_TESTS: &str = r#"
    #[test]
    fn passes() {
        ran("passes");
    }

    #[test]
    fn sees_what_nextest_gives() {
        ran("env");
        assert_eq!(std::env::var("NEXTEST_EXECUTION_MODE").as_deref(), Ok("process-per-test"));
        assert_eq!(std::env::var("CARGO_PKG_NAME").as_deref(), Ok("agent-demo"));
        let here = std::env::current_dir().unwrap();
        assert_eq!(here, std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")));
        assert!(std::path::Path::new("Cargo.toml").exists());
    }

    #[test]
    fn fails() {
        ran("fails");
        panic!("deliberate failure");
    }

    #[test]
    fn hangs() {
        ran("hangs");
        std::thread::sleep(std::time::Duration::from_secs(600));
    }

    #[test]
    fn crashes() {
        ran("crashes");
        std::process::abort();
    }
"#;

#[test]
fn nextest_tests_run_from_their_binaries_one_process_each_without_cargo() {
    let project = Project::new(&[
        ("Cargo.toml", NEXTEST_CARGO_TOML.to_owned()),
        ("src/lib.rs", rust_lib_rs("A throwaway suite for hopper's nextest agents.", NEXTEST_TESTS)),
    ]);
    // A cargo that only nextest's listing may use: running a test through it fails the build.
    let bin = project.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let real_cargo = String::from_utf8(Command::new("sh").args(["-c", "command -v cargo"]).output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_owned();
    let trap = format!(
        "#!/bin/sh\ncase \"$1 $2\" in\n  'nextest list') exec '{real_cargo}' \"$@\" ;;\nesac\necho \"cargo $* was run per test\" >> '{log}'\nexit 3\n",
        log = project.path().join("cargo-calls.log").display()
    );
    let cargo = bin.join("cargo");
    std::fs::write(&cargo, trap).unwrap();
    std::fs::set_permissions(&cargo, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut cmd = project.hopper_in_venv();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    cmd.env("PATH", path)
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .env("CARGO_TARGET_DIR", project.path().join("target"))
        .env("CARGO_NET_OFFLINE", "true");
    let output = cmd
        .args(["run", "-j", "2", "--discover", "nextest", "--junit", "out.xml", "--no-timings"])
        .args(["--unit-timeout", "3", "--max-requeues", "1", "--requeue-tolerance", "1"])
        .output()
        .expect("run hopper");
    let (stdout, stderr) = texts(&output);
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(output.status.code(), Some(1), "{context}");
    assert!(!project.path().join("cargo-calls.log").exists(), "cargo was run per test\n{context}");
    assert!(stdout.contains("FAILED: 5 units, 2 passed (0 flaky), 3 failed, 0 unfinished"), "{context}");
    let cases = junit_cases(&project.junit());
    assert_eq!(cases.len(), 5, "{:?}", cases.keys());
    let id = |n: &str| format!("binary_id(=agent-demo) & test(=tests::{n})");
    assert!(matches!(status_of(&cases, &id("sees_what_nextest_gives")), TestCaseStatus::Success { .. }), "{context}");
    assert!(failure_message(status_of(&cases, &id("hangs"))).contains("timed out after 3.0s"), "{context}");
    assert!(failure_message(status_of(&cases, &id("crashes"))).contains("signal"), "{context}");
    let ran = project.ran();
    assert_eq!(ran.get("passes"), Some(&1), "{ran:?}");
    assert_eq!(ran.get("fails"), Some(&2), "{ran:?}");
}

/// A tiny agent written against docs/agent-protocol.md: tests named `ok*` pass.
const CUSTOM_AGENT_PY: &str = r#"import json, os, sys
out = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
out.write(json.dumps({"event": "ready", "protocol": 1}) + "\n")
for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "exit":
        break
    out.write(json.dumps({"event": "started", "seq": req["seq"]}) + "\n")
    with open(os.environ["RAN_LOG"], "a") as log:
        log.write(req["test"] + "\n")
    outcome = "passed" if req["test"].startswith("ok") else "failed"
    out.write(json.dumps({"event": "result", "seq": req["seq"], "outcome": outcome, "duration_ms": 1,
                          "message": "not ok: " + req["test"]}) + "\n")
"#;

#[test]
fn any_command_speaking_the_protocol_is_an_agent() {
    let project = Project::new(&[
        ("agent.py", CUSTOM_AGENT_PY.to_owned()),
        ("units.txt", "ok one\nok two [x]\nbad three\n".to_owned()),
    ]);
    let output = project
        .hopper_in_venv()
        .args(["run", "-j", "2", "--units-from", "units.txt", "--agent", "--junit", "out.xml", "--no-timings"])
        .args(["--max-requeues", "0", "--", "python", "agent.py"])
        .output()
        .expect("run hopper");
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("FAILED: 3 units, 2 passed (0 flaky), 1 failed"), "{stdout}");
    assert!(stdout.contains("not ok: bad three"), "{stdout}");
    let cases = junit_cases(&project.junit());
    assert_eq!(cases.keys().collect::<Vec<_>>(), ["bad three", "ok one", "ok two [x]"]);
}

#[test]
fn sigterm_hands_an_agent_s_units_back_at_once_for_another_worker() {
    let mut files = fast_files();
    files.push((
        "tests/test_0_waits.py",
        format!(
            "import os\nimport time\n{}\n\ndef test_waits():\n    ran('waits ' + os.environ['HOPPER_WORKER'])\n    if os.environ['HOPPER_WORKER'] == 'first':\n        open(os.path.join(os.path.dirname(os.environ['RAN_LOG']), 'waiting'), 'w').close()\n        time.sleep(600)\n",
            ran_helper_py()
        ),
    ));
    let project = Project::new(&files);
    let queue = redis_url();
    let build = format!("b-{}", unique_prefix("agent-term"));
    let shared = ["--queue", queue.as_str(), "--build", build.as_str(), "--key-prefix", "hopper-agent-test"];
    let spawn = |name: &str| {
        let args = ["-j", "1", "--timeout", "60", "--discover", "pytest", "--", "python", "-m", "pytest", "-q"];
        spawn_worker(&project, &shared, name, &[&args[..], &["-p", "no:cacheprovider"]].concat())
    };
    let first = spawn("first");
    let marker = project.path().join("waiting");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the first worker never started the waiting test");
        std::thread::sleep(Duration::from_millis(50));
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let output = first.wait_with_output().unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(143), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stderr.contains("RELEASE"), "{stderr}");

    // Released, not abandoned: the second worker gets them now, long before
    // the 60 s reclaim timeout.
    let started = Instant::now();
    let second = spawn("second").wait_with_output().unwrap();
    let (stdout, stderr) = texts(&second);
    assert_eq!(second.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(started.elapsed() < Duration::from_secs(45), "{:?}", started.elapsed());
    let report =
        project.hopper_in_venv().arg("report").args(shared).args(["--junit", "out.xml"]).output().expect("report");
    let (stdout, stderr) = texts(&report);
    assert_eq!(report.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("PASSED: 21 units, 21 passed"), "{stdout}");
    assert!(!stdout.contains("RECLAIMED"), "{stdout}");
    assert_eq!(junit_cases(&project.junit()).len(), 21);
    assert_eq!(project.ran().get("waits second"), Some(&1));
}
