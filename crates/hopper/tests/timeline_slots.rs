//! `hopper report --html` draws each attempt in the slot that really ran it:
//! every test records the worker and the `HOPPER_SLOT` it ran on, and each
//! bar of the page's timeline data must sit on that worker's lane of that
//! slot (slot index + 1), retries included. With real pytest agents on two
//! workers of two slots sharing a private Redis, and with one process per
//! unit on the memory queue (`hopper run --html`).

mod common;

use common::timeline::{drawn, recorded};
use common::{pytest_command, spawn_worker, texts, Build, Project, Suite};
use leasehold_redis::test_support::RedisServer;

/// A test that appends `node-id worker slot` to `slots.log` and sleeps a
/// little; `test_flaky` fails its first run.
const RECORDER: &str = r#"
import os, time

HERE = os.path.dirname(os.path.abspath(__file__))
LOG = os.path.join(HERE, "..", "slots.log")
MARK = os.path.join(HERE, "..", "flaky.mark")

def record(seconds):
    node = os.environ["PYTEST_CURRENT_TEST"].split(" ")[0]
    with open(LOG, "a") as log:
        log.write(f"{node} {os.environ['HOPPER_WORKER']} {os.environ['HOPPER_SLOT']}\n")
    time.sleep(seconds)
"#;

fn project() -> Project {
    let mut files = vec![
        ("tests/recorder.py".to_owned(), RECORDER.to_owned()),
        ("tests/conftest.py".to_owned(), "import os, sys\nsys.path.insert(0, os.path.dirname(__file__))\n".to_owned()),
    ];
    for file in ["a", "b"] {
        let mut text = String::from("import os\nfrom recorder import record, MARK\n");
        for i in 0..8 {
            text.push_str(&format!("\ndef test_{file}{i}():\n    record({})\n", 0.05 + 0.03 * i as f64));
        }
        if file == "a" {
            text.push_str(
                "\ndef test_flaky():\n    record(0.05)\n    if not os.path.exists(MARK):\n        \
                 open(MARK, 'w').close()\n        assert False, 'first run fails'\n",
            );
        }
        files.push((format!("tests/test_{file}.py"), text));
    }
    Project::new(&files)
}

#[test]
fn pytest_agents_on_two_workers_are_drawn_in_their_slots() {
    let server = RedisServer::start().expect("a private redis-server");
    let build = Build::on(server.url(), "slots");
    let project = project();
    let shared = build.args();
    let shared: Vec<&str> = shared.iter().map(String::as_str).collect();
    let pytest = pytest_command();
    let mut args = vec!["-j", "2", "--discover", "pytest", "--"];
    args.extend(pytest.iter().map(String::as_str));
    args.push("tests");
    let workers: Vec<_> = ["w1", "w2"].iter().map(|w| spawn_worker(&project, &shared, w, &args)).collect();
    for worker in workers {
        let output = worker.wait_with_output().expect("a worker ends");
        let (stdout, stderr) = texts(&output);
        assert!(output.status.success(), "a worker failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    let page = project.path().join("timeline.html");
    let output = project.hopper().arg("report").args(&shared).arg("--html").arg(&page).output().expect("report");
    let (stdout, stderr) = texts(&output);
    assert!(output.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("1 flaky"), "test_flaky passed on its retry: {stdout}");

    let ran = recorded(&project.path().join("slots.log"));
    assert_eq!(ran.len(), 17, "every test ran: {ran:#?}");
    assert_eq!(ran["tests/test_a.py::test_flaky"].len(), 2, "the flaky test ran twice");
    let slots: std::collections::BTreeSet<&(String, u64)> = ran.values().flatten().collect();
    assert!(slots.len() >= 3, "the tests ran on several slots of both workers: {slots:?}");
    assert_eq!(drawn(&page), ran, "each attempt's bar is on the lane of the worker and slot that ran it");
}

#[test]
fn one_process_per_unit_on_the_memory_queue_is_drawn_in_its_slots() {
    let mut suite = Suite::new();
    let log = suite.path().join("slots.log");
    for i in 0..9 {
        suite.unit(
            &format!("u{i}.sh"),
            &format!(
                "echo \"$HOPPER_UNIT $HOPPER_WORKER $HOPPER_SLOT\" >> '{}'\nsleep 0.{}\n",
                log.display(),
                1 + i % 3
            ),
        );
    }
    let page = suite.path().join("timeline.html");
    let output = common::hopper(suite.path())
        .args(["run", "-j", "3", "--no-timings", "--worker", "solo", "--units-from"])
        .arg(suite.unit_list())
        .arg("--html")
        .arg(&page)
        .args(["--", "sh"])
        .output()
        .expect("hopper run");
    let (stdout, stderr) = texts(&output);
    assert!(output.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let ran = recorded(&log);
    assert_eq!(ran.len(), 9, "{ran:#?}");
    let slots: std::collections::BTreeSet<u64> = ran.values().flatten().map(|(_, slot)| *slot).collect();
    assert_eq!(slots, [1, 2, 3].into(), "three slots ran units");
    assert_eq!(drawn(&page), ran);
}
