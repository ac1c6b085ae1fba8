//! What a worker that owns lease buckets reads from storage: the accounts
//! of its buckets with their users, and the users of many accounts, each in
//! a few queries however many accounts a takeover (or a tier evaluation) names.

use std::collections::BTreeSet;

use leasehold_core::{BucketId, LeaseKey, UserId};
use sync_worker::directory::{AccountDirectory as _, BucketAccount};
use sync_worker::storage::{AccountAuth, Email, NewAccount, Security, Storage};
use sync_worker::testing::TestDb;

/// More than one `IN (...)` list's worth, so the lookups are chunked.
const ACCOUNTS: usize = 1_100;

sync_worker::both_databases!(async: users_of_many_accounts_come_in_the_order_asked, accounts_in_buckets_are_every_account_of_those_buckets);

async fn user(storage: &Storage, name: &str) -> UserId {
    storage.add_user(&format!("{name}@example.org").parse::<Email>().expect("email")).await.expect("user").id
}

async fn accounts(storage: &Storage, users: &[UserId]) -> Vec<(LeaseKey, UserId)> {
    let mut made = Vec::with_capacity(ACCOUNTS);
    for i in 0..ACCOUNTS {
        let owner = users[i % users.len()].clone();
        let key = storage
            .add_account(&NewAccount {
                user: owner.clone(),
                host: "127.0.0.1".into(),
                port: 1,
                security: Security::Plain,
                username: format!("box-{i}"),
                auth: AccountAuth::Password("pw".into()),
            })
            .await
            .expect("account");
        made.push((key, owner));
    }
    made
}

async fn users_of_many_accounts_come_in_the_order_asked(db: TestDb) {
    let storage = db.open().await.expect("storage");
    let users = [user(&storage, "ann").await, user(&storage, "bob").await, user(&storage, "cy").await];
    let mut made = accounts(&storage, &users).await;
    made.reverse();
    let unknown = LeaseKey::new("no-such-account").expect("key");
    let mut asked: Vec<LeaseKey> = made.iter().map(|(k, _)| k.clone()).collect();
    asked.insert(ACCOUNTS / 2, unknown);
    let mut want: Vec<Option<UserId>> = made.iter().map(|(_, u)| Some(u.clone())).collect();
    want.insert(ACCOUNTS / 2, None);

    let got = storage.users_of(&asked).await.expect("users_of");
    assert_eq!(got, want, "one answer per account asked, in order, None for an unknown account");
    // The directory's per-account answer agrees with the batch.
    for (key, user) in asked.iter().zip(&want).step_by(97) {
        assert_eq!(&storage.user_of(key).await.expect("user_of"), user, "{key}");
    }
    assert!(storage.users_of(&[]).await.expect("none asked").is_empty());
}

async fn accounts_in_buckets_are_every_account_of_those_buckets(db: TestDb) {
    let storage = db.open().await.expect("storage");
    let users = [user(&storage, "ann").await, user(&storage, "bob").await];
    let made = accounts(&storage, &users).await;
    let buckets: BTreeSet<BucketId> = made.iter().take(600).map(|(k, _)| storage.bucket_of(k.as_str())).collect();
    let asked: Vec<BucketId> = buckets.iter().copied().collect();

    let got = storage.accounts_in_buckets(&asked).await.expect("accounts_in_buckets");
    let mut want: Vec<BucketAccount> = made
        .iter()
        .map(|(k, u)| BucketAccount { bucket: storage.bucket_of(k.as_str()), key: k.clone(), user: Some(u.clone()) })
        .filter(|a| buckets.contains(&a.bucket))
        .collect();
    want.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(got, want, "every account of the buckets asked, with its bucket and user, sorted by account");
    assert!(got.len() >= 600, "the 600 accounts the buckets were taken from are among them");
}
