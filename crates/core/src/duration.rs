//! Durations as people type them, read one way by every binary: a plain
//! number in the setting's own unit (`30`, `1.5`), or a number with units in
//! humantime's syntax (`500ms`, `90s`, `2m`, `1h 30m`).

use std::time::Duration;

/// The longest duration accepted: ten years.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 86_400);

/// The unit of a plain number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlainUnit {
    /// `30` means 30 seconds.
    Seconds,
    /// `5` means 5 minutes.
    Minutes,
    /// `2` means 2 hours.
    Hours,
}

impl PlainUnit {
    fn seconds(self) -> f64 {
        match self {
            PlainUnit::Seconds => 1.0,
            PlainUnit::Minutes => 60.0,
            PlainUnit::Hours => 3600.0,
        }
    }

    /// `seconds`, `minutes` or `hours`.
    pub fn name(self) -> &'static str {
        match self {
            PlainUnit::Seconds => "seconds",
            PlainUnit::Minutes => "minutes",
            PlainUnit::Hours => "hours",
        }
    }
}

/// A duration could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DurationError {
    /// Neither a number nor a humantime duration.
    #[error(
        "{text:?} is not a duration: give a number of {} (e.g. 60 or 1.5) or a number with a unit (500ms, 60s, 2m, 1h 30m)",
        .unit.name()
    )]
    Invalid {
        /// What was given.
        text: String,
        /// The unit of a plain number.
        unit: PlainUnit,
    },
    /// Longer than [`MAX_DURATION`].
    #[error("{text:?} is longer than the limit of 10 years")]
    TooLong {
        /// What was given.
        text: String,
    },
    /// Zero, or less than a millisecond.
    #[error("{text:?} is less than 1 ms: give a positive duration")]
    Zero {
        /// What was given.
        text: String,
        /// What it reads as.
        value: Duration,
    },
}

/// Reads `text` (see the module docs): at least 1 ms, at most [`MAX_DURATION`].
pub fn parse_duration(text: &str, plain: PlainUnit) -> Result<Duration, DurationError> {
    let trimmed = text.trim();
    let invalid = || DurationError::Invalid { text: text.to_owned(), unit: plain };
    let value = match trimmed.parse::<f64>() {
        Ok(n) if !n.is_finite() || n < 0.0 => return Err(invalid()),
        Ok(n) if n * plain.seconds() > MAX_DURATION.as_secs_f64() => {
            return Err(DurationError::TooLong { text: text.to_owned() })
        }
        Ok(n) => Duration::from_secs_f64(n * plain.seconds()),
        Err(_) => humantime::parse_duration(trimmed).map_err(|_| invalid())?,
    };
    if value > MAX_DURATION {
        return Err(DurationError::TooLong { text: text.to_owned() });
    }
    if value.as_millis() == 0 {
        return Err(DurationError::Zero { text: text.to_owned(), value });
    }
    Ok(value)
}

/// `d` in whole milliseconds, saturating at `u64::MAX` (the unit every
/// backend stores times in).
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `delay` scaled by a random factor in `[1 - spread, 1]`, so that processes
/// that failed together do not retry in step. `spread` is clamped to `[0, 1]`.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::duration::jitter;
///
/// let delay = jitter(Duration::from_secs(10), 0.2);
/// assert!(delay >= Duration::from_secs(8) && delay <= Duration::from_secs(10));
/// ```
pub fn jitter(delay: Duration, spread: f64) -> Duration {
    let spread = spread.clamp(0.0, 1.0);
    delay.mul_f64(1.0 - spread * fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_numbers_take_the_settings_unit() {
        assert_eq!(parse_duration("30", PlainUnit::Seconds), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration(" 1.5 ", PlainUnit::Seconds), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0.5", PlainUnit::Hours), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("5", PlainUnit::Minutes), Ok(Duration::from_secs(300)));
    }

    #[test]
    fn units_follow_humantime() {
        assert_eq!(parse_duration("1500ms", PlainUnit::Hours), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("10m", PlainUnit::Seconds), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h 30m", PlainUnit::Seconds), Ok(Duration::from_secs(5400)));
    }

    #[test]
    fn bad_zero_and_huge_values_are_refused() {
        for bad in ["soon", "-1", "NaN", "inf", "", "5 parsecs"] {
            assert!(matches!(parse_duration(bad, PlainUnit::Seconds), Err(DurationError::Invalid { .. })), "{bad}");
        }
        assert!(matches!(parse_duration("0", PlainUnit::Seconds), Err(DurationError::Zero { .. })));
        assert!(matches!(parse_duration("0.0001", PlainUnit::Seconds), Err(DurationError::Zero { .. })));
        assert!(matches!(parse_duration("11y", PlainUnit::Seconds), Err(DurationError::TooLong { .. })));
        assert!(matches!(parse_duration("1e12", PlainUnit::Seconds), Err(DurationError::TooLong { .. })));
        let e = parse_duration("soon", PlainUnit::Minutes).unwrap_err().to_string();
        assert!(e.contains("soon") && e.contains("minutes"), "{e}");
    }
}
