//! Accounts by lease bucket (see `migrations/0900_account_buckets.sql`): what
//! a worker that owns some buckets reads, and the weights it reports.

use std::collections::HashMap;

use leasehold_core::{BucketCount, BucketId, FencingToken, LeaseKey, UserId};
use sqlx::Row;

use super::{corrupt, query_err, DbKind, Storage, StorageError};
use crate::directory::BucketAccount;

/// Most buckets one `IN (...)` list carries.
const BUCKETS_PER_QUERY: usize = 512;
/// Most account ids one `IN (...)` list carries.
const IDS_PER_QUERY: usize = 500;

impl Storage {
    /// At open: reads the bucket count, fills in the bucket of rows from
    /// before the column, and makes the index (after any rebuild of the table,
    /// which keeps only the indexes it makes itself).
    pub(super) async fn ensure_account_buckets(&mut self) -> Result<(), StorageError> {
        let row = sqlx::query("SELECT count FROM account_buckets WHERE singleton = 1")
            .fetch_one(&self.pool)
            .await
            .map_err(query_err("read the bucket count"))?;
        let count: i64 = row.try_get(0).map_err(query_err("read the bucket count"))?;
        self.buckets = u32::try_from(count)
            .ok()
            .and_then(|c| BucketCount::new(c).ok())
            .ok_or_else(|| corrupt("(schema)", "bucket count", count))?;
        // The catalog first: a CREATE INDEX, even one that exists, waits for
        // every open write transaction of the table, and every write after it
        // waits behind it.
        let exists = match self.kind {
            DbKind::Postgres => "SELECT COUNT(*) FROM pg_indexes WHERE indexname = 'accounts_by_bucket'",
            DbKind::Sqlite => "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = 'accounts_by_bucket'",
        };
        if self.catalog_count(exists).await? == 0 {
            let made = sqlx::query("CREATE INDEX IF NOT EXISTS accounts_by_bucket ON accounts (bucket)")
                .execute(&self.pool)
                .await;
            // Two processes starting at once on a new database both try;
            // Postgres's IF NOT EXISTS does not hold under that race.
            if let Err(e) = made {
                if self.catalog_count(exists).await? == 0 {
                    return Err(query_err("make the accounts' bucket index")(e));
                }
            }
        }
        let unfilled = sqlx::query("SELECT id FROM accounts WHERE bucket IS NULL")
            .fetch_all(&self.pool)
            .await
            .map_err(query_err("list accounts without a bucket"))?;
        if unfilled.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await.map_err(query_err("fill in the accounts' buckets"))?;
        for row in &unfilled {
            let id: String = row.try_get(0).map_err(query_err("read an account id"))?;
            sqlx::query("UPDATE accounts SET bucket = $1 WHERE id = $2")
                .bind(i64::from(self.buckets.bucket_of(&id).0))
                .bind(&id)
                .execute(&mut *tx)
                .await
                .map_err(query_err(format!("fill in the bucket of {id}")))?;
        }
        tx.commit().await.map_err(query_err("fill in the accounts' buckets"))?;
        tracing::info!(accounts = unfilled.len(), buckets = %self.buckets, "filled in the lease bucket of existing accounts");
        Ok(())
    }

    /// The number of buckets accounts hash into, fixed in the database.
    pub fn bucket_count(&self) -> BucketCount {
        self.buckets
    }

    /// The bucket of `account`.
    pub fn bucket_of(&self, account: &str) -> BucketId {
        self.buckets.bucket_of(account)
    }

    /// The accounts of `buckets`, with their bucket and user, sorted by id.
    pub async fn accounts_in_buckets(&self, buckets: &[BucketId]) -> Result<Vec<BucketAccount>, StorageError> {
        let mut out = Vec::new();
        for chunk in buckets.chunks(BUCKETS_PER_QUERY) {
            let sql =
                format!("SELECT bucket, id, user_id FROM accounts WHERE bucket IN ({})", placeholders(chunk.len()));
            // Built from placeholders only; the values are bound.
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for bucket in chunk {
                query = query.bind(i64::from(bucket.0));
            }
            let rows = query.fetch_all(&self.pool).await.map_err(query_err("list the accounts of owned buckets"))?;
            for row in &rows {
                let bucket: i64 = row.try_get(0).map_err(query_err("read an account's bucket"))?;
                let id: String = row.try_get(1).map_err(query_err("read an account id"))?;
                let bucket = u32::try_from(bucket).map_err(|_| corrupt(&id, "bucket", bucket))?;
                let user: Option<String> = row.try_get(2).map_err(query_err(format!("read the user of {id}")))?;
                let user = user.map(|u| UserId::new(&u).map_err(|_| corrupt(&id, "user_id", &u))).transpose()?;
                let key = LeaseKey::new(&id).map_err(|_| corrupt(&id, "id", &id))?;
                out.push(BucketAccount { bucket: BucketId(bucket), key, user });
            }
        }
        // Sorted here, not by the database: a takeover reads thousands at once.
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// The user of each of `accounts`, in order (`None` for an account
    /// without a row): one query per [`IDS_PER_QUERY`] accounts, so the
    /// users of a bucket's accounts, or of every owned account for a tier
    /// evaluation, cost a few round trips rather than one each.
    pub async fn users_of(&self, accounts: &[LeaseKey]) -> Result<Vec<Option<UserId>>, StorageError> {
        let mut found: HashMap<String, Option<String>> = HashMap::with_capacity(accounts.len());
        for chunk in accounts.chunks(IDS_PER_QUERY) {
            let sql = format!("SELECT id, user_id FROM accounts WHERE id IN ({})", placeholders(chunk.len()));
            // Built from placeholders only; the values are bound.
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for account in chunk {
                query = query.bind(account.as_str());
            }
            let rows = query.fetch_all(&self.pool).await.map_err(query_err("look up the users of accounts"))?;
            for row in &rows {
                let id: String = row.try_get(0).map_err(query_err("read an account id"))?;
                let user: Option<String> = row.try_get(1).map_err(query_err(format!("read the user of {id}")))?;
                found.insert(id, user);
            }
        }
        accounts
            .iter()
            .map(|account| match found.remove(account.as_str()).flatten() {
                Some(user) => UserId::new(&user).map(Some).map_err(|_| corrupt(account.as_str(), "user_id", &user)),
                None => Ok(None),
            })
            .collect()
    }

    /// How many accounts each bucket holds: with `only`, one answer per
    /// bucket named (0 for an empty one); without, every bucket that holds
    /// any. The weights a lease store that lost them is given again.
    pub async fn bucket_weights(&self, only: Option<&[BucketId]>) -> Result<Vec<(BucketId, u64)>, StorageError> {
        const GROUPED: &str = "SELECT bucket, COUNT(*) FROM accounts WHERE bucket IS NOT NULL";
        let Some(only) = only else {
            let sql = format!("{GROUPED} GROUP BY bucket");
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                .fetch_all(&self.pool)
                .await
                .map_err(query_err("count the accounts per bucket"))?;
            return rows.iter().map(weight_row).collect();
        };
        let mut counts: std::collections::BTreeMap<BucketId, u64> = only.iter().map(|b| (*b, 0)).collect();
        for chunk in only.chunks(BUCKETS_PER_QUERY) {
            // Built from placeholders only; the values are bound.
            let sql = format!("{GROUPED} AND bucket IN ({}) GROUP BY bucket", placeholders(chunk.len()));
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for bucket in chunk {
                query = query.bind(i64::from(bucket.0));
            }
            let rows = query.fetch_all(&self.pool).await.map_err(query_err("count the accounts of some buckets"))?;
            for row in &rows {
                let (bucket, count) = weight_row(row)?;
                counts.insert(bucket, count);
            }
        }
        Ok(counts.into_iter().collect())
    }

    /// The highest fencing token stored for an account of `bucket` (0 when
    /// none): what a bucket's token counter must pass after the lease store
    /// lost its counters.
    pub async fn highest_token_in_bucket(&self, bucket: BucketId) -> Result<FencingToken, StorageError> {
        let row = sqlx::query("SELECT MAX(fence_token) FROM accounts WHERE bucket = $1")
            .bind(i64::from(bucket.0))
            .fetch_one(&self.pool)
            .await
            .map_err(query_err(format!("read the highest fencing token of bucket {bucket}")))?;
        let highest: Option<i64> = row.try_get(0).map_err(query_err("read a fencing token"))?;
        Ok(FencingToken(highest.unwrap_or(0).max(0) as u64))
    }
}

/// `$1, $2, …, $n`.
fn placeholders(n: usize) -> String {
    (1..=n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}

/// A `(bucket, COUNT(*))` row.
fn weight_row(row: &sqlx::any::AnyRow) -> Result<(BucketId, u64), StorageError> {
    let bucket: i64 = row.try_get(0).map_err(query_err("read a bucket"))?;
    let count: i64 = row.try_get(1).map_err(query_err("read a bucket's account count"))?;
    let bucket = u32::try_from(bucket).map_err(|_| corrupt("(bucket)", "bucket", bucket))?;
    Ok((BucketId(bucket), count.max(0) as u64))
}
