//! [`Ttl`]: a time-to-live or timeout that cannot be zero, checked once
//! where it is made, so no store has to check it again.

use std::fmt;
use std::time::Duration;

use crate::errors::SpecError;

/// A time-to-live, grace period or timeout of at least one millisecond (the
/// stores count time in whole milliseconds).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ttl(Duration);

impl Ttl {
    /// `value` as a TTL; [`SpecError::ZeroTtl`] (naming `what`) when it is
    /// under one millisecond.
    pub fn new(what: &'static str, value: Duration) -> Result<Self, SpecError> {
        if value.as_millis() == 0 {
            return Err(SpecError::ZeroTtl { what, ttl: value });
        }
        Ok(Self(value))
    }

    /// A TTL of `ms` milliseconds, for constants.
    ///
    /// # Panics
    ///
    /// When `ms` is zero (at compile time in a `const`). Use [`Ttl::new`] for
    /// values that come from outside.
    pub const fn from_millis(ms: u64) -> Self {
        assert!(ms > 0, "a TTL is at least 1 ms");
        Self(Duration::from_millis(ms))
    }

    /// A TTL of `secs` seconds, for constants.
    ///
    /// # Panics
    ///
    /// When `secs` is zero, like [`Ttl::from_millis`].
    pub const fn from_secs(secs: u64) -> Self {
        assert!(secs > 0, "a TTL is at least 1 ms");
        Self(Duration::from_secs(secs))
    }

    /// The duration.
    pub const fn get(self) -> Duration {
        self.0
    }

    /// Whole milliseconds (at least 1), saturating at `u64::MAX`.
    pub fn as_millis(self) -> u64 {
        self.0.as_millis().min(u64::MAX as u128) as u64
    }
}

impl fmt::Debug for Ttl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl From<Ttl> for Duration {
    fn from(ttl: Ttl) -> Self {
        ttl.0
    }
}

impl TryFrom<Duration> for Ttl {
    type Error = SpecError;
    fn try_from(value: Duration) -> Result<Self, Self::Error> {
        Self::new("time-to-live", value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ttl_is_at_least_one_millisecond() {
        assert!(matches!(Ttl::new("lease TTL", Duration::ZERO), Err(SpecError::ZeroTtl { what: "lease TTL", .. })));
        assert!(Ttl::new("x", Duration::from_micros(999)).is_err());
        let ttl = Ttl::new("x", Duration::from_micros(1500)).unwrap();
        assert_eq!((ttl.get(), ttl.as_millis()), (Duration::from_micros(1500), 1));
        assert_eq!(Ttl::from_secs(2).as_millis(), 2000);
        assert_eq!(Ttl::try_from(Duration::from_secs(1)).unwrap(), Ttl::from_millis(1000));
    }
}
