//! Sharded collection and file affinity for the agents of one worker.
//!
//! With `-j N` pytest agents, each agent collects only a share of the test
//! files (`HOPPER_SHARD=k/N`, dealt by the plugin), so the suite is imported
//! and collected once, split across the agents, instead of once per agent.
//! The shards' node ids together are the discovery (checked against the sum
//! of pytest's own counts, and that every agent saw the same files).
//!
//! The queue is not changed: all slots of a worker share one worker id, so a
//! batch one slot reserved may be run by a sibling. Reserved units go into a
//! worker-local [`Pool`] from which each slot takes the units of the files
//! its agent collected. A unit of a file no slot of its shard takes in time
//! ([`STEAL_AFTER`]) is taken by any slot, whose agent then collects that
//! file on request: affinity is a preference, never a condition for a test
//! to run.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use leasehold_core::Delivery;
use parking_lot::Mutex;
use tokio::time::Instant;

/// A pooled unit of another shard waiting this long is taken by any slot.
pub const STEAL_AFTER: Duration = Duration::from_secs(1);

/// A slot that found none of its shard's units this long, while the pool was
/// too full of its siblings' units to reserve more, takes another shard's
/// file at once: the siblings cannot keep up with their share, and the slot
/// would otherwise run at their pace (their units never wait
/// [`STEAL_AFTER`] in a pool they drain). The time adds up over spells of
/// starving less than [`STARVATION_FORGOTTEN`] apart (see [`Starvation`]).
pub const STARVED_FOR: Duration = Duration::from_millis(200);

/// A slot that went this long without starving starts counting afresh.
pub const STARVATION_FORGOTTEN: Duration = Duration::from_secs(1);

/// How long a slot has starved beside a full pool, over spells close
/// together.
///
/// A slot whose tests run faster than its siblings' does not starve in one
/// long spell: each reservation the siblings' progress lets in holds a few of
/// its units, so it runs a few, waits a few milliseconds, and runs a few
/// more, at its siblings' pace (on a suite whose shards differ in test cost,
/// such a slot sat idle for a third of the run without ever starving
/// [`STARVED_FOR`] at once). So the spells add up, and only a slot that went
/// [`STARVATION_FORGOTTEN`] without starving starts again from zero.
#[derive(Debug, Default)]
pub struct Starvation {
    /// When the present spell began.
    spell: Option<Instant>,
    /// The earlier spells' total.
    earlier: Duration,
    /// When the last spell ended.
    last_end: Option<Instant>,
}

impl Starvation {
    /// The slot found none of its units beside a full pool at `now`: whether
    /// it has starved [`STARVED_FOR`] in all.
    pub fn starving(&mut self, now: Instant) -> bool {
        let start = match self.spell {
            Some(start) => start,
            None => {
                if self.last_end.is_some_and(|end| now.duration_since(end) >= STARVATION_FORGOTTEN) {
                    self.earlier = Duration::ZERO;
                }
                *self.spell.insert(now)
            }
        };
        self.earlier + now.duration_since(start) >= STARVED_FOR
    }

    /// The slot got units of its own at `now`: a spell ends.
    pub fn fed(&mut self, now: Instant) {
        if let Some(start) = self.spell.take() {
            self.earlier += now.duration_since(start);
            self.last_end = Some(now);
        }
    }

    /// The slot took another shard's file: it starts counting afresh.
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

/// The environment variable that names an agent's shard (`k/N`).
pub const SHARD_ENV: &str = "HOPPER_SHARD";

/// How the tests of one worker are split between its agents.
#[derive(Debug)]
pub struct Sharding {
    count: usize,
    expected: Vec<u64>,
    shard_of: HashMap<String, usize>,
    /// Reserved units not yet taken by a slot.
    pub(crate) pool: Mutex<Pool>,
}

impl Sharding {
    /// `shards[k]`: the test ids shard `k`'s agent collected.
    pub fn new(shards: &[Vec<String>]) -> Self {
        let mut shard_of = HashMap::with_capacity(shards.iter().map(Vec::len).sum());
        for (k, ids) in shards.iter().enumerate() {
            for id in ids {
                shard_of.insert(id.clone(), k);
            }
        }
        Self {
            count: shards.len(),
            expected: shards.iter().map(|ids| ids.len() as u64).collect(),
            shard_of,
            pool: Mutex::new(Pool::default()),
        }
    }

    /// How many shards (agents) there are.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The shard slot `slot`'s agents collect.
    pub fn shard_of_slot(&self, slot: usize) -> usize {
        slot % self.count.max(1)
    }

    /// The environment entry that gives an agent of `slot` its shard.
    pub fn env(&self, slot: usize) -> (String, String) {
        (SHARD_ENV.to_owned(), format!("{}/{}", self.shard_of_slot(slot), self.count))
    }

    /// How many tests an agent of `slot` must say it collected.
    pub fn expected(&self, slot: usize) -> u64 {
        self.expected.get(self.shard_of_slot(slot)).copied().unwrap_or(0)
    }

    /// The shard whose agent collected `unit` (`None`: no shard did, for
    /// example a unit another worker discovered).
    pub fn shard_of_unit(&self, unit: &str) -> Option<usize> {
        self.shard_of.get(unit).copied()
    }
}

/// The file (the node id's first part) a test id belongs to.
pub fn file_of(unit: &str) -> &str {
    unit.split_once("::").map_or(unit, |(file, _)| file)
}

/// What an agent has collected: its shard's files, and files it collected
/// on request since it started.
#[derive(Debug, Default, Clone)]
pub struct Collected {
    /// The agent's shard.
    pub shard: usize,
    /// Files of other shards it collected on request.
    pub extra_files: HashSet<String>,
}

impl Collected {
    fn has(&self, sharding: &Sharding, unit: &str) -> bool {
        sharding.shard_of_unit(unit) == Some(self.shard) || self.extra_files.contains(file_of(unit))
    }
}

#[derive(Debug)]
struct Pooled {
    delivery: Delivery,
    since: Instant,
    /// Order of reservation across the whole pool.
    seq: u64,
}

/// Units the worker reserved that no slot took yet, one queue per file, so
/// that a slot finds its files' units without walking its siblings' (the
/// pool may hold thousands of them).
#[derive(Debug, Default)]
pub struct Pool {
    files: HashMap<String, VecDeque<Pooled>>,
    len: usize,
    next_seq: u64,
}

impl Pool {
    /// How many units wait.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds freshly reserved units.
    pub fn put(&mut self, deliveries: impl IntoIterator<Item = Delivery>, now: Instant) {
        for delivery in deliveries {
            let seq = self.next_seq;
            self.next_seq += 1;
            self.len += 1;
            let file = file_of(delivery.unit.as_str()).to_owned();
            self.files.entry(file).or_default().push_back(Pooled { delivery, since: now, seq });
        }
    }

    /// Up to `max` units of files `collected` has, in reservation order.
    pub fn take_collected(&mut self, sharding: &Sharding, collected: &Collected, max: usize) -> Vec<Delivery> {
        let mine: Vec<String> = self
            .files
            .iter()
            .filter(|(_, queue)| queue.front().is_some_and(|p| collected.has(sharding, p.delivery.unit.as_str())))
            .map(|(file, _)| file.clone())
            .collect();
        let mut taken = Vec::new();
        while taken.len() < max {
            let oldest = mine
                .iter()
                .filter_map(|file| self.files.get(file).and_then(|q| q.front()).map(|p| (p.seq, file)))
                .min_by_key(|(seq, _)| *seq);
            let Some((_, file)) = oldest else { break };
            let file = file.clone();
            match self.pop(&file) {
                Some(delivery) => taken.push(delivery),
                None => break,
            }
        }
        taken
    }

    /// Up to `max` units of one file that waited since before `before` (the
    /// file of the oldest such unit), whatever their shard; with the file.
    pub fn steal(&mut self, before: Instant, max: usize) -> Option<(String, Vec<Delivery>)> {
        let file = self
            .files
            .iter()
            .filter_map(|(file, q)| q.front().filter(|p| p.since <= before).map(|p| (p.seq, file)))
            .min_by_key(|(seq, _)| *seq)
            .map(|(_, file)| file.clone())?;
        let taken = std::iter::from_fn(|| self.pop(&file)).take(max).collect();
        Some((file, taken))
    }

    /// Drops the units `lost` says the worker lost (another worker owns
    /// them now), and returns them.
    pub fn forget_lost(&mut self, mut lost: impl FnMut(&Delivery) -> bool) -> Vec<Delivery> {
        let mut dropped = Vec::new();
        for queue in self.files.values_mut() {
            queue.retain(|p| {
                let keep = !lost(&p.delivery);
                if !keep {
                    dropped.push(p.delivery.clone());
                }
                keep
            });
        }
        self.files.retain(|_, q| !q.is_empty());
        self.len -= dropped.len();
        dropped
    }

    /// Empties the pool (on shutdown, to hand the units back), in
    /// reservation order.
    pub fn drain(&mut self) -> Vec<Delivery> {
        let mut all: Vec<Pooled> = self.files.drain().flat_map(|(_, q)| q).collect();
        all.sort_by_key(|p| p.seq);
        self.len = 0;
        all.into_iter().map(|p| p.delivery).collect()
    }

    fn pop(&mut self, file: &str) -> Option<Delivery> {
        let queue = self.files.get_mut(file)?;
        let pooled = queue.pop_front()?;
        if queue.is_empty() {
            self.files.remove(file);
        }
        self.len -= 1;
        Some(pooled.delivery)
    }
}

/// The shards' ids merged so that every stretch of the queue holds units of
/// every shard in proportion to its size (shard `k`'s `i`-th id sits at
/// `(i + ½) / len_k` of the way): any batch a slot reserves then holds work
/// for each of its siblings, and the shards run out together.
pub fn interleave(shards: Vec<Vec<String>>) -> Vec<String> {
    let mut keyed: Vec<(u64, u64, usize, String)> = Vec::with_capacity(shards.iter().map(Vec::len).sum());
    for (k, ids) in shards.into_iter().enumerate() {
        let len = ids.len() as u64;
        for (i, id) in ids.into_iter().enumerate() {
            keyed.push((2 * i as u64 + 1, 2 * len, k, id));
        }
    }
    // (a / b) < (c / d)  ⇔  a·d < c·b; ties go to the lower shard.
    keyed.sort_by(|x, y| {
        (u128::from(x.0) * u128::from(y.1)).cmp(&(u128::from(y.0) * u128::from(x.1))).then(x.2.cmp(&y.2))
    });
    keyed.into_iter().map(|k| k.3).collect()
}

#[cfg(test)]
mod tests {
    use leasehold_core::{DeliveryOrigin, EntryId, StreamName, UnitId};

    use super::*;

    fn ids(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn delivery(unit: &str, n: u64) -> Delivery {
        Delivery {
            unit: UnitId::new(unit).unwrap(),
            kind: "test".into(),
            stream: StreamName::Main,
            entry_id: EntryId::new(n, 0),
            delivery_count: 1,
            retry_index: 0,
            reclaim_count: 0,
            origin: DeliveryOrigin::Fresh,
        }
    }

    #[test]
    fn short_spells_of_starving_add_up_unless_far_apart() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let mut starvation = Starvation::default();
        // 40 ms starving, 20 ms running, again and again: the fifth spell
        // brings it to 200 ms.
        for spell in 0..4 {
            let start = t + ms(60 * spell);
            assert!(!starvation.starving(start));
            assert!(!starvation.starving(start + ms(39)));
            starvation.fed(start + ms(40));
        }
        assert!(!starvation.starving(t + ms(240)));
        assert!(starvation.starving(t + ms(280)), "4 × 40 ms, and 40 ms now");
        starvation.reset();
        assert!(!starvation.starving(t + ms(300)));
        starvation.fed(t + ms(450));
        // A second without starving: the 150 ms are forgotten.
        assert!(!starvation.starving(t + ms(1450)));
        assert!(!starvation.starving(t + ms(1600)));
        assert!(starvation.starving(t + ms(1650)));
    }

    #[test]
    fn shards_interleave_in_proportion() {
        let merged = interleave(vec![ids(&["a1", "a2", "a3", "a4"]), ids(&["b1", "b2"])]);
        assert_eq!(merged, ids(&["a1", "b1", "a2", "a3", "b2", "a4"]));
        assert_eq!(interleave(vec![ids(&["x"]), vec![]]), ids(&["x"]));
    }

    #[test]
    fn file_is_the_node_ids_first_part() {
        assert_eq!(file_of("tests/a b.py::T::test[x::y]"), "tests/a b.py");
        assert_eq!(file_of("plain"), "plain");
    }

    #[test]
    fn slots_take_their_files_and_steal_only_what_waited() {
        let sharding = Sharding::new(&[ids(&["a.py::t1", "a.py::t2"]), ids(&["b.py::t1", "c.py::t1", "c.py::t2"])]);
        assert_eq!(sharding.env(3), ("HOPPER_SHARD".to_owned(), "1/2".to_owned()));
        assert_eq!(sharding.expected(1), 3);
        let start = Instant::now();
        let mut pool = Pool::default();
        pool.put(
            ["a.py::t1", "b.py::t1", "a.py::t2", "c.py::t1", "c.py::t2"]
                .iter()
                .enumerate()
                .map(|(i, u)| delivery(u, i as u64 + 1)),
            start,
        );
        let mut zero = Collected { shard: 0, extra_files: HashSet::new() };
        let mine: Vec<_> = pool.take_collected(&sharding, &zero, 10).into_iter().map(|d| d.unit.to_string()).collect();
        assert_eq!(mine, ["a.py::t1", "a.py::t2"]);
        assert!(pool.take_collected(&sharding, &zero, 10).is_empty());
        // Nothing waited long enough yet.
        assert!(pool.steal(start - Duration::from_millis(1), 10).is_none());
        let (file, stolen) = pool.steal(start, 1).unwrap();
        assert_eq!((file.as_str(), stolen.len()), ("b.py", 1));
        zero.extra_files.insert(file);
        assert_eq!(pool.len(), 2);
        let one = Collected { shard: 1, extra_files: HashSet::new() };
        assert_eq!(pool.take_collected(&sharding, &one, 1).len(), 1);
        assert_eq!(pool.drain().len(), 1);
        assert!(pool.is_empty());
    }

    #[test]
    fn a_slot_takes_its_files_in_reservation_order_and_lost_units_leave_the_count() {
        let sharding = Sharding::new(&[ids(&["a.py::1", "c.py::1", "a.py::2"]), ids(&["b.py::1", "b.py::2"])]);
        let start = Instant::now();
        let mut pool = Pool::default();
        let order = ["b.py::1", "c.py::1", "a.py::1", "b.py::2", "a.py::2"];
        pool.put(order.iter().enumerate().map(|(i, u)| delivery(u, i as u64 + 1)), start);
        assert_eq!(pool.len(), 5);
        let lost = pool.forget_lost(|d| d.unit.as_str() == "b.py::2");
        assert_eq!((lost.len(), pool.len()), (1, 4));
        let zero = Collected { shard: 0, extra_files: HashSet::new() };
        let mine: Vec<String> =
            pool.take_collected(&sharding, &zero, 2).into_iter().map(|d| d.unit.to_string()).collect();
        assert_eq!(mine, ["c.py::1", "a.py::1"], "across files, in the order reserved");
        assert_eq!(pool.drain().into_iter().map(|d| d.unit.to_string()).collect::<Vec<_>>(), ["b.py::1", "a.py::2"]);
        assert!(pool.is_empty());
        assert_eq!(pool.len(), 0);
    }
}
