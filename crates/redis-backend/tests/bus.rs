//! [`RedisBus`] on real servers: per-user topics on one server and on a
//! Redis Cluster (sharded pub/sub), and subscriptions that survive a
//! CLIENT KILL and a server restart. Each test owns its servers.

use std::time::{Duration, Instant};

use leasehold_core::bus::{publish_json, BusSubscription, UserBus};
use leasehold_core::UserId;
use leasehold_redis::bus::RedisBus;
use leasehold_redis::test_support::{RedisCluster, RedisServer};
use leasehold_redis::RedisConfig;

fn user(s: &str) -> UserId {
    UserId::new(s).unwrap()
}

async fn bus(url: &str) -> RedisBus {
    RedisBus::connect(&RedisConfig::new(url).with_prefix("bus-test")).await.unwrap_or_else(|e| panic!("{url}: {e}"))
}

async fn recv(sub: &mut BusSubscription, within: Duration) -> Option<Vec<u8>> {
    tokio::time::timeout(within, sub.recv()).await.ok().flatten()
}

/// Publishes `msg` every 100 ms until `sub` receives it (pub/sub is at most
/// once: what is published while a subscriber reconnects is lost).
async fn publish_until_seen(
    publisher: &RedisBus,
    to: &UserId,
    sub: &mut BusSubscription,
    msg: &[u8],
    within: Duration,
) {
    let t0 = Instant::now();
    loop {
        publisher.publish(to, msg.to_vec());
        if let Some(got) = recv(sub, Duration::from_millis(100)).await {
            if got == msg {
                eprintln!("{:?} seen after {:?}", String::from_utf8_lossy(msg), t0.elapsed());
                return;
            }
        }
        assert!(t0.elapsed() < within, "{:?} never arrived within {within:?}", String::from_utf8_lossy(msg));
    }
}

/// Returns the listener and alice's subscription still held, so the caller
/// can look at the server's channels while they are subscribed.
async fn topics_are_per_user_and_in_order(url: &str) -> (RedisBus, BusSubscription) {
    let publisher = bus(url).await;
    let listener = bus(url).await;
    let (alice, bob) = (user("alice-0001"), user("bob-0002"));
    let mut a1 = listener.subscribe(&alice).await.unwrap();
    let mut a2 = listener.subscribe(&alice).await.unwrap();
    let mut b = listener.subscribe(&bob).await.unwrap();
    for i in 0..200u32 {
        publisher.publish(&alice, i.to_be_bytes().to_vec());
    }
    publish_json(&publisher, &bob, &serde_json::json!({"hello": "bob"}));
    for sub in [&mut a1, &mut a2] {
        for i in 0..200u32 {
            assert_eq!(recv(sub, Duration::from_secs(5)).await.expect("alice's message"), i.to_be_bytes());
        }
    }
    assert_eq!(recv(&mut b, Duration::from_secs(5)).await.unwrap(), br#"{"hello":"bob"}"#);
    assert!(recv(&mut b, Duration::from_millis(200)).await.is_none(), "bob sees only his own");
    assert!(recv(&mut a1, Duration::from_millis(200)).await.is_none(), "alice sees only hers");

    // Dropping one of alice's subscriptions leaves the other subscribed.
    drop(a1);
    publisher.publish(&alice, b"after".to_vec());
    assert_eq!(recv(&mut a2, Duration::from_secs(5)).await.unwrap(), b"after");
    (listener, a2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_on_one_server() {
    let server = RedisServer::start().unwrap();
    let _subscribed = topics_are_per_user_and_in_order(&server.url()).await;
    let channels = server.command("PUBSUB CHANNELS *").unwrap();
    assert!(channels.contains("bus-test:bus:{alice-0001}"), "{channels}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_on_a_cluster_are_sharded() {
    let cluster = RedisCluster::start(3).unwrap();
    let _subscribed = topics_are_per_user_and_in_order(&cluster.url()).await;
    // SSUBSCRIBE: the channel is a shard channel on exactly the node owning its slot.
    let holders: Vec<u16> = cluster
        .nodes()
        .iter()
        .filter(|n| n.command("PUBSUB SHARDCHANNELS *").unwrap().contains("bus-test:bus:{alice-0001}"))
        .map(|n| n.port())
        .collect();
    assert_eq!(holders.len(), 1, "one shard holds alice's channel: {holders:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_survives_client_kill() {
    let server = RedisServer::start().unwrap();
    let publisher = bus(&server.url()).await;
    let listener = bus(&server.url()).await;
    let alice = user("alice-kill");
    let mut sub = listener.subscribe(&alice).await.unwrap();
    publish_until_seen(&publisher, &alice, &mut sub, b"before", Duration::from_secs(5)).await;
    for round in 0..3 {
        let killed = server.command("CLIENT KILL TYPE pubsub").unwrap();
        let killed_normal = server.command("CLIENT KILL TYPE normal").unwrap();
        eprintln!("round {round}: killed {} / {}", killed.trim(), killed_normal.trim());
        let msg = format!("after kill {round}");
        publish_until_seen(&publisher, &alice, &mut sub, msg.as_bytes(), Duration::from_secs(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_survives_a_server_restart() {
    let server = RedisServer::start().unwrap();
    let publisher = bus(&server.url()).await;
    let listener = bus(&server.url()).await;
    let alice = user("alice-restart");
    let mut sub = listener.subscribe(&alice).await.unwrap();
    publish_until_seen(&publisher, &alice, &mut sub, b"before", Duration::from_secs(5)).await;
    tokio::task::block_in_place(|| {
        server.kill();
        std::thread::sleep(Duration::from_secs(3));
        server.restart().unwrap();
    });
    // The restarted server knows no subscription: the bus must make it again.
    publish_until_seen(&publisher, &alice, &mut sub, b"after restart", Duration::from_secs(15)).await;
}
