//! The cache of whole messages the API has read from IMAP
//! (`message_views`): one JSON text per message, kept up to a per-account
//! number of bytes, least recently used first out. Only the API writes
//! here, and never a mail row: a cached view exists only while its
//! message's row does (the foreign key takes it when the sync deletes the
//! row).

use sqlx::Row;

use super::views::MessageKey;
use super::{now_ms, query_err, Storage, StorageError};

/// How stale a view's last use may be before a read records it again.
const TOUCH_EVERY_MS: i64 = 60_000;

const KEY_MATCH: &str = "account_id = $1 AND folder = $2 AND uidvalidity = $3 AND uid = $4";

/// `sql` (constant text around [`KEY_MATCH`]) with the key bound to `$1`..`$4`.
fn keyed<'q>(
    sql: String,
    account: &'q str,
    key: &'q MessageKey,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(account)
        .bind(key.folder.as_str())
        .bind(i64::from(key.uidvalidity))
        .bind(i64::from(key.uid))
}

impl Storage {
    /// The cached view of message `key` of `account`, marked as used now
    /// (to the minute: a read of a view read within the minute writes
    /// nothing); `None` when it is not cached.
    pub async fn cached_view(&self, account: &str, key: &MessageKey) -> Result<Option<String>, StorageError> {
        let op = || format!("read the cached view of {account}/{}/{}", key.folder, key.uid);
        let row = keyed(format!("SELECT body, used_at FROM message_views WHERE {KEY_MATCH}"), account, key)
            .fetch_optional(&self.pool)
            .await
            .map_err(query_err(op()))?;
        let Some(row) = row else { return Ok(None) };
        let body: String = row.try_get(0).map_err(query_err(op()))?;
        let used_at: i64 = row.try_get(1).map_err(query_err(op()))?;
        let now = now_ms();
        if now - used_at > TOUCH_EVERY_MS {
            keyed(format!("UPDATE message_views SET used_at = $5 WHERE {KEY_MATCH}"), account, key)
                .bind(now)
                .execute(&self.pool)
                .await
                .map_err(query_err(op()))?;
        }
        Ok(Some(body))
    }

    /// Caches `body` as the view of message `key` of `account`, then drops
    /// the least recently used views of `account` until it holds at most
    /// `cap` bytes. A view larger than `cap` is not cached; nor is one whose
    /// message row has gone meanwhile (`false` then).
    pub async fn cache_view(
        &self,
        account: &str,
        key: &MessageKey,
        body: &str,
        cap: u64,
    ) -> Result<bool, StorageError> {
        let size = body.len() as u64;
        if size > cap {
            return Ok(false);
        }
        let stored = sqlx::query(
            "INSERT INTO message_views (account_id, folder, uidvalidity, uid, body, size, used_at) \
             SELECT account_id, folder, uidvalidity, uid, $5, $6, $7 FROM messages \
             WHERE account_id = $1 AND folder = $2 AND uidvalidity = $3 AND uid = $4 \
             ON CONFLICT (account_id, folder, uidvalidity, uid) \
             DO UPDATE SET body = excluded.body, size = excluded.size, used_at = excluded.used_at",
        )
        .bind(account)
        .bind(&key.folder)
        .bind(i64::from(key.uidvalidity))
        .bind(i64::from(key.uid))
        .bind(body)
        .bind(size as i64)
        .bind(now_ms())
        .execute(&self.pool)
        .await;
        let stored = match stored {
            Ok(done) => done.rows_affected() > 0,
            // The row went between the SELECT and the insert's key check.
            Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => false,
            Err(e) => return Err(query_err(format!("cache the view of {account}/{}/{}", key.folder, key.uid))(e)),
        };
        self.evict_views(account, cap).await?;
        Ok(stored)
    }

    /// Drops `account`'s least recently used views until it holds at most `cap` bytes.
    async fn evict_views(&self, account: &str, cap: u64) -> Result<(), StorageError> {
        let op = || format!("evict cached views of {account}");
        let rows = sqlx::query(
            "SELECT folder, uidvalidity, uid, size FROM message_views WHERE account_id = $1 \
             ORDER BY used_at DESC, uid DESC",
        )
        .bind(account)
        .fetch_all(&self.pool)
        .await
        .map_err(query_err(op()))?;
        let mut kept = 0u64;
        for row in rows {
            let size: i64 = row.try_get(3).map_err(query_err(op()))?;
            kept += size.max(0) as u64;
            if kept <= cap {
                continue;
            }
            let folder: String = row.try_get(0).map_err(query_err(op()))?;
            let uidvalidity: i64 = row.try_get(1).map_err(query_err(op()))?;
            let uid: i64 = row.try_get(2).map_err(query_err(op()))?;
            sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM message_views WHERE {KEY_MATCH}")))
                .bind(account)
                .bind(folder)
                .bind(uidvalidity)
                .bind(uid)
                .execute(&self.pool)
                .await
                .map_err(query_err(op()))?;
        }
        Ok(())
    }

    /// Forgets the cached view of message `key` of `account` (the server no
    /// longer has the message).
    pub async fn forget_view(&self, account: &str, key: &MessageKey) -> Result<(), StorageError> {
        keyed(format!("DELETE FROM message_views WHERE {KEY_MATCH}"), account, key)
            .execute(&self.pool)
            .await
            .map_err(query_err(format!("forget the view of {account}/{}/{}", key.folder, key.uid)))?;
        Ok(())
    }

    /// How many views of `account` are cached, and their bytes.
    pub async fn cached_views(&self, account: &str) -> Result<(u64, u64), StorageError> {
        let op = || format!("count cached views of {account}");
        let row = sqlx::query(
            "SELECT COUNT(*), CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM message_views WHERE account_id = $1",
        )
        .bind(account)
        .fetch_one(&self.pool)
        .await
        .map_err(query_err(op()))?;
        let n: i64 = row.try_get(0).map_err(query_err(op()))?;
        let bytes: i64 = row.try_get(1).map_err(query_err(op()))?;
        Ok((n.max(0) as u64, bytes.max(0) as u64))
    }
}
