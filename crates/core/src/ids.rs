//! Validated identifiers.
//!
//! Every id is checked once, when it is made, so backends never see an empty,
//! over-long or malformed one. Ids that become part of a storage key (runs,
//! workers, lease keys, users) may not contain whitespace, control characters
//! or braces (braces would break a Redis Cluster hash tag). Unit ids are values,
//! not keys, so they may hold spaces and braces, but never control characters.
//! Ids are reference-counted strings: cloning one is cheap.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::errors::IdError;

/// Longest id accepted for ids that become part of a storage key, in bytes.
pub const MAX_KEY_ID_LEN: usize = 200;
/// Longest unit id accepted, in bytes (long test names with parameters fit).
pub const MAX_UNIT_ID_LEN: usize = 4096;

/// Whether `c` may stand in a storage key: no control characters, no
/// whitespace and no braces (a brace would break a Redis Cluster hash tag).
/// The one rule for every key-bound id, key prefix and derived worker name.
pub fn is_key_safe_char(c: char) -> bool {
    !(c.is_control() || c.is_whitespace() || c == '{' || c == '}')
}

fn check(kind: &'static str, value: &str, max: usize, key_safe: bool) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty { kind });
    }
    if value.len() > max {
        return Err(IdError::TooLong { kind, len: value.len(), max });
    }
    if let Some(c) = value.chars().find(|&c| c.is_control() || (key_safe && !is_key_safe_char(c))) {
        return Err(IdError::InvalidChar { kind, value: value.escape_debug().to_string(), found: c });
    }
    Ok(())
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $max:expr, $key_safe:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Validates `value` and wraps it.
            pub fn new(value: impl AsRef<str>) -> Result<Self, IdError> {
                let value = value.as_ref();
                check($kind, value, $max, $key_safe)?;
                Ok(Self(Arc::from(value)))
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = IdError;
            fn try_from(s: &str) -> Result<Self, Self::Error> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                Self::new(s)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                Self::new(&*s).map_err(serde::de::Error::custom)
            }
        }
    };
}

id_type!(
    /// One run of the unit queue (a CI build, say). Part of every key of the run.
    RunId, "run id", MAX_KEY_ID_LEN, true
);
id_type!(
    /// A worker process (a queue consumer, or a lease owner).
    WorkerId, "worker id", MAX_KEY_ID_LEN, true
);
impl WorkerId {
    /// An id for this process, unique among the processes of any number of
    /// machines: `<hostname>-<pid>-<random>` (the random part tells apart
    /// two processes of the same pid, in containers or after a pid reuse).
    /// Characters a key may not hold are replaced by `-`, and a long
    /// hostname is cut, so the id is always valid.
    pub fn for_this_process() -> Self {
        let host: String = gethostname::gethostname()
            .to_string_lossy()
            .trim()
            .chars()
            .map(|c| if is_key_safe_char(c) { c } else { '-' })
            .take(64)
            .collect();
        let host = if host.is_empty() { "worker".to_owned() } else { host };
        let id = format!("{host}-{}-{:06x}", std::process::id(), fastrand::u32(..0x100_0000));
        // Proven valid: non-empty, key-safe characters only, at most 64 + 1 + 10 + 1 + 6 bytes.
        Self::new(id).expect("a sanitised hostname, a pid and hex digits form a valid worker id")
    }
}

id_type!(
    /// The key a lease is held on (for sync-worker: an account id).
    LeaseKey, "lease key", MAX_KEY_ID_LEN, true
);
id_type!(
    /// A user whose presence promotes their accounts.
    UserId, "user id", MAX_KEY_ID_LEN, true
);
id_type!(
    /// One unit of work in a run (a test file, a single test, ...).
    UnitId, "unit id", MAX_UNIT_ID_LEN, false
);

/// The position of one entry in a queue stream, ordered like a Redis stream id
/// (`<ms>-<seq>`). Entry ids only identify a delivery; their values differ
/// between backends and runs.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct EntryId {
    /// Milliseconds part.
    pub ms: u64,
    /// Sequence within the millisecond.
    pub seq: u64,
}

impl EntryId {
    /// Builds an entry id from its two parts.
    pub const fn new(ms: u64, seq: u64) -> Self {
        Self { ms, seq }
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

impl fmt::Debug for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EntryId({self})")
    }
}

impl FromStr for EntryId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || IdError::BadEntryId { value: s.escape_debug().to_string() };
        let (ms, seq) = s.split_once('-').ok_or_else(bad)?;
        Ok(Self { ms: ms.parse().map_err(|_| bad())?, seq: seq.parse().map_err(|_| bad())? })
    }
}

impl Serialize for EntryId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for EntryId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_empty_long_and_malformed_ids() {
        assert!(matches!(RunId::new(""), Err(IdError::Empty { .. })));
        assert!(matches!(RunId::new("x".repeat(201)), Err(IdError::TooLong { len: 201, .. })));
        assert!(matches!(RunId::new("a{b}"), Err(IdError::InvalidChar { found: '{', .. })));
        let (a, b) = (WorkerId::for_this_process(), WorkerId::for_this_process());
        assert_ne!(a, b, "the random part differs");
        assert!(a.as_str().contains(&format!("-{}-", std::process::id())), "{a}");
        assert!(matches!(WorkerId::new("a b"), Err(IdError::InvalidChar { .. })));
        assert!(matches!(UnitId::new("a\nb"), Err(IdError::InvalidChar { .. })));
        assert!(UnitId::new("tests/a b {x}.rs").is_ok());
        assert!(RunId::new("build-42").is_ok());
    }

    #[test]
    fn error_message_names_the_kind_and_the_fix() {
        let err = LeaseKey::new("").unwrap_err().to_string();
        assert!(err.contains("lease key"), "{err}");
    }

    #[test]
    fn entry_ids_round_trip_and_order() {
        let a: EntryId = "5-1".parse().unwrap();
        assert_eq!(a, EntryId::new(5, 1));
        assert!(EntryId::new(5, 2) > a);
        assert_eq!(a.to_string(), "5-1");
        assert!("5".parse::<EntryId>().is_err());
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, "\"5-1\"");
    }

    #[test]
    fn ids_deserialize_with_validation() {
        let ok: UnitId = serde_json::from_str("\"t1\"").unwrap();
        assert_eq!(ok.as_str(), "t1");
        assert!(serde_json::from_str::<RunId>("\"\"").is_err());
    }
}
