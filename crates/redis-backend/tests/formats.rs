//! Mixed versions: a run is tagged with the queue format of the worker that
//! started it, and a worker that writes another format is refused with a
//! clear error before it touches the run.

mod common;

use std::time::Duration;

use leasehold_core::{Budgets, InitOutcome, QueueError, RunId, RunSpec, UnitId, UnitQueue, UnitSpec};
use leasehold_redis::keys::QUEUE_FORMAT;

fn spec(run: &str, units: &[&str]) -> RunSpec {
    RunSpec {
        run: RunId::new(run).unwrap(),
        units: units.iter().map(|u| UnitSpec::new(UnitId::new(*u).unwrap(), "file")).collect(),
        budgets: Budgets::default(),
        ttl: Duration::from_secs(600),
    }
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_another_format_is_refused_both_ways() {
    let url = leasehold_redis::test_support::redis_url();
    let store = common::store(&url, "formats").await;
    let mut admin = raw(&url).await;
    let s = spec("r1", &["a", "b"]);
    assert_eq!(store.initialize(&s).await.unwrap(), InitOutcome::Initialized);
    let keys = store.run_keys(&s.run);
    let stored: String = redis::cmd("HGET").arg(&keys.meta).arg("fingerprint").query_async(&mut admin).await.unwrap();
    assert_eq!(stored, format!("{QUEUE_FORMAT}:{}", s.fingerprint()), "the run is tagged with this format");

    // An older worker sends the bare fingerprint: it meets the unit-list
    // mismatch its version knows (a clear error), not CORRUPT, and nothing changes.
    let older = redis::Script::new(include_str!("fixtures/initialize_format1.lua"));
    let reply: Vec<redis::Value> = older
        .key(&keys.units)
        .key(&keys.priority)
        .key(&keys.attempts)
        .key(&keys.meta)
        .key(&keys.unit_state)
        .key(&keys.workers)
        .key(&keys.parked)
        .arg(s.fingerprint())
        .arg("older-nonce")
        .arg(600_000)
        .arg(2)
        .arg("1")
        .arg(2)
        .arg("")
        .arg("probe")
        .invoke_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(reply.first(), Some(&redis::Value::BulkString(b"MISMATCH".to_vec())), "{reply:?}");

    // A run an older worker started (its fingerprint has no format tag):
    // this worker is refused, names both formats, and changes nothing.
    let old = spec("r2", &["a", "b"]);
    let old_keys = store.run_keys(&old.run);
    let _: () = redis::cmd("HSET")
        .arg(&old_keys.meta)
        .arg("fingerprint")
        .arg(old.fingerprint())
        .arg("total_units")
        .arg(2)
        .arg("finalized_count")
        .arg(0)
        .query_async(&mut admin)
        .await
        .unwrap();
    let err = store.initialize(&old).await.expect_err("an older format is refused");
    match &err {
        QueueError::IncompatibleRun { run, found, expected } => {
            assert_eq!(run, &old.run);
            assert_eq!(found, "1");
            assert_eq!(expected, &QUEUE_FORMAT.to_string());
        }
        other => panic!("expected IncompatibleRun, got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("format 1") && text.contains("new run id"), "{text}");
    let units: u64 = redis::cmd("EXISTS").arg(&old_keys.units).query_async(&mut admin).await.unwrap();
    assert_eq!(units, 0, "a refused worker writes nothing");

    // A newer format is refused the same way, whatever its unit list.
    let _: () = redis::cmd("HSET")
        .arg(&old_keys.meta)
        .arg("fingerprint")
        .arg(format!("{}:{}", QUEUE_FORMAT + 1, old.fingerprint()))
        .query_async(&mut admin)
        .await
        .unwrap();
    let err = store.initialize(&spec("r2", &["z"])).await.expect_err("a newer format is refused");
    assert!(
        matches!(&err, QueueError::IncompatibleRun { found, .. } if *found == (QUEUE_FORMAT + 1).to_string()),
        "{err:?}"
    );
}
