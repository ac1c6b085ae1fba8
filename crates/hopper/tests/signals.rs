//! Signals and a killed worker, end to end through the `hopper` binary (in
//! memory mode: what is tested is the worker's processes, not the queue).
//! Every unit here ignores SIGTERM and leaves a child of its own in its
//! process group, the hardest case for a clean stop.

mod common;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{hopper, pids_in, still_running, texts, wait_lines, Suite};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Two units that ignore SIGTERM, each with a background child that ignores
/// it too; each writes its pids into `pids/` and a line into `started.log`.
fn stubborn_suite() -> Suite {
    let mut suite = Suite::new();
    std::fs::create_dir(suite.path().join("pids")).unwrap();
    for name in ["a.sh", "b.sh"] {
        let pids = suite.path().join("pids").join(name);
        let started = suite.path().join("started.log");
        suite.unit(
            name,
            &format!(
                "trap '' TERM\necho $$ >> '{pids}'\n(trap '' TERM; sleep 60) &\necho $! >> '{pids}'\necho started >> '{started}'\nwait\n",
                pids = pids.display(),
                started = started.display()
            ),
        );
    }
    suite
}

fn start_worker(suite: &Suite) -> Child {
    hopper(suite.path())
        .args(["run", "-j", "2", "--no-timings", "--kill-grace", "60", "--units-from"])
        .arg(suite.unit_list())
        .args(["--", "sh", "{unit}"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hopper")
}

fn wait_started(suite: &Suite) {
    assert!(wait_lines(&suite.path().join("started.log"), 2, Duration::from_secs(60)), "both units started");
}

fn unit_pids(suite: &Suite) -> Vec<i32> {
    let pids = pids_in(&suite.path().join("pids"));
    assert_eq!(pids.len(), 4, "two units and their children: {pids:?}");
    pids
}

fn signal(child: &Child, signal: Signal) {
    kill(Pid::from_raw(child.id() as i32), signal).expect("signal hopper");
}

#[test]
fn a_second_signal_kills_every_unit_process_and_exits_at_once() {
    let suite = stubborn_suite();
    let worker = start_worker(&suite);
    wait_started(&suite);
    let pids = unit_pids(&suite);

    signal(&worker, Signal::SIGTERM);
    // The units ignore the TERM the first signal sends them, and the kill
    // grace is a minute: only the second signal can end them now.
    std::thread::sleep(Duration::from_millis(300));
    assert!(still_running(&pids, Duration::ZERO).len() == 4, "the first signal leaves the grace period to the units");
    let sent = Instant::now();
    signal(&worker, Signal::SIGINT);
    let output = worker.wait_with_output().unwrap();
    let (stdout, stderr) = texts(&output);
    assert!(sent.elapsed() < Duration::from_secs(5), "exited at once: {:?}", sent.elapsed());
    assert_eq!(
        output.status.code(),
        Some(143),
        "the first signal (SIGTERM) decides\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stderr.contains("SIGINT again: killing the running units"), "{stderr}");
    assert_eq!(still_running(&pids, Duration::from_secs(3)), Vec::<i32>::new(), "no unit process is left");
}

#[test]
fn a_worker_killed_with_sigkill_leaves_no_unit_process_behind() {
    let suite = stubborn_suite();
    let mut worker = start_worker(&suite);
    wait_started(&suite);
    let pids = unit_pids(&suite);

    signal(&worker, Signal::SIGKILL);
    let _ = worker.wait();
    let left = still_running(&pids, Duration::from_secs(3));
    assert_eq!(left, Vec::<i32>::new(), "unit processes outlived their killed worker by 3 s");
}

#[test]
fn sigint_exits_130_and_sigterm_exits_143() {
    for (sig, code) in [(Signal::SIGINT, 130), (Signal::SIGTERM, 143)] {
        let mut suite = Suite::new();
        let started = suite.path().join("started.log");
        suite.unit("a.sh", &format!("echo started >> '{}'\nexec sleep 60\n", started.display()));
        let worker = hopper(suite.path())
            .args(["run", "-j", "1", "--no-timings", "--units-from"])
            .arg(suite.unit_list())
            .args(["--", "sh", "{unit}"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        assert!(wait_lines(&started, 1, Duration::from_secs(60)));
        signal(&worker, sig);
        let output = worker.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(code), "{sig}: {:?}", texts(&output));
    }
}
