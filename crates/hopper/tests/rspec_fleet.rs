//! The fleet features that touch agents, on RSpec: two workers of two
//! slots each, with RSpec agents, on a private Redis.
//!
//! * A group of limit 1 (`--group`): its examples never overlap anywhere in
//!   the fleet, and the other examples run beside them.
//! * Retry elsewhere: an example that fails only on worker `w1` (its
//!   environment) is retried on `w2`, where it passes; the build is green and
//!   the report names the worker-specific failure.
//! * The HTML timeline draws every attempt on the slot that ran it.

mod common;

use std::path::Path;
use std::time::Duration;

use common::timeline::{drawn, recorded};
use common::{require_rspec, spawn_worker, texts, wait_for, Build, Project};
use leasehold_redis::test_support::RedisServer;

/// Helpers every spec file requires: `record(example, seconds) { ... }` logs the
/// example's id, worker and slot to `slots.log`, and its start and end to
/// `times.log`; the block runs after the start is logged.
const HELPER: &str = r##"
DIR = File.expand_path('..', __dir__)

def log(file, line)
  File.open(File.join(DIR, file), 'a') { |f| f.write("#{line}\n") }
end

def record(example, seconds)
  log('slots.log', "#{example.id} #{ENV.fetch('HOPPER_WORKER')} #{ENV.fetch('HOPPER_SLOT')}")
  log('times.log', "start #{example.id} #{Process.clock_gettime(Process::CLOCK_REALTIME)}")
  yield if block_given?
  sleep seconds
  log('times.log', "end #{example.id} #{Process.clock_gettime(Process::CLOCK_REALTIME)}")
end
"##;

/// Fails on `w1` once `w2` has started (so that `w2` is live to take the
/// retry), passes on `w2`.
const MACHINE_SPEC: &str = r#"require_relative 'helper'

RSpec.describe 'machine' do
  it('needs a working machine') do |example|
    record(example, 0.05)
    if ENV.fetch('HOPPER_WORKER') == 'w1'
      200.times { break if File.exist?(File.join(DIR, 'w2.started')); sleep 0.05 }
      raise 'this machine is broken'
    end
  end
end
"#;

/// The group's examples wait (up to 10 s) for an `other` example to have
/// started, so a scheduler that runs the group beside other work passes
/// whatever the timing, and one that holds other work back while the group
/// runs fails.
fn project() -> Project {
    let other_started = "File.join(DIR, 'other.started')";
    let db: String = (0..4)
        .map(|i| {
            format!(
                "  it('db {i}') {{ |example| record(example, 0.3) {{ 200.times {{ break if File.exist?({other_started}); sleep 0.05 }} }} }}\n"
            )
        })
        .collect();
    let other: String = (0..10)
        .map(|i| {
            format!("  it('other {i}') {{ |example| record(example, 0.2) {{ File.write({other_started}, '') }} }}\n")
        })
        .collect();
    let w2_mark = "  before(:all) { File.write(File.join(DIR, 'w2.started'), '') if ENV['HOPPER_WORKER'] == 'w2' }\n";
    Project::new(&[
        ("spec/helper.rb", HELPER.to_owned()),
        ("spec/a_machine_spec.rb", MACHINE_SPEC.to_owned()),
        ("spec/db_spec.rb", format!("require_relative 'helper'\n\nRSpec.describe 'db' do\n{db}end\n")),
        (
            "spec/other_spec.rb",
            format!("require_relative 'helper'\n\nRSpec.describe 'other' do\n{w2_mark}{other}end\n"),
        ),
    ])
}

/// `(id, start, end)` of each run in `times.log`, by start.
fn spans(dir: &Path) -> Vec<(String, f64, f64)> {
    let text = std::fs::read_to_string(dir.join("times.log")).expect("the examples wrote times.log");
    let mut open: Vec<(String, f64)> = Vec::new();
    let mut spans = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let [what, id, at] = fields[..] else { panic!("a malformed line in times.log: {line:?}") };
        let at: f64 = at.parse().expect("a time");
        if what == "start" {
            open.push((id.to_owned(), at));
        } else {
            let i = open.iter().position(|(o, _)| o == id).expect("a started run");
            let (id, start) = open.remove(i);
            spans.push((id, start, at));
        }
    }
    spans.sort_by(|a, b| a.1.total_cmp(&b.1));
    spans
}

#[test]
fn rspec_agents_keep_groups_retry_elsewhere_and_are_drawn_in_their_slots() {
    require_rspec();
    let server = RedisServer::start().expect("a private redis-server");
    let build = Build::on(server.url(), "rspec-fleet");
    let project = project();
    let shared = build.args();
    let shared: Vec<&str> = shared.iter().map(String::as_str).collect();
    let args = ["-j", "2", "--group", "db=1:./spec/db_spec.rb*", "--discover", "rspec", "--", "rspec"];
    let w1 = spawn_worker(&project, &shared, "w1", &args);
    // w1 initialises the build; w2 joins it.
    assert!(wait_for(Duration::from_secs(60), || project.path().join("slots.log").exists()), "w1 never ran an example");
    let w2 = spawn_worker(&project, &shared, "w2", &args);
    for worker in [w1, w2] {
        let output = worker.wait_with_output().expect("a worker ends");
        let (stdout, stderr) = texts(&output);
        assert_eq!(output.status.code(), Some(0), "a worker:\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    let page = project.path().join("timeline.html");
    let output = project.hopper().arg("report").args(&shared).arg("--html").arg(&page).output().expect("report");
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(0), "the build is green\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("WORKER-SPECIFIC"), "the failure on w1 is called out: {stdout}");

    let ran = recorded(&project.path().join("slots.log"));
    assert_eq!(ran.len(), 15, "every example ran: {ran:#?}");
    let machine: Vec<&str> = ran["./spec/a_machine_spec.rb[1:1]"].iter().map(|(w, _)| w.as_str()).collect();
    assert_eq!(machine, ["w1", "w2"], "failed on w1, retried on w2");
    assert_eq!(drawn(&page), ran, "each attempt's bar is on the lane of the worker and slot that ran it");

    let spans = spans(project.path());
    let db: Vec<&(String, f64, f64)> = spans.iter().filter(|s| s.0.starts_with("./spec/db_spec.rb")).collect();
    assert_eq!(db.len(), 4, "{spans:#?}");
    for pair in db.windows(2) {
        assert!(pair[1].1 >= pair[0].2, "{} started before {} ended: {db:#?}", pair[1].0, pair[0].0);
    }
    let (db_start, db_end) = (db[0].1, db[3].2);
    let beside = spans.iter().filter(|s| s.0.starts_with("./spec/other_spec.rb") && s.1 < db_end && s.2 > db_start);
    assert!(beside.count() > 0, "other examples ran while the group's did: {spans:#?}");
}
