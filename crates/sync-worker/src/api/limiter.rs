//! Failed-login bounds: at most so many failed logins per e-mail address
//! and per client address in each fixed window, so a password cannot be
//! guessed at the API's speed.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::errors::ApiError;

/// Failed-login counting: at most `per_email` failures per address and
/// `per_client` per client IP within each `window`.
#[derive(Debug)]
pub struct LoginLimiter {
    per_email: u32,
    per_client: u32,
    window: Duration,
    failures: Mutex<HashMap<String, (Instant, u32)>>,
}

impl LoginLimiter {
    /// A limiter with these bounds.
    pub fn new(per_email: u32, per_client: u32, window: Duration) -> Self {
        Self { per_email, per_client, window, failures: Mutex::new(HashMap::new()) }
    }

    fn keys(email: &str, client: Option<IpAddr>) -> [Option<String>; 2] {
        [Some(format!("email:{email}")), client.map(|ip| format!("ip:{ip}"))]
    }

    /// `Err` with the seconds to wait when either bound is reached.
    pub fn check(&self, email: &str, client: Option<IpAddr>) -> Result<(), ApiError> {
        let now = Instant::now();
        let mut map = self.failures.lock();
        map.retain(|_, (start, _)| now.duration_since(*start) < self.window);
        for (key, limit) in Self::keys(email, client).into_iter().zip([self.per_email, self.per_client]) {
            if let Some((start, n)) = key.and_then(|k| map.get(&k).copied()) {
                if n >= limit {
                    let wait = self.window.saturating_sub(now.duration_since(start));
                    return Err(ApiError::RateLimited { retry_after_s: wait.as_secs().max(1) });
                }
            }
        }
        Ok(())
    }

    /// Counts one failure.
    pub fn failed(&self, email: &str, client: Option<IpAddr>) {
        let now = Instant::now();
        let mut map = self.failures.lock();
        for key in Self::keys(email, client).into_iter().flatten() {
            map.entry(key).or_insert((now, 0)).1 += 1;
        }
    }

    /// Forgets the address's failures after a good login.
    pub fn succeeded(&self, email: &str) {
        self.failures.lock().remove(&format!("email:{email}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limiter_stops_an_address_and_a_client_after_their_bounds() {
        let l = LoginLimiter::new(2, 3, Duration::from_secs(60));
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        l.failed("a@b", Some(ip));
        assert!(l.check("a@b", Some(ip)).is_ok());
        l.failed("a@b", Some(ip));
        assert!(matches!(l.check("a@b", Some(ip)), Err(ApiError::RateLimited { .. })));
        assert!(l.check("c@d", Some(ip)).is_ok());
        l.failed("c@d", Some(ip));
        assert!(matches!(l.check("e@f", Some(ip)), Err(ApiError::RateLimited { .. })), "the client's bound");
        assert!(l.check("e@f", None).is_ok());
        l.succeeded("a@b");
        assert!(l.check("a@b", None).is_ok());
    }
}
