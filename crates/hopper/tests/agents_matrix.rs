//! The rest of the agent test matrix (issue #10), beside `agents.rs`: a
//! SIGKILLed Redis worker on RSpec and on nextest (reclaimed, every test to
//! one verdict), a flaky nextest test, and what a SIGKILLed worker leaves
//! behind (no plugin directory, no agent).
//!
//! Every throwaway test appends a line to the file named by `RAN_LOG`
//! when it runs, so the tests check how often each test ran. Each Redis test
//! owns its private `redis-server`. Each worker gets a `TMPDIR` of its own, so
//! what it leaves there is its own. A missing tool fails these tests (with
//! what to install); none is skipped.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{
    alive, children_named, junit_cases, plugin_dirs, require_rspec, sigkill, sigkill_group, spawn_worker, status_of,
    survivor_then_report, texts, wait_for, Project,
};
use leasehold_redis::test_support::RedisServer;
use quick_junit::TestCaseStatus;

/// How long a worker may take to list (nextest builds the crate) and start
/// its first test on a loaded machine.
const START_WITHIN: Duration = Duration::from_secs(180);

/// The pid a throwaway test wrote into `marker`, once it exists; fails
/// the test if `worker` ends first or it takes longer than [`START_WITHIN`].
fn wait_pid(project: &Project, marker: &str, worker: &mut Child) -> i32 {
    let path = project.path().join(marker);
    let mut pid = None;
    let started = wait_for(START_WITHIN, || {
        pid = std::fs::read_to_string(&path).ok().and_then(|t| t.trim().parse::<i32>().ok());
        pid.is_some() || worker.try_wait().is_ok_and(|s| s.is_some())
    });
    match pid {
        Some(pid) => pid,
        None => {
            sigkill(worker.id() as i32);
            let out = worker.wait_with_output_ref();
            panic!("no test wrote {marker} (in time: {started}); the worker said: {out}");
        }
    }
}

/// What a spawned worker printed, for messages, without consuming the `Child`.
trait OutputOf {
    fn wait_with_output_ref(&mut self) -> String;
}

impl OutputOf for Child {
    fn wait_with_output_ref(&mut self) -> String {
        use std::io::Read;
        let _ = self.wait();
        let mut out = String::new();
        if let Some(mut s) = self.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(mut s) = self.stderr.take() {
            let _ = s.read_to_string(&mut out);
        }
        out
    }
}

/// Runs the kill scenario: the worker `doomed` starts the victim test (which
/// writes its pid to `victim.pid` and hangs there), a `survivor` joins, the
/// doomed worker is SIGKILLed; then the survivor must finish the build alone
/// and `hopper report` must give every one of `total` tests one verdict.
/// Returns the report's stdout.
fn kill_one_of_two_workers(project: &Project, tool_args: &[&str], total: usize, victim: &str) -> String {
    let redis = RedisServer::start().expect("a private redis-server");
    let queue = redis.url();
    let build = "b-kill".to_owned();
    let shared = ["--queue", queue.as_str(), "--build", build.as_str()];
    // One slot each, units reclaimed after 2 s.
    let args = [&["-j", "1", "--timeout", "2"][..], tool_args].concat();
    let mut doomed = spawn_worker(project, &shared, "doomed", &args);
    let victim_pid = wait_pid(project, "victim.pid", &mut doomed);
    // The doomed worker holds the victim and the units it reserved ahead.
    let survivor = spawn_worker(project, &shared, "survivor", &args);
    sigkill(doomed.id() as i32);
    let _ = doomed.wait();

    // The reaper that outlives the worker ends its test process and removes
    // its plugin directory.
    let doomed_tmp = project.tmp("doomed");
    let cleaned = wait_for(Duration::from_secs(10), || !alive(victim_pid) && plugin_dirs(&doomed_tmp).is_empty());
    let left = (alive(victim_pid), plugin_dirs(&doomed_tmp));
    sigkill_group(victim_pid);
    assert!(cleaned, "the killed worker left (victim alive, plugin dirs) {left:?}");

    let stdout = survivor_then_report(project, survivor, &shared);
    assert!(plugin_dirs(&project.tmp("survivor")).is_empty(), "the survivor removes its plugin dir");
    assert!(stdout.contains(&format!("PASSED: {total} units, {total} passed (0 flaky)")), "{stdout}");
    assert!(stdout.contains(&format!("RECLAIMED {victim}")), "{stdout}");
    let cases = junit_cases(&project.junit());
    assert_eq!(cases.len(), total, "every test exactly once: {:?}", cases.keys());
    assert!(cases.values().all(|c| matches!(c, TestCaseStatus::Success { .. })), "{cases:?}");
    assert!(matches!(status_of(&cases, victim), TestCaseStatus::Success { .. }));

    let ran = project.ran();
    assert_eq!(ran.get("victim doomed"), Some(&1), "{ran:?}");
    assert_eq!(ran.get("victim survivor"), Some(&1), "{ran:?}");
    let others: Vec<_> = ran.iter().filter(|(name, _)| !name.starts_with("victim ")).collect();
    assert_eq!(others.len(), total - 1, "{ran:?}");
    assert!(others.iter().all(|(_, n)| **n == 1), "every other test ran once, on the survivor: {ran:?}");
    stdout
}

const RAN_RB: &str = "def ran(name)\n  File.open(ENV.fetch('RAN_LOG'), 'a') { |f| f.puts(name) }\nend\n";

const RSPEC_VICTIM: &str = r#"require_relative 'ran_helper'

RSpec.describe 'victim' do
  it('hangs on the doomed worker') do
    worker = ENV.fetch('HOPPER_WORKER')
    ran("victim #{worker}")
    if worker == 'doomed'
      File.write(File.join(File.dirname(ENV.fetch('RAN_LOG')), 'victim.pid'), Process.pid.to_s)
      sleep 600
    end
  end
end
"#;

#[test]
fn rspec_a_sigkilled_redis_worker_s_examples_are_reclaimed_and_each_has_one_verdict() {
    require_rspec();
    let fast: String = (0..12).map(|i| format!("  it('fast {i}') {{ ran('fast {i}') }}\n")).collect();
    let project = Project::new(&[
        ("spec/ran_helper.rb", RAN_RB.to_owned()),
        // Listed first, so the doomed worker's agent starts it first.
        ("spec/a_victim_spec.rb", RSPEC_VICTIM.to_owned()),
        ("spec/fast_spec.rb", format!("require_relative 'ran_helper'\n\nRSpec.describe 'fast' do\n{fast}end\n")),
    ]);
    kill_one_of_two_workers(&project, &["--discover", "rspec", "--", "rspec"], 13, "./spec/a_victim_spec.rb[1:1]");
}

fn nextest_crate(name: &str, tests: &str) -> Vec<(String, String)> {
    let lib = format!(
        r#"#[cfg(test)]
mod tests {{
    use std::io::Write;

    fn ran(name: &str) {{
        let log = std::env::var("RAN_LOG").expect("RAN_LOG is set");
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("open the log");
        // One write per line (`writeln!` on a File is two writes, which
        // concurrent test processes can interleave).
        file.write_all(format!("{{name}}\n").as_bytes()).expect("append to the log");
    }}

    fn marker(name: &str) -> std::path::PathBuf {{
        std::path::Path::new(&std::env::var("RAN_LOG").unwrap()).with_file_name(name)
    }}
{tests}
}}
"#
    );
    vec![
        (
            "Cargo.toml".into(),
            format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n"),
        ),
        ("src/lib.rs".into(), lib),
    ]
}

fn fast_rust_tests(n: usize) -> String {
    (0..n).map(|i| format!("\n    #[test]\n    fn fast_{i:02}() {{\n        ran(\"fast {i}\");\n    }}\n")).collect()
}

#[test]
fn nextest_a_sigkilled_redis_worker_s_tests_are_reclaimed_and_each_has_one_verdict() {
    let victim = r#"
    #[test]
    fn a_victim() {
        let worker = std::env::var("HOPPER_WORKER").unwrap();
        ran(&format!("victim {worker}"));
        if worker == "doomed" {
            std::fs::write(marker("victim.pid"), std::process::id().to_string()).unwrap();
            std::thread::sleep(std::time::Duration::from_secs(600));
        }
    }
"#;
    // nextest lists a crate's tests by name, so the victim comes first.
    let project = Project::new(&nextest_crate("matrix-kill", &format!("{victim}{}", fast_rust_tests(12))));
    kill_one_of_two_workers(
        &project,
        &["--discover", "nextest"],
        13,
        "binary_id(=matrix-kill) & test(=tests::a_victim)",
    );
}

#[test]
fn nextest_a_failing_test_is_retried_and_reported_a_flaky_one_shown_as_flaky_and_every_test_runs_once() {
    let flaky = r#"
    #[test]
    fn fails() {
        ran("fails");
        assert_eq!(1 + 1, 3, "deliberate failure");
    }

    #[test]
    fn flaky() {
        ran("flaky");
        if std::fs::OpenOptions::new().write(true).create_new(true).open(marker("flaky.marker")).is_ok() {
            panic!("first attempt fails");
        }
    }
"#;
    let project = Project::new(&nextest_crate("matrix-flaky", &format!("{flaky}{}", fast_rust_tests(5))));
    let output = project
        .worker("only")
        .args(["run", "-j", "2", "--discover", "nextest", "--junit", "out.xml", "--no-timings"])
        .args(["--max-requeues", "1", "--requeue-tolerance", "1"])
        .output()
        .expect("run hopper");
    let (stdout, stderr) = texts(&output);
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(output.status.code(), Some(1), "{context}");
    assert!(stdout.contains("FAILED: 7 units, 6 passed (1 flaky), 1 failed, 0 unfinished"), "{context}");
    let flaky_id = "binary_id(=matrix-flaky) & test(=tests::flaky)";
    assert!(stdout.contains(&format!("FLAKY {flaky_id}")), "{context}");
    let cases = junit_cases(&project.junit());
    assert_eq!(cases.len(), 7, "every test exactly once: {:?}", cases.keys());
    let failed = status_of(&cases, "binary_id(=matrix-flaky) & test(=tests::fails)");
    let TestCaseStatus::NonSuccess { reruns, .. } = failed else { panic!("tests::fails failed: {failed:?}") };
    assert_eq!(reruns.runs.len(), 1, "the first attempt is reported as a rerun: {failed:?}");
    let xml = std::fs::read_to_string(project.junit()).unwrap();
    assert!(xml.contains("deliberate failure"), "the failure's own message is in the JUnit\n{xml}");
    assert!(
        matches!(status_of(&cases, flaky_id), TestCaseStatus::Success { flaky_runs } if flaky_runs.len() == 1),
        "{context}"
    );
    let ran = project.ran();
    let mut want: BTreeMap<String, usize> = (0..5).map(|i| (format!("fast {i}"), 1)).collect();
    want.insert("flaky".into(), 2);
    want.insert("fails".into(), 2);
    assert_eq!(ran, want, "{context}");
    assert!(plugin_dirs(&project.tmp("only")).is_empty());
}

/// A pytest suite whose `test_0_hangs` writes its process's pid and hangs.
fn hanging_pytest_project() -> Project {
    let ran = "import os\n\n\ndef ran(name):\n    with open(os.environ['RAN_LOG'], 'a') as log:\n        log.write(name + '\\n')\n";
    Project::new(&[
        (
            "tests/test_0_hangs.py",
            format!(
                "import os\nimport time\n{ran}\n\ndef test_0_hangs():\n    ran('hangs')\n    with open(os.path.join(os.path.dirname(os.environ['RAN_LOG']), 'agent.pid'), 'w') as f:\n        f.write(str(os.getpid()))\n    time.sleep(600)\n"
            ),
        ),
        ("tests/test_fast.py", format!("{ran}\n\ndef test_fast():\n    ran('fast')\n")),
    ])
}

fn spawn_pytest_worker(project: &Project, name: &str) -> Child {
    project
        .worker(name)
        .args(["run", "-j", "1", "--no-timings", "--discover", "pytest"])
        .args(["--", "python", "-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hopper")
}

#[test]
fn a_sigkilled_worker_leaves_no_plugin_dir_and_no_agent_behind() {
    let project = hanging_pytest_project();
    let mut worker = spawn_pytest_worker(&project, "doomed");
    let agent = wait_pid(&project, "agent.pid", &mut worker);
    let tmp = project.tmp("doomed");
    assert_eq!(plugin_dirs(&tmp).len(), 1, "the worker's plugin dir is where this test looks");
    sigkill(worker.id() as i32);
    let _ = worker.wait();
    let cleaned = wait_for(Duration::from_secs(10), || !alive(agent) && plugin_dirs(&tmp).is_empty());
    let left = (alive(agent), plugin_dirs(&tmp));
    sigkill_group(agent);
    assert!(cleaned, "left behind (agent alive, plugin dirs): {left:?}");
}

#[test]
fn the_next_hopper_sweeps_the_plugin_dir_of_a_worker_whose_reaper_died_too() {
    let project = hanging_pytest_project();
    let mut worker = spawn_pytest_worker(&project, "doomed");
    let agent = wait_pid(&project, "agent.pid", &mut worker);
    let tmp = project.tmp("doomed");
    let reapers = children_named(worker.id() as i32, "hopper-reaper");
    assert_eq!(reapers.len(), 1, "the worker's reaper: {reapers:?}");
    sigkill(reapers[0]);
    assert!(wait_for(Duration::from_secs(10), || !alive(reapers[0])), "the reaper is gone");
    sigkill(worker.id() as i32);
    let _ = worker.wait();
    // With no reaper, the agent is orphaned: this test ends it.
    sigkill_group(agent);
    let stale = plugin_dirs(&tmp);
    assert_eq!(stale.len(), 1, "nothing removed the dead worker's dir yet");

    // Any later hopper on the same TMPDIR sweeps it, and removes its own.
    std::fs::write(project.path().join("units.txt"), "one\n").unwrap();
    let output = project
        .worker("doomed")
        .args(["run", "--no-timings", "--units-from", "units.txt", "--", "true"])
        .output()
        .expect("run hopper");
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(plugin_dirs(&tmp), Vec::<PathBuf>::new(), "swept: {stale:?}");
}

/// Examples as RSpec's own documentation writes them (Debian ships it in
/// ruby-rspec-expectations' features): matchers that reopen `$stdout`.
const RSPEC_OUTPUT_SPEC: &str = r#"RSpec.describe 'output matchers' do
  specify { expect { system('printf foo') }.to output('foo').to_stdout_from_any_process }
  specify { expect { system('printf foo') }.to_not output(/bar/).to_stdout_from_any_process }
  specify { expect { print 'foo' }.to output('foo').to_stdout }
  specify { expect { $stderr.print 'foo' }.to output('foo').to_stderr_from_any_process }
  it('shows what it printed when it fails') do
    puts 'printed before the failure'
    expect(1).to eq 2
  end
  it('passes after the others reopened $stdout') { puts 'still captured'; expect(true).to be true }
  it('is pending') { pending('not done'); raise 'not yet' }
end
"#;

#[test]
fn rspec_examples_that_reopen_stdout_pass_as_under_plain_rspec() {
    require_rspec();
    let project = Project::new(&[("spec/output_spec.rb", RSPEC_OUTPUT_SPEC.to_owned())]);
    let plain = Command::new("rspec").current_dir(project.path()).output().expect("run rspec");
    assert!(texts(&plain).0.contains("7 examples, 1 failure, 1 pending"), "plain rspec: {:?}", texts(&plain));
    let output = project
        .worker("only")
        .args(["run", "-j", "1", "--discover", "rspec", "--junit", "out.xml", "--no-timings", "--max-requeues", "0"])
        .args(["--", "rspec"])
        .output()
        .expect("run hopper");
    let (stdout, stderr) = texts(&output);
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(output.status.code(), Some(1), "{context}");
    // The pending example is counted too: every unit has its place in the verdict line.
    assert!(stdout.contains("FAILED: 7 units, 5 passed (0 flaky), 1 failed, 0 unfinished, 1 skipped;"), "{context}");
    let cases = junit_cases(&project.junit());
    assert!(matches!(status_of(&cases, "./spec/output_spec.rb[1:7]"), TestCaseStatus::Skipped { .. }), "{context}");
    let failed: Vec<_> = cases
        .iter()
        .filter(|(_, c)| !matches!(c, TestCaseStatus::Success { .. } | TestCaseStatus::Skipped { .. }))
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}\n{context}");
    assert_eq!(failed[0].0, "./spec/output_spec.rb[1:5]", "{context}");
    assert!(stdout.contains("printed before the failure"), "the failure shows the example's output\n{context}");
    assert!(plugin_dirs(&project.tmp("only")).is_empty());
}
