//! The key layout.
//!
//! Keys keep the seed's names under a configurable prefix `P`:
//!
//! | what | key |
//! | --- | --- |
//! | a run's main stream | `P:hopper:{run}:units` |
//! | its priority stream | `P:hopper:{run}:units:priority` |
//! | its event log | `P:hopper:{run}:attempts` |
//! | its meta | `P:hopper:{run}:meta` |
//! | per-unit state | `P:hopper:{run}:unit_state` |
//! | worker records | `P:hopper:{run}:workers` |
//! | entries waiting for a place in their group | `P:hopper:{run}:parked` |
//! | unit timings of earlier runs (30-day TTL) | `P:hopper:timings` |
//! | units' pass streaks over earlier runs (30-day TTL) | `P:hopper:streaks` |
//! | a lease | `{P}:sync:lease:<id>` |
//! | its fence counter (no TTL) | `{P}:sync:fence:<id>` |
//! | the live set | `{P}:sync:live` |
//! | a worker registration | `{P}:sync:workers:<id>` |
//! | the registration index (sorted by expiry) | `{P}:sync:workers` |
//! | a tier | `{P}:sync:tier:<id>` |
//! | bucket leases: count and total weight, weights, fence counters, owners, expiries, workers, loads | `{P}:sync:buckets:{meta,weights,versions,fences,owners,expiry,workers,loads}` |
//! | a user's presence | `{P}:sess:active:<user>` |
//! | the `user.active` channel | `P:user.active` |
//! | the bucket change channel | `P:sync:bucket.changed` |
//!
//! **Entries.** A stream entry is one field, the unit id valued its kind
//! (`XADD … <unit> <kind>`); entries of older versions hold `id` and `type`
//! fields, and both are read. An event-log entry holds one event (`json`),
//! or the events of one transition call packed as tokens (`packed`, see
//! `lua/transition/events.lua`: the two events every unit has are stored as
//! their few varying fields, the reader rebuilds them); older versions wrote
//! a JSON array (`batch`), still read.
//!
//! **Hash tags.** All keys of one run share the tag `{run}`, so each
//! transition script (which touches all six) runs on one Redis Cluster node.
//! All keys of the lease space share the tag `{P}`: a claim touches the lease,
//! its fence counter and its tier; `mark_not_live` the live set, the lease and
//! the tier; registration the worker key and the index. The trade-off: the
//! whole lease space of one prefix lives in one slot, hence on one cluster
//! node, so leases do not spread over the cluster. Lease traffic is small
//! (one renew per owned key per few seconds), so one node is ample; a
//! deployment that outgrows it can run several lease spaces under different
//! prefixes. Run keys spread over the cluster by run id.
//!
//! **Fence counters never expire, on purpose.** Downstream storage keeps the
//! highest token it has seen per key and refuses lower ones. A counter that
//! expired would start again at 1: the next owner's writes would be refused
//! forever, or, where storage forgot the key too, a stale owner's old token
//! could outrank a new one. So a counter lives as long as the key may be
//! leased again: one small string per key that was ever claimed (about 60
//! bytes with its name), which grows with the number of distinct keys, not
//! with claims. To retire a key for good, delete its counter together with
//! the token storage keeps for it (never one without the other). A Redis that
//! lost its counters anyway (restarted without its data, or flushed) is
//! repaired key by key with `raise_token` (`lua/lease_raise_token.lua`), by
//! the owner that finds storage holding a token above its own. Everything
//! else expires: leases and registrations by their TTL, run keys by the run's
//! inactivity TTL, timings after 30 days.

use leasehold_core::{LeaseKey, RunId, UserId, WorkerId};

/// The hash of unit timings under `prefix` (see [`leasehold_core::TimingsStore`]).
pub fn timings(prefix: &str) -> String {
    format!("{prefix}:hopper:timings")
}

/// The hash of units' pass streaks under `prefix` (see [`leasehold_core::PassStreak`]).
pub fn streaks(prefix: &str) -> String {
    format!("{prefix}:hopper:streaks")
}

/// The queue format this version writes: the layout of a run's keys and
/// stream entries. Workers share a run only when they write the same format;
/// it is raised by every change an older worker could misread. Format 1 is
/// every version from before the format was recorded; 2 tagged runs with
/// their format; 3 keeps each group's running count in the meta hash (a
/// format-2 worker would never lower it, and its group would stall); 4
/// stores a unit's state only once it changes (a format-3 worker would read
/// a fresh unit's absent state as lost); 5 hands the main queue out as
/// ranges of the unit list (`docs/queue-model.md`: a format-4 worker would
/// read the main stream with `>` and take every unit at once).
pub const QUEUE_FORMAT: u32 = 5;

/// Units a field of a run's `chunks` hash holds (format 5): the unit list,
/// packed `unit\tkind\n` per unit. `lua/initialize.lua` writes it and
/// `lua/transition/ranges.lua` and `lua/pending.lua` read it under this same
/// value.
pub const CHUNK_UNITS: usize = 128;

/// The field of a run's state hash that says absent states are fresh ones
/// (format 4): only changed states are stored, and a hash without this
/// field was lost. `lua/initialize.lua` writes it and
/// `lua/transition/helpers.lua` reads it under this same name.
pub const SPARSE_STATES: &str = "\u{1}sparse";

/// The keys of one run, in the order the scripts take them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunKeys {
    /// The main stream.
    pub units: String,
    /// The priority stream.
    pub priority: String,
    /// The event log.
    pub attempts: String,
    /// The run's meta hash.
    pub meta: String,
    /// Per-unit state hash.
    pub unit_state: String,
    /// Worker records hash.
    pub workers: String,
    /// Entries waiting for a place in their full group (a sorted set).
    pub parked: String,
    /// The unit list, packed [`CHUNK_UNITS`] units a field (format 5).
    pub chunks: String,
    /// Indexes of the units delivered one at a time, not in a range (a
    /// sorted set): units in a group, and units whose kind holds a tab or
    /// a newline.
    pub special: String,
    /// The live ranges: first index to last index, delivery count, live
    /// units, which are done, owner.
    pub ranges: String,
    /// The live ranges' first indexes, scored by them (a sorted set: the
    /// range holding an index).
    pub starts: String,
    /// The live ranges' reclaim clocks (a sorted set: first index scored by
    /// its last delivery or beat).
    pub clocks: String,
}

impl RunKeys {
    /// The keys of `run` under `prefix`.
    pub fn new(prefix: &str, run: &RunId) -> Self {
        let base = format!("{prefix}:hopper:{{{run}}}");
        Self {
            units: format!("{base}:units"),
            priority: format!("{base}:units:priority"),
            attempts: format!("{base}:attempts"),
            meta: format!("{base}:meta"),
            unit_state: format!("{base}:unit_state"),
            workers: format!("{base}:workers"),
            parked: format!("{base}:parked"),
            chunks: format!("{base}:chunks"),
            special: format!("{base}:special"),
            ranges: format!("{base}:ranges"),
            starts: format!("{base}:starts"),
            clocks: format!("{base}:clocks"),
        }
    }

    /// All of them, in script order.
    pub fn all(&self) -> [&str; 12] {
        [
            &self.units,
            &self.priority,
            &self.attempts,
            &self.meta,
            &self.unit_state,
            &self.workers,
            &self.parked,
            &self.chunks,
            &self.special,
            &self.ranges,
            &self.starts,
            &self.clocks,
        ]
    }
}

/// The keys of the bucket leases (see `lua/bucket_tick.lua`): all in the
/// lease space's slot. They are small (a few entries per bucket, 4,096
/// buckets by default) and a tick must read the loads and the free pool
/// atomically with its claims, so they stay together; what spreads over a
/// cluster is the per-account data of each bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketKeys {
    /// A hash: `count` (bound once) and `total` (the sum of the weights).
    pub meta: String,
    /// A hash: bucket -> weight.
    pub weights: String,
    /// A hash: bucket -> its change count.
    pub versions: String,
    /// A hash: bucket -> its last token (never expires).
    pub fences: String,
    /// A hash: bucket -> `"owner token"`.
    pub owners: String,
    /// A sorted set: bucket -> when its lease runs out (0: free).
    pub expiry: String,
    /// A sorted set: worker -> when its registration runs out.
    pub workers: String,
    /// A sorted set: worker -> its load at its last tick.
    pub loads: String,
}

/// The keys of the lease space under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseKeys {
    tag: String,
    channel: String,
    bucket_channel: String,
}

impl LeaseKeys {
    /// The lease space of `prefix`.
    pub fn new(prefix: &str) -> Self {
        Self {
            tag: format!("{{{prefix}}}"),
            channel: format!("{prefix}:user.active"),
            bucket_channel: format!("{prefix}:sync:bucket.changed"),
        }
    }

    /// `sync:lease:{id}`.
    pub fn lease(&self, key: &LeaseKey) -> String {
        format!("{}:sync:lease:{key}", self.tag)
    }

    /// The fence counter of `key` (no TTL: tokens survive release and expiry).
    pub fn fence(&self, key: &LeaseKey) -> String {
        format!("{}:sync:fence:{key}", self.tag)
    }

    /// `sync:tier:{id}`.
    pub fn tier(&self, key: &LeaseKey) -> String {
        format!("{}:sync:tier:{key}", self.tag)
    }

    /// `sync:live`.
    pub fn live(&self) -> String {
        format!("{}:sync:live", self.tag)
    }

    /// `sync:deployment`: the deployment this key space belongs to (no TTL).
    pub fn deployment(&self) -> String {
        format!("{}:sync:deployment", self.tag)
    }

    /// `sync:workers:{id}`.
    pub fn worker(&self, worker: &WorkerId) -> String {
        format!("{}:sync:workers:{worker}", self.tag)
    }

    /// The registration index (a sorted set of worker ids by expiry).
    pub fn worker_index(&self) -> String {
        format!("{}:sync:workers", self.tag)
    }

    /// The eight keys of the bucket leases.
    pub fn buckets(&self) -> BucketKeys {
        let base = format!("{}:sync:buckets", self.tag);
        BucketKeys {
            meta: format!("{base}:meta"),
            weights: format!("{base}:weights"),
            versions: format!("{base}:versions"),
            fences: format!("{base}:fences"),
            owners: format!("{base}:owners"),
            expiry: format!("{base}:expiry"),
            workers: format!("{base}:workers"),
            loads: format!("{base}:loads"),
        }
    }

    /// `sess:active:{user}`.
    pub fn session(&self, user: &UserId) -> String {
        format!("{}:sess:active:{user}", self.tag)
    }

    /// The pub/sub channel of `user.active` events.
    pub fn user_active_channel(&self) -> &str {
        &self.channel
    }

    /// The pub/sub channel of bucket change notices (`add_weight`'s buckets).
    pub fn bucket_change_channel(&self) -> &str {
        &self.bucket_channel
    }
}

#[cfg(test)]
mod tests {
    use redis::cluster_routing::Slot;

    use super::*;

    /// CRC16/XMODEM slot of a key, computed here (independently of redis's
    /// routing helper, which the test compares against).
    fn slot(key: &str) -> u16 {
        let bytes = key.as_bytes();
        let hashed = match bytes.iter().position(|b| *b == b'{') {
            Some(open) => match bytes[open + 1..].iter().position(|b| *b == b'}') {
                Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
                _ => bytes,
            },
            None => bytes,
        };
        let mut crc: u16 = 0;
        for &b in hashed {
            crc ^= (b as u16) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
            }
        }
        crc % 16384
    }

    #[test]
    fn crc16_matches_the_cluster_spec() {
        // The example of the Redis Cluster specification.
        assert_eq!(slot("123456789"), 0x31C3);
        assert_eq!(Slot::for_key("123456789"), Slot::new(0x31C3).unwrap());
    }

    #[test]
    fn all_keys_of_a_run_share_one_slot() {
        for run in ["r1", "build-42", "a:b:c", "x"] {
            let keys = RunKeys::new("leasehold", &RunId::new(run).unwrap());
            let slots: Vec<u16> = keys.all().iter().map(|k| slot(k)).collect();
            assert!(slots.iter().all(|s| *s == slots[0]), "{run}: {slots:?}");
            let routed: Vec<Slot> = keys.all().iter().map(Slot::for_key).collect();
            assert!(routed.iter().all(|s| *s == routed[0]), "{run}");
            assert_eq!(slots[0], slot(&format!("{{{run}}}")));
        }
        // Different runs spread over the slots.
        let a = slot(&RunKeys::new("p", &RunId::new("run-a").unwrap()).units);
        let b = slot(&RunKeys::new("p", &RunId::new("run-b").unwrap()).units);
        assert_ne!(a, b);
    }

    #[test]
    fn all_keys_of_a_lease_space_share_one_slot() {
        let k = LeaseKeys::new("app");
        let key = LeaseKey::new("acct-1").unwrap();
        let other = LeaseKey::new("acct-2").unwrap();
        let keys = [
            k.lease(&key),
            k.fence(&key),
            k.tier(&key),
            k.lease(&other),
            k.live(),
            k.worker(&WorkerId::new("w1").unwrap()),
            k.worker_index(),
            k.session(&UserId::new("u1").unwrap()),
            k.buckets().meta,
            k.buckets().expiry,
            k.buckets().loads,
        ];
        let first = slot(&keys[0]);
        for key in &keys {
            assert_eq!(slot(key), first, "{key}");
            assert_eq!(Slot::for_key(key), Slot::for_key(&keys[0]), "{key}");
        }
        assert_eq!(k.lease(&key), "{app}:sync:lease:acct-1");
    }
}
