//! The dispatcher's settings, from the environment (`WEBHOOK_*`).

use std::num::NonZeroUsize;
use std::time::Duration;

use leasehold_core::duration::{parse_duration, PlainUnit};
use leasehold_core::Ttl;

use crate::errors::ConfigError;

/// How webhooks are delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookSettings {
    /// `WEBHOOK_RETRIES`: attempts after the first before a delivery fails
    /// and its webhook is paused (the queue's `max_requeues`).
    pub retries: u32,
    /// `WEBHOOK_BACKOFF`: the wait before the first retry; each later one doubles it.
    pub backoff: Duration,
    /// `WEBHOOK_BACKOFF_MAX`: the longest wait between two attempts.
    pub backoff_max: Duration,
    /// `WEBHOOK_TIMEOUT`: how long one POST may take, connect to answer.
    pub timeout: Duration,
    /// `WEBHOOK_RECLAIM_AFTER`: a delivery whose worker sent no heartbeat
    /// for this long is taken over by another worker.
    pub reclaim_after: Ttl,
    /// `WEBHOOK_CONCURRENCY`: POSTs one worker has open at once.
    pub concurrency: NonZeroUsize,
    /// How often a worker looks for deliveries (batches other workers wrote).
    pub poll: Duration,
    /// How long delivered and failed deliveries are kept for
    /// `GET /v1/webhooks/{id}/deliveries`.
    pub retention: Duration,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        Self {
            retries: 10,
            backoff: Duration::from_secs(5),
            backoff_max: Duration::from_secs(3600),
            timeout: Duration::from_secs(10),
            reclaim_after: Ttl::from_secs(60),
            concurrency: NonZeroUsize::new(16).unwrap_or(NonZeroUsize::MIN),
            poll: Duration::from_millis(500),
            retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

impl WebhookSettings {
    /// The wait before the retry after attempt `retry_index + 1` failed:
    /// `backoff × 2^retry_index`, at most `backoff_max`.
    pub fn backoff_after(&self, retry_index: u32) -> Duration {
        let factor = 1u32.checked_shl(retry_index.min(31)).unwrap_or(u32::MAX);
        self.backoff.saturating_mul(factor).min(self.backoff_max)
    }

    /// Reads the `WEBHOOK_*` variables through `get` (unset or empty: the default).
    pub fn read(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let duration = |var: &'static str, slot: &mut Duration| -> Result<(), ConfigError> {
            if let Some(v) = get(var) {
                *slot = parse_duration(&v, PlainUnit::Seconds).map_err(|e| ConfigError::Invalid {
                    var,
                    value: v.clone(),
                    expected: format!("a duration above zero such as 5s or 500ms ({e})"),
                })?;
            }
            Ok(())
        };
        duration("WEBHOOK_BACKOFF", &mut self.backoff)?;
        duration("WEBHOOK_BACKOFF_MAX", &mut self.backoff_max)?;
        duration("WEBHOOK_TIMEOUT", &mut self.timeout)?;
        let mut reclaim = self.reclaim_after.get();
        duration("WEBHOOK_RECLAIM_AFTER", &mut reclaim)?;
        self.reclaim_after = Ttl::new("WEBHOOK_RECLAIM_AFTER", reclaim).map_err(|_| ConfigError::Invalid {
            var: "WEBHOOK_RECLAIM_AFTER",
            value: format!("{reclaim:?}"),
            expected: "a duration of at least 1ms".into(),
        })?;
        if let Some(v) = get("WEBHOOK_RETRIES") {
            self.retries = v.trim().parse().ok().filter(|n| *n <= 100).ok_or(ConfigError::Invalid {
                var: "WEBHOOK_RETRIES",
                value: v.clone(),
                expected: "a whole number of retries, 0 to 100".into(),
            })?;
        }
        if let Some(v) = get("WEBHOOK_CONCURRENCY") {
            self.concurrency =
                v.trim().parse().ok().filter(|n: &NonZeroUsize| n.get() <= 1024).ok_or(ConfigError::Invalid {
                    var: "WEBHOOK_CONCURRENCY",
                    value: v.clone(),
                    expected: "a whole number of POSTs at once, 1 to 1024".into(),
                })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pairs: &[(&str, &str)]) -> Result<WebhookSettings, ConfigError> {
        let mut s = WebhookSettings::default();
        s.read(|k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))?;
        Ok(s)
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let s = WebhookSettings {
            backoff: Duration::from_secs(5),
            backoff_max: Duration::from_secs(60),
            ..Default::default()
        };
        let waits: Vec<u64> = (0..6).map(|i| s.backoff_after(i).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 60, 60]);
        assert_eq!(s.backoff_after(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn reads_and_names_bad_values() {
        let s =
            read(&[("WEBHOOK_RETRIES", "3"), ("WEBHOOK_BACKOFF", "50ms"), ("WEBHOOK_RECLAIM_AFTER", "2s")]).unwrap();
        assert_eq!(
            (s.retries, s.backoff, s.reclaim_after.get()),
            (3, Duration::from_millis(50), Duration::from_secs(2))
        );
        for (var, value) in [("WEBHOOK_RETRIES", "many"), ("WEBHOOK_BACKOFF", "0"), ("WEBHOOK_CONCURRENCY", "0")] {
            let e = read(&[(var, value)]).unwrap_err().to_string();
            assert!(e.contains(var), "{e}");
        }
    }
}
