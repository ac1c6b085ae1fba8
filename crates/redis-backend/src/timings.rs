//! [`TimingsStore`] on Redis: one hash (`P:hopper:timings`, unit → ms)
//! shared by every worker of every build under the prefix.

use std::collections::HashMap;

use async_trait::async_trait;
use leasehold_core::{TimingsError, TimingsStore};

use crate::keys;
use crate::store::RedisStore;

/// Timings outlive builds: a month after the last build that wrote them.
const TIMINGS_TTL_SECS: u64 = 30 * 24 * 3600;
/// Units written per HSET.
const CHUNK: usize = 1000;

fn backend(op: &'static str) -> impl FnOnce(redis::RedisError) -> TimingsError {
    move |e| TimingsError::Backend { op, source: Box::new(e) }
}

#[async_trait]
impl TimingsStore for RedisStore {
    async fn load(&self) -> Result<HashMap<String, u64>, TimingsError> {
        let mut conn = self.conn();
        redis::cmd("HGETALL").arg(keys::timings(self.prefix())).query_async(&mut conn).await.map_err(backend("load"))
    }

    /// Writes the durations and renews the hash's TTL.
    async fn record(&self, timings: &[(String, u64)]) -> Result<(), TimingsError> {
        if timings.is_empty() {
            return Ok(());
        }
        let key = keys::timings(self.prefix());
        let mut conn = self.conn();
        for chunk in timings.chunks(CHUNK) {
            let mut cmd = redis::cmd("HSET");
            cmd.arg(&key);
            for (unit, ms) in chunk {
                cmd.arg(unit).arg(*ms);
            }
            cmd.query_async::<i64>(&mut conn).await.map_err(backend("record"))?;
        }
        redis::cmd("EXPIRE")
            .arg(&key)
            .arg(TIMINGS_TTL_SECS)
            .query_async::<i64>(&mut conn)
            .await
            .map_err(backend("record"))?;
        Ok(())
    }
}
