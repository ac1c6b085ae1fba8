//! End-to-end tests of the `hopper` binary on a private Redis: several
//! worker processes, one killed with SIGKILL mid-unit, and the report.
//!
//! The Redis comes from `leasehold_redis::test_support` (`REDIS_URL`, or a
//! private `redis-server` on a free loopback port). A missing `redis-server`
//! fails these tests, never skips them.

mod common;

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{hopper, junit_cases, texts, Build, Suite};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use quick_junit::TestCaseStatus;

/// Watches the FIFO at `path` (made here) until `n` lines were written to it;
/// each writer opens it, writes a line and closes it.
fn fifo_watch(path: &Path, n: usize) -> mpsc::Receiver<Vec<String>> {
    let (tx, rx) = mpsc::channel();
    let path = path.to_owned();
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    std::thread::spawn(move || {
        let mut lines = Vec::new();
        while lines.len() < n {
            let mut text = String::new();
            if std::fs::File::open(&path).and_then(|mut f| f.read_to_string(&mut text)).is_err() {
                break;
            }
            lines.extend(text.lines().map(str::to_owned));
        }
        let _ = tx.send(lines);
    });
    rx
}

/// A one-slot worker of `build` over the units of `list`, its units reclaimed
/// after 2 s unless `extra` says otherwise.
fn worker(build: &Build, suite: &Suite, list: &Path, name: &str, extra: &[&str]) -> Child {
    let mut options = vec!["-j", "1"];
    if !extra.contains(&"--timeout") {
        options.extend(["--timeout", "2"]);
    }
    options.extend(extra);
    build.worker(suite.path(), list, name, &options)
}

fn kill_pid_file(path: &Path) {
    if let Ok(text) = std::fs::read_to_string(path) {
        if let Ok(pid) = text.trim().parse::<i32>() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

#[test]
fn three_workers_one_killed_mid_unit_every_unit_reported_once() {
    let build = Build::on_shared_redis("hopper-e2e-kill");
    let mut suite = Suite::new();
    let fifo = suite.path().join("victim.fifo");
    let victim_pid = suite.path().join("victim.pid");
    // The first unit: on the doomed worker it says it started and hangs; on
    // any other worker (after the reclaim) it passes at once.
    suite.unit(
        "a_victim.sh",
        &format!(
            "if [ \"$HOPPER_WORKER\" = doomed ]; then echo $$ > '{pid}'; echo started > '{fifo}'; exec sleep 60; fi\necho 'ran elsewhere'\n",
            pid = victim_pid.display(),
            fifo = fifo.display()
        ),
    );
    suite.passing("b_pass.sh").passing("c_pass.sh").passing("d_pass.sh").passing("e_pass.sh");
    suite.failing("f_fail.sh").flaky("g_flaky.sh").slow("h_slow.sh", 1.0).slow("i_slow.sh", 1.0);
    let list = suite.unit_list();
    let junit = suite.path().join("junit.xml");
    let html = suite.path().join("timeline.html");

    let started = fifo_watch(&fifo, 1);
    let mut doomed = worker(&build, &suite, &list, "doomed", &["--no-timings"]);
    let lines = started.recv_timeout(Duration::from_secs(60)).expect("the doomed worker started its unit");
    assert_eq!(lines, vec!["started"]);

    // The report waits for the end while the rest of the build happens.
    let report = hopper(suite.path())
        .arg("report")
        .args(build.args())
        .arg("--junit")
        .arg(&junit)
        .arg("--html")
        .arg(&html)
        .args(["--worker-timeout", "10", "--wait-timeout", "120"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    kill(Pid::from_raw(doomed.id() as i32), Signal::SIGKILL).unwrap();
    let _ = doomed.wait();
    kill_pid_file(&victim_pid); // the orphaned unit process; not part of what is tested

    let w2 = worker(&build, &suite, &list, "w2", &["--no-timings"]);
    let w3 = worker(&build, &suite, &list, "w3", &["--no-timings"]);
    for (name, worker) in [("w2", w2), ("w3", w3)] {
        let output = worker.wait_with_output().unwrap();
        let (stdout, stderr) = texts(&output);
        assert_eq!(output.status.code(), Some(0), "{name}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }

    let output = report.wait_with_output().unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(1), "a failing unit fails the build\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let victim = suite.unit_name("a_victim.sh");
    let fail = suite.unit_name("f_fail.sh");
    let flaky = suite.unit_name("g_flaky.sh");
    assert!(stdout.contains("FAILED: 9 units, 8 passed (1 flaky), 1 failed, 0 unfinished"), "{stdout}");
    assert!(stdout.contains(&format!("FAIL {fail} (exit code 1")), "{stdout}");
    assert!(stdout.contains(&format!("FLAKY {flaky}")), "{stdout}");
    let reclaimed = stdout.lines().find(|l| l.contains(&format!("RECLAIMED {victim}"))).unwrap_or("");
    assert!(reclaimed.contains("from doomed"), "victim reclaimed from the killed worker:\n{stdout}");
    assert!(reclaimed.contains("finished by w2") || reclaimed.contains("finished by w3"), "{stdout}");
    assert!(stdout.contains("1 reclaim(s)"), "{stdout}");
    assert!(!stdout.contains("ANOMALY"), "every unit finalized exactly once:\n{stdout}");

    let cases = junit_cases(&junit);
    let names: HashSet<String> = suite.units.iter().map(|u| u.display().to_string()).collect();
    assert_eq!(cases.keys().cloned().collect::<HashSet<_>>(), names, "JUnit lists every unit exactly once");
    assert!(matches!(&cases[&fail], TestCaseStatus::NonSuccess { .. }), "{:?}", cases[&fail]);
    assert!(matches!(&cases[&flaky], TestCaseStatus::Success { flaky_runs } if flaky_runs.len() == 1));
    assert!(matches!(&cases[&victim], TestCaseStatus::Success { flaky_runs } if flaky_runs.is_empty()));
    let passed = cases.values().filter(|s| matches!(s, TestCaseStatus::Success { .. })).count();
    assert_eq!(passed, 8, "JUnit agrees with the report");

    // The timeline: the killed worker's unit is a lost bar on its lane, and
    // every attempt of the build is a bar (9 units, 2 retries, 1 lost).
    let page = std::fs::read_to_string(&html).unwrap();
    let json = page
        .split("<script type=\"application/json\" id=\"timeline-data\">")
        .nth(1)
        .and_then(|rest| rest.split("</script>").next())
        .expect("the timeline's data block");
    let data: serde_json::Value = serde_json::from_str(json).unwrap();
    let lanes = data["lanes"].as_array().unwrap();
    let kinds: Vec<&str> = data["kinds"].as_array().unwrap().iter().map(|k| k["name"].as_str().unwrap()).collect();
    let bars: Vec<(&str, &str, &str)> = data["bars"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            let lane = &lanes[b[0].as_u64().unwrap() as usize];
            (lane["worker"].as_str().unwrap(), kinds[b[3].as_u64().unwrap() as usize], b[4].as_str().unwrap())
        })
        .collect();
    assert_eq!(bars.len(), 12, "{bars:?}");
    assert!(bars.contains(&("doomed", "lost", victim.as_str())), "{bars:?}");
    assert_eq!(bars.iter().filter(|b| b.1 == "failed").count(), 1, "{bars:?}");
    assert_eq!(bars.iter().filter(|b| b.1 == "flaky").count(), 1, "{bars:?}");
}

#[test]
fn report_fails_clearly_without_hanging_when_every_worker_is_gone() {
    let build = Build::on_shared_redis("hopper-e2e-gone");
    let mut suite = Suite::new();
    let fifo = suite.path().join("started.fifo");
    let pids = suite.path().join("pids");
    std::fs::create_dir(&pids).unwrap();
    for name in ["u1.sh", "u2.sh", "u3.sh", "u4.sh"] {
        suite.unit(
            name,
            &format!(
                "echo $$ > '{}/{name}.pid'\necho \"$HOPPER_WORKER\" > '{}'\nexec sleep 60\n",
                pids.display(),
                fifo.display()
            ),
        );
    }
    let list = suite.unit_list();
    let started = fifo_watch(&fifo, 2);
    let mut w1 = worker(&build, &suite, &list, "w1", &["--no-timings"]);
    let mut w2 = worker(&build, &suite, &list, "w2", &["--no-timings"]);
    let mut who = started.recv_timeout(Duration::from_secs(60)).expect("both workers started a unit");
    who.sort();
    assert_eq!(who, vec!["w1", "w2"]);
    for worker in [&mut w1, &mut w2] {
        kill(Pid::from_raw(worker.id() as i32), Signal::SIGKILL).unwrap();
        let _ = worker.wait();
    }
    for entry in std::fs::read_dir(&pids).unwrap() {
        kill_pid_file(&entry.unwrap().path());
    }

    let junit = suite.path().join("junit.xml");
    let begun = Instant::now();
    let output = hopper(suite.path())
        .arg("report")
        .args(build.args())
        .arg("--junit")
        .arg(&junit)
        .args(["--worker-timeout", "2", "--wait-timeout", "120"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(3), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(begun.elapsed() < Duration::from_secs(60), "the report did not hang");
    let line = stderr.trim_end();
    assert!(!line.contains('\n'), "one-line error: {stderr:?}");
    assert!(line.contains("every worker is gone") && line.contains("4 unit(s) are unfinished"), "{line}");
    for name in ["u1.sh", "u2.sh", "u3.sh", "u4.sh"] {
        assert!(line.contains(&suite.unit_name(name)), "{name} named in {line}");
    }
    let cases = junit_cases(&junit);
    assert_eq!(cases.len(), 4);
    assert!(cases.values().all(|s| matches!(s, TestCaseStatus::NonSuccess { .. })), "{cases:?}");
}

#[test]
fn a_reused_build_id_with_other_units_is_refused_and_nothing_changes() {
    let build = Build::on_shared_redis("hopper-e2e-reuse");
    let mut suite = Suite::new();
    suite.passing("a.sh").passing("b.sh");
    let list = suite.unit_list();
    let junit = suite.path().join("ignored.xml");
    let junit = junit.to_str().unwrap();
    let first = worker(&build, &suite, &list, "w1", &["--no-timings", "--junit", junit]).wait_with_output().unwrap();
    let (_, stderr) = texts(&first);
    assert_eq!(first.status.code(), Some(0), "{stderr}");
    assert_eq!(stderr.matches("--junit is ignored").count(), 1, "warned once: {stderr}");

    let other: PathBuf = suite.path().join("other.txt");
    std::fs::write(&other, format!("{}\n", suite.unit_name("a.sh"))).unwrap();
    let second = worker(&build, &suite, &other, "w2", &["--no-timings"]).wait_with_output().unwrap();
    let (stdout, stderr) = texts(&second);
    assert_eq!(second.status.code(), Some(2), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let line = stderr.lines().last().unwrap_or("");
    assert!(line.contains("already exists with a different unit list (2 units, this worker has 1)"), "{stderr}");

    let status = hopper(suite.path()).arg("status").args(build.args()).output().unwrap();
    let (stdout, stderr) = texts(&status);
    assert_eq!(status.status.code(), Some(0), "{stderr}");
    assert!(stdout.contains("complete: 2/2 finalized"), "{stdout}");
    assert!(stdout.contains("w1") && !stdout.contains("w2"), "the refused worker wrote nothing: {stdout}");
}

#[test]
fn report_for_a_build_that_never_started_fails_clearly() {
    let build = Build::on_shared_redis("hopper-e2e-none");
    let suite = Suite::new();
    let output =
        hopper(suite.path()).arg("report").args(build.args()).args(["--start-timeout", "0.5"]).output().unwrap();
    let (_, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("build {} not found", build.id())), "{stderr}");
}

/// A worker paused (SIGSTOP) past the reclaim timeout loses its unit to
/// another worker; when it resumes, its late result is fenced off (STALE),
/// dropped and logged, and the unit is still reported exactly once.
#[test]
fn a_paused_worker_s_late_result_is_fenced_off_as_stale() {
    let build = Build::on_shared_redis("hopper-e2e-stale");
    let mut suite = Suite::new();
    let fifo = suite.path().join("paused.fifo");
    suite.unit(
        "a_victim.sh",
        &format!(
            "if [ \"$HOPPER_WORKER\" = paused ]; then echo started > '{}'; exec sleep 2; fi\necho 'ran elsewhere'\n",
            fifo.display()
        ),
    );
    suite.passing("b_pass.sh").passing("c_pass.sh");
    let list = suite.unit_list();

    let started = fifo_watch(&fifo, 1);
    let paused = worker(&build, &suite, &list, "paused", &["--no-timings", "--timeout", "1"]);
    started.recv_timeout(Duration::from_secs(60)).expect("the paused worker started its unit");
    let paused_pid = Pid::from_raw(paused.id() as i32);
    kill(paused_pid, Signal::SIGSTOP).unwrap();

    // Another worker reclaims the unit after the timeout and finishes the build.
    let other = worker(&build, &suite, &list, "w2", &["--no-timings", "--timeout", "1"]).wait_with_output().unwrap();
    assert_eq!(other.status.code(), Some(0), "{:?}", texts(&other));

    kill(paused_pid, Signal::SIGCONT).unwrap();
    let output = paused.wait_with_output().unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let victim = suite.unit_name("a_victim.sh");
    assert!(
        stderr.lines().any(|l| l.starts_with("STALE") && l.contains(&victim) && l.contains("result dropped")),
        "the late result was dropped and logged:\n{stderr}"
    );

    let report = hopper(suite.path()).arg("report").args(build.args()).output().unwrap();
    let (stdout, stderr) = texts(&report);
    assert_eq!(report.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("PASSED: 3 units, 3 passed (0 flaky)"), "{stdout}");
    assert!(stdout.contains("were dropped because another worker owned the unit (STALE)"), "{stdout}");
    assert!(stdout.contains(&format!("RECLAIMED {victim} (from paused, finished by w2)")), "{stdout}");
    assert!(!stdout.contains("ANOMALY"), "{stdout}");
}

/// SIGTERM mid-unit: the worker kills the unit, hands it back at once and
/// exits 143; an idle worker picks it up within a second, and no budget is
/// spent (with `--max-reclaims 0` a reclaim would fail the unit, and the
/// reclaim timeout is far longer than the test).
#[test]
fn sigterm_hands_the_running_unit_back_to_another_worker_within_a_second() {
    let build = Build::on_shared_redis("hopper-e2e-handback");
    let mut suite = Suite::new();
    let started = suite.path().join("started.log");
    let picked = suite.path().join("picked.log");
    suite.unit(
        "a_long.sh",
        &format!(
            "if [ \"$HOPPER_WORKER\" = stopping ]; then echo started >> '{started}'; exec sleep 60; fi\ndate +%s.%N >> '{picked}'\n",
            started = started.display(),
            picked = picked.display()
        ),
    );
    suite.passing("b_pass.sh");
    let list = suite.unit_list();
    let budgets = ["--no-timings", "--timeout", "60", "--max-reclaims", "0"];

    let stopping = worker(&build, &suite, &list, "stopping", &budgets);
    assert!(common::wait_lines(&started, 1, Duration::from_secs(60)), "the unit started on the stopping worker");
    let idle = worker(&build, &suite, &list, "idle", &budgets);
    // The idle worker runs b_pass and then waits for the unit in flight.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = hopper(suite.path()).arg("status").args(build.args()).output().unwrap();
        if texts(&status).0.contains("1/2 finalized") {
            break;
        }
        assert!(Instant::now() < deadline, "b_pass was not finalized: {:?}", texts(&status));
        std::thread::sleep(Duration::from_millis(50));
    }

    let signalled = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    kill(Pid::from_raw(stopping.id() as i32), Signal::SIGTERM).unwrap();
    let output = stopping.wait_with_output().unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(143), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stderr.contains("RELEASE") && stderr.contains("handed back"), "{stderr}");

    let output = idle.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{:?}", texts(&output));
    let picked_at: f64 = std::fs::read_to_string(&picked).unwrap().trim().parse().unwrap();
    let after = picked_at - signalled;
    assert!(after < 1.0, "picked up {after:.2}s after the signal");

    let junit = suite.path().join("junit.xml");
    let report = hopper(suite.path()).arg("report").args(build.args()).arg("--junit").arg(&junit).output().unwrap();
    let (stdout, stderr) = texts(&report);
    assert_eq!(report.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("PASSED: 2 units, 2 passed (0 flaky), 0 failed, 0 unfinished"), "{stdout}");
    assert!(stdout.contains("0 unit(s) requeued (0 requeue(s)), 0 reclaim(s)"), "no budget spent:\n{stdout}");
    let cases = junit_cases(&junit);
    assert_eq!(cases.len(), 2);
    assert!(cases.values().all(|s| matches!(s, TestCaseStatus::Success { flaky_runs } if flaky_runs.is_empty())));
}

/// A worker heartbeats what all its slots hold in one call per beat, not
/// one call per slot: four slots running a unit each for 2.5 s, with a beat
/// every 200 ms (a 0.6 s reclaim timeout), send calls that each name all four
/// units. Counted with MONITOR, on a server of the test's own.
#[test]
fn one_heartbeat_call_per_beat_covers_every_slot() {
    let server = leasehold_redis::test_support::RedisServer::start().unwrap();
    let build = Build::on(server.url(), "one-beat");
    let mut suite = Suite::new();
    for name in ["a_slow.sh", "b_slow.sh", "c_slow.sh", "d_slow.sh"] {
        suite.slow(name, 2.5);
    }
    let list = suite.unit_list();
    let units: Vec<String> =
        ["a_slow.sh", "b_slow.sh", "c_slow.sh", "d_slow.sh"].iter().map(|n| suite.unit_name(n)).collect();
    let mut monitor = std::process::Command::new("redis-cli")
        .args(["-p", &server.port().to_string(), "monitor"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli monitor");
    let mut lines = std::io::BufReader::new(monitor.stdout.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut lines, &mut first).unwrap();
    assert!(first.trim() == "OK", "MONITOR started: {first}");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let beats: Vec<String> = std::io::BufRead::lines(lines)
            .map_while(Result::ok)
            .filter(|l| l.contains("\"heartbeat_batch\"") || l.contains("\"heartbeat\""))
            .collect();
        let _ = tx.send(beats);
    });

    let output = build
        .worker(suite.path(), &list, "w1", &["-j", "4", "--no-timings", "--timeout", "0.6"])
        .wait_with_output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{:?}", texts(&output));
    monitor.kill().unwrap();
    monitor.wait().unwrap();
    let beats = rx.recv_timeout(Duration::from_secs(10)).expect("the MONITOR lines");
    let covering = beats.iter().filter(|l| units.iter().all(|u| l.contains(&format!("\"{u}\"")))).count();
    eprintln!("{} heartbeat calls, {covering} naming all four units", beats.len());
    // About 12 beats while all four run; the first and last may find fewer
    // units held (slots starting, units ending).
    assert!(covering >= 6, "{covering} of {} heartbeat calls named every running unit:\n{beats:#?}", beats.len());
    assert!(beats.len() <= covering + 4, "one call per beat, not one per slot: {} calls:\n{beats:#?}", beats.len());
}
