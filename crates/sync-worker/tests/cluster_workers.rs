//! Bucket ownership across `sync-worker worker` processes on a private
//! 3-master Redis Cluster, Postgres (with the fence audit) and Dovecot
//! (through the recording proxy, which names each connection's worker
//! process): workers share the accounts, a joining worker takes its share
//! with every account held by one worker at a time (hot accounts' IDLE
//! included: the old owner's connection ends before the new owner's
//! begins, and never comes back), a killed
//! worker's accounts are taken over, and a paused (SIGSTOPped) owner is
//! fenced: no row is ever written under a replaced token.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold_core::Ttl;
use leasehold_redis::test_support::RedisCluster;
use nix::sys::signal::Signal;
use sync_worker::config::Ownership;
use sync_worker::leases::account_holder;
use sync_worker::testing::{process_of_connection, FenceAudit, Postgres};

mod rig;
use rig::*;

/// Worker processes by pid, as the proxy names connections.
type Names = Arc<Mutex<Vec<(u32, String)>>>;

fn start(rig: &Rig, names: &Names, name: &str, ttl: Duration, poll: Duration) -> WorkerProcess {
    let worker = rig.worker_process_polling(name, ttl, poll);
    names.lock().expect("names").push((worker.0.id(), name.to_owned()));
    worker
}

/// Each account's holder (worker name), in account order.
async fn holders(rig: &Rig) -> Vec<Option<String>> {
    let store = rig.store().await;
    let mut out = Vec::new();
    for (account, _) in &rig.accounts {
        let bucket = rig.storage.bucket_of(account.as_str());
        let holder = account_holder(store.as_ref(), account, bucket).await.expect("holder");
        out.push(holder.map(|l| l.owner.to_string()));
    }
    out
}

fn held_by(holders: &[Option<String>], worker: &str) -> usize {
    holders.iter().filter(|h| h.as_deref() == Some(worker)).count()
}

/// Waits until `cond` holds of the holders; panics with them after `within`.
async fn until_holders(rig: &Rig, within: Duration, what: &str, cond: impl Fn(&[Option<String>]) -> bool) -> Duration {
    let started = Instant::now();
    loop {
        let now = holders(rig).await;
        if cond(&now) {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "{what}: not within {within:?}; holders {now:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_processes_on_a_redis_cluster_share_hand_over_and_fence_buckets() {
    const ACCOUNTS: usize = 12;
    let cluster = RedisCluster::start(3).unwrap_or_else(|e| panic!("Redis Cluster: {e}"));
    let db = Postgres::fresh("cluster_workers").unwrap_or_else(|e| panic!("Postgres: {e}"));
    let rig =
        Rig::on(LeaseServer::Cluster(cluster), "cluster_workers", db, ACCOUNTS, 20).await.owned_by(Ownership::Buckets);
    let (ttl, poll) = (Duration::from_secs(3), Duration::from_secs(1));
    let names: Names = Arc::default();
    let lookup = names.clone();
    rig.proxy.identify_clients(move |client, proxy| {
        let names = lookup.lock().expect("names").clone();
        let pids: Vec<u32> = names.iter().map(|(pid, _)| *pid).collect();
        let pid = process_of_connection(client, proxy, &pids)?;
        names.into_iter().find(|(p, _)| *p == pid).map(|(_, n)| n)
    });

    // Two workers share the accounts and sync them.
    let w1 = start(&rig, &names, "w1", ttl, poll);
    let w2 = start(&rig, &names, "w2", ttl, poll);
    rig.wait_synced(Duration::from_secs(120), "two workers on the cluster").await;
    until_holders(&rig, Duration::from_secs(30), "both workers hold accounts", |h| {
        held_by(h, "w1") > 0 && held_by(h, "w2") > 0 && h.iter().all(Option::is_some)
    })
    .await;
    let named = rig.proxy.sessions().iter().filter(|s| s.client.is_some()).count();
    assert!(named > 0, "the proxy names no connection's worker: {:?}", rig.proxy.sessions().first());
    // Half the accounts hot: their owners hold an IDLE connection open.
    let store = rig.store().await;
    let keys: Vec<_> = rig.accounts.iter().map(|(a, _)| a.clone()).collect();
    let users = rig.storage.users_of(&keys).await.expect("users");
    for user in users.iter().step_by(2).flatten() {
        store.mark_user_active(user, Ttl::from_secs(600)).await.expect("mark the user active");
    }
    let started = Instant::now();
    while rig.proxy.count("IDLE") < ACCOUNTS / 2 {
        assert!(started.elapsed() < Duration::from_secs(30), "hot accounts never IDLEd: {}", rig.proxy.count("IDLE"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A third joins while every account polls each second: it gets its
    // share, and no account is connected from two workers at one moment.
    let joined = Instant::now();
    let w3 = start(&rig, &names, "w3", ttl, poll);
    let took = until_holders(&rig, Duration::from_secs(30), "the new worker takes its share", |h| {
        held_by(h, "w3") >= ACCOUNTS / 3 && h.iter().all(Option::is_some)
    })
    .await;
    eprintln!("w3 held its share {took:?} after it started: {:?}", holders(&rig).await);
    tokio::time::sleep(2 * poll).await;
    let shared = rig.proxy.not_exclusive(joined);
    assert!(shared.is_empty(), "accounts not held by one worker at a time:\n{}", shared.join("\n"));
    let since_join: Vec<_> = rig.proxy.sessions().into_iter().filter(|s| s.opened >= joined).collect();
    let unnamed = since_join.iter().filter(|s| s.client.is_none()).count();
    assert!(unnamed * 10 <= since_join.len(), "{unnamed} of {} connections not named by worker", since_join.len());
    let from_w3 = since_join.iter().filter(|s| s.client.as_deref() == Some("w3")).count();
    assert!(from_w3 > 0, "w3 holds accounts but the proxy saw none of its connections");

    // A killed worker's accounts are taken over within TTL + 2 s (a tick's slack aside).
    w1.signal(Signal::SIGKILL);
    let killed = Instant::now();
    until_holders(&rig, ttl + Duration::from_secs(10), "the killed worker's accounts taken over", |h| {
        held_by(h, "w1") == 0 && h.iter().all(Option::is_some)
    })
    .await;
    eprintln!("w1's accounts taken over {:?} after the kill", killed.elapsed());
    rig.append_one_each(1);
    rig.wait_synced(Duration::from_secs(60), "after the kill").await;

    // A paused owner: its buckets go to w3 after the TTL; what it does when
    // it wakes is fenced.
    w2.signal(Signal::SIGSTOP);
    until_holders(&rig, ttl + Duration::from_secs(10), "the paused worker's accounts taken over", |h| {
        held_by(h, "w3") == ACCOUNTS
    })
    .await;
    rig.append_one_each(2);
    rig.wait_synced(Duration::from_secs(60), "while w2 is paused").await;
    w2.signal(Signal::SIGCONT);
    tokio::time::sleep(ttl + Duration::from_secs(2)).await;
    rig.append_one_each(3);
    rig.wait_synced(Duration::from_secs(60), "after w2 woke").await;

    let audit = FenceAudit::of(&rig.db);
    for (account, _) in &rig.accounts {
        let claims = audit.claims(account.as_str()).expect("claims");
        assert!(claims.windows(2).all(|w| w[0] < w[1]), "{account}: recorded tokens must only grow: {claims:?}");
    }
    rig.assert_no_stale_write();
    let differences = rig.differences_from_server().await;
    assert!(differences.is_empty(), "stored INBOX differs from the server's:\n{}", differences.join("\n"));
    drop((w2, w3));
}
