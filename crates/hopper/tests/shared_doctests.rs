//! A package's doctests run together once per worker
//! (`hopper::worker::shared_runs`): a worker SIGKILLed in the middle of
//! that run leaves no process behind, and the worker that reclaims its
//! units judges each of them by its own run, every doctest to one verdict.
//!
//! Each doctest appends `NAME WORKER` to the file named by `RAN_LOG`. The
//! test owns its private `redis-server`.

mod common;

use std::time::Duration;

use common::{
    alive, junit_cases, sigkill, sigkill_group, spawn_worker, survivor_then_report, texts, wait_for, Project,
};
use leasehold_redis::test_support::RedisServer;
use quick_junit::TestCaseStatus;

/// A doctest that logs its run: `NAME WORKER`.
fn logging_doctest(name: &str, extra: &str) -> String {
    format!(
        "/// ```\n/// use std::io::Write;\n/// let worker = std::env::var(\"HOPPER_WORKER\").unwrap();\n\
         /// let log = std::env::var(\"RAN_LOG\").unwrap();\n\
         /// let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();\n\
         /// file.write_all(format!(\"{name} {{worker}}\\n\").as_bytes()).unwrap();\n{extra}/// ```\n\
         pub fn {name}() {{}}\n\n"
    )
}

/// Eight fast doctests and a victim that hangs on the worker `doomed`
/// after writing its pid to `victim.pid`.
fn doctest_crate() -> Vec<(String, String)> {
    let victim = logging_doctest(
        "victim",
        "/// if worker == \"doomed\" {\n\
         ///     std::fs::write(std::path::Path::new(&log).with_file_name(\"victim.pid\"), std::process::id().to_string()).unwrap();\n\
         ///     std::thread::sleep(std::time::Duration::from_secs(600));\n/// }\n",
    );
    let fast: String = (0..8).map(|i| logging_doctest(&format!("fast_{i}"), "")).collect();
    vec![
        (
            "Cargo.toml".into(),
            "[package]\nname = \"doc-kill\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n# Not part of any workspace above.\n[workspace]\n"
                .into(),
        ),
        ("src/lib.rs".into(), format!("//! Doctests only.\n\n{victim}{fast}")),
    ]
}

#[test]
fn a_worker_killed_in_its_shared_doctest_run_leaves_nothing_and_the_survivor_judges_each_doctest_once() {
    let project = Project::new(&doctest_crate());
    let redis = RedisServer::start().expect("a private redis-server");
    let queue = redis.url();
    let shared = ["--queue", queue.as_str(), "--build", "b-doc-kill"];
    let args = ["-j", "1", "--timeout", "2", "--discover", "cargo-test", "--", "cargo", "test", "-q", "{unit}"];
    let mut doomed = spawn_worker(&project, &shared, "doomed", &args);
    // The doomed worker's shared run reaches the victim (after building the crate).
    let pid_file = project.path().join("victim.pid");
    let mut victim_pid = None;
    wait_for(Duration::from_secs(180), || {
        victim_pid = std::fs::read_to_string(&pid_file).ok().and_then(|t| t.trim().parse::<i32>().ok());
        victim_pid.is_some() || doomed.try_wait().is_ok_and(|s| s.is_some())
    });
    let Some(victim_pid) = victim_pid else {
        sigkill(doomed.id() as i32);
        let output = doomed.wait_with_output().expect("the doomed worker's output");
        let (stdout, stderr) = texts(&output);
        panic!("the victim never started\nstdout:\n{stdout}\nstderr:\n{stderr}");
    };
    let survivor = spawn_worker(&project, &shared, "survivor", &args);
    sigkill(doomed.id() as i32);
    let _ = doomed.wait();

    // The reaper ends the shared run (cargo, rustdoc and the hanging doctest).
    let ended = wait_for(Duration::from_secs(10), || !alive(victim_pid));
    sigkill_group(victim_pid);
    assert!(ended, "the killed worker's shared doctest run outlived it");

    let stdout = survivor_then_report(&project, survivor, &shared);
    assert!(stdout.contains("PASSED: 9 units, 9 passed (0 flaky)"), "{stdout}");
    assert!(stdout.contains("RECLAIMED src/lib.rs - "), "the doomed worker's unit was reclaimed:\n{stdout}");
    let cases = junit_cases(&project.junit());
    assert_eq!(cases.len(), 9, "every doctest exactly once: {:?}", cases.keys());
    assert!(cases.values().all(|c| matches!(c, TestCaseStatus::Success { .. })), "{cases:?}");

    // The survivor ran every doctest once, in one run: the unit it reclaimed
    // took its verdict from that run too.
    let ran = project.ran();
    assert_eq!(ran.get("victim doomed"), Some(&1), "{ran:?}");
    assert_eq!(ran.get("victim survivor"), Some(&1), "{ran:?}");
    for i in 0..8 {
        assert_eq!(ran.get(&format!("fast_{i} survivor")), Some(&1), "{ran:?}");
    }
}
