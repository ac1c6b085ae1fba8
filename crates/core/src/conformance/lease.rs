//! Conformance cases for [`LeaseStore`](crate::LeaseStore).

use std::time::Duration;

use super::Fixture;
use crate::ids::{LeaseKey, WorkerId};

fn key(name: &str) -> LeaseKey {
    LeaseKey::new(name).expect("valid lease key")
}

fn owner(name: &str) -> WorkerId {
    WorkerId::new(name).expect("valid worker id")
}

/// Two claims of one key: the first wins, the second gets `None`.
pub async fn claim_gives_one_holder(fx: Fixture) {
    let ttl = Duration::from_secs(60);
    let lease = fx.leases.claim(&key("acct-1"), &owner("w1"), ttl).await.unwrap().expect("first claim wins");
    assert_eq!(lease.owner, owner("w1"));
    assert!(fx.leases.claim(&key("acct-1"), &owner("w2"), ttl).await.unwrap().is_none());
    assert_eq!(fx.leases.holder(&key("acct-1")).await.unwrap(), Some(lease));
}
