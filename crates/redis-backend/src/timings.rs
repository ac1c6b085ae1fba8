//! [`TimingsStore`] on Redis: one hash of durations (`P:hopper:timings`,
//! unit → ms) and one of pass streaks (`P:hopper:streaks`, unit →
//! `"<passes> <before> <run>"`, counted by `lua/timings_outcomes.lua`),
//! shared by every worker and report of every build under the prefix.

use std::collections::HashMap;

use async_trait::async_trait;
use leasehold_core::{PassStreak, TimingsError, TimingsStore};

use crate::conn::Call;
use crate::keys;
use crate::scripts;
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

    /// Reads every streak; a field of another shape (written by something
    /// else) is skipped, as an unknown unit would be.
    async fn load_streaks(&self) -> Result<HashMap<String, PassStreak>, TimingsError> {
        let mut conn = self.conn();
        let raw: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(keys::streaks(self.prefix()))
            .query_async(&mut conn)
            .await
            .map_err(backend("load_streaks"))?;
        Ok(raw.into_iter().filter_map(|(unit, value)| parse_streak(&value).map(|s| (unit, s))).collect())
    }

    /// Counts the outcomes, [`CHUNK`] units per script call, and renews the
    /// hash's TTL.
    async fn record_outcomes(&self, run: &str, outcomes: &[(String, bool)]) -> Result<(), TimingsError> {
        let key = keys::streaks(self.prefix());
        for chunk in outcomes.chunks(CHUNK) {
            let mut call = Call::new([&key]).arg(run).arg(TIMINGS_TTL_SECS);
            for (unit, passed) in chunk {
                call = call.arg(unit.as_str()).arg(if *passed { "1" } else { "0" });
            }
            self.eval(&scripts::TIMINGS_OUTCOMES, &call)
                .await
                .map_err(|e| TimingsError::Backend { op: "record_outcomes", source: Box::new(e) })?;
        }
        Ok(())
    }
}

/// `"<passes> <before> <run>"`, as `lua/timings_outcomes.lua` writes it.
fn parse_streak(value: &str) -> Option<PassStreak> {
    let mut parts = value.splitn(3, ' ');
    let passes = parts.next()?.parse().ok()?;
    let before = parts.next()?.parse().ok()?;
    let run = parts.next()?.to_owned();
    Some(PassStreak { passes, before, run })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streak_fields_parse_with_spaces_in_the_run_and_others_are_refused() {
        assert_eq!(parse_streak("3 2 b 1"), Some(PassStreak { passes: 3, before: 2, run: "b 1".into() }));
        assert_eq!(parse_streak("x 2 b"), None);
        assert_eq!(parse_streak("3"), None);
    }
}
