//! Property test of the queue state machine: random operations from several
//! workers (reserve, heartbeat, finalize, requeue, abandon, time passing) keep
//! every invariant of the contract, and draining always finishes every unit
//! exactly once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    Ack, Budgets, Delivery, Event, FinalizeRequest, ManualClock, Outcome, RequeueReply, RequeueRequest, ReserveReply,
    RunId, RunLog, RunSpec, Ttl, UnitId, UnitQueue, UnitSpec, WorkerId,
};
use leasehold_mem::MemoryStore;
use proptest::prelude::*;

const WORKERS: usize = 3;
const RECLAIM_AFTER: Ttl = Ttl::from_millis(100);

#[derive(Debug, Clone)]
enum Op {
    Reserve(usize),
    Heartbeat(usize, usize),
    Finalize(usize, usize, bool),
    Requeue(usize, usize),
    Abandon(usize, usize),
    Release(usize, usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let w = 0..WORKERS;
    let i = 0..4usize;
    prop_oneof![
        4 => w.clone().prop_map(Op::Reserve),
        2 => (w.clone(), i.clone()).prop_map(|(w, i)| Op::Heartbeat(w, i)),
        3 => (w.clone(), i.clone(), any::<bool>()).prop_map(|(w, i, p)| Op::Finalize(w, i, p)),
        2 => (w.clone(), i.clone()).prop_map(|(w, i)| Op::Requeue(w, i)),
        1 => (w.clone(), i.clone()).prop_map(|(w, i)| Op::Abandon(w, i)),
        2 => (w, i).prop_map(|(w, i)| Op::Release(w, i)),
        2 => (0u64..250).prop_map(Op::Advance),
    ]
}

struct World {
    store: MemoryStore,
    clock: Arc<ManualClock>,
    run: RunId,
    workers: Vec<WorkerId>,
    /// Every delivery each worker was ever handed (current or stale).
    held: Vec<Vec<Delivery>>,
    budgets: Budgets,
    total: u64,
}

impl World {
    async fn new(units: usize, budgets: Budgets) -> Self {
        let clock = Arc::new(ManualClock::default());
        let store = MemoryStore::with_clock(clock.clone());
        let run = RunId::new("prop").unwrap();
        let spec = RunSpec {
            run: run.clone(),
            units: (0..units).map(|i| UnitSpec::new(UnitId::new(format!("u{i}")).unwrap(), "file")).collect(),
            budgets,
            ttl: Duration::from_secs(3600),
        };
        store.initialize(&spec).await.unwrap();
        let workers = (0..WORKERS).map(|w| WorkerId::new(format!("w{w}")).unwrap()).collect();
        Self { store, clock, run, workers, held: vec![Vec::new(); WORKERS], budgets, total: units as u64 }
    }

    fn pick(&self, w: usize, i: usize) -> Option<Delivery> {
        let held = &self.held[w];
        (!held.is_empty()).then(|| held[i % held.len()].clone())
    }

    /// Whether `d` is still pending on worker `w` at its delivery count.
    async fn is_current(&self, w: usize, d: &Delivery) -> bool {
        self.store.pending(&self.run).await.unwrap().iter().any(|p| {
            p.stream == d.stream
                && p.entry_id == d.entry_id
                && p.worker == self.workers[w]
                && p.delivery_count == d.delivery_count
        })
    }

    async fn apply(&mut self, op: &Op) {
        match *op {
            Op::Reserve(w) => match self.store.reserve(&self.run, &self.workers[w], RECLAIM_AFTER).await.unwrap() {
                ReserveReply::Delivered(d) => self.held[w].push(d),
                ReserveReply::ReclaimExhausted { .. } | ReserveReply::None => {}
                ReserveReply::Corrupt => panic!("corrupt on a live run"),
                ReserveReply::Stopped => panic!("stopped without a failure limit"),
            },
            Op::Heartbeat(w, i) => {
                let Some(d) = self.pick(w, i) else { return };
                let current = self.is_current(w, &d).await;
                let ack = self.store.heartbeat(&self.run, &self.workers[w], &d).await.unwrap();
                assert_eq!(ack, if current { Ack::Ok } else { Ack::Stale }, "heartbeat of {d:?}");
            }
            Op::Finalize(w, i, passed) => {
                let Some(d) = self.pick(w, i) else { return };
                let current = self.is_current(w, &d).await;
                let outcome = if passed { Outcome::Passed } else { Outcome::Failed };
                let ack = self
                    .store
                    .finalize(&self.run, &self.workers[w], &d, &FinalizeRequest::new(outcome, 5))
                    .await
                    .unwrap();
                assert_eq!(ack, if current { Ack::Ok } else { Ack::Stale }, "finalize of {d:?}");
            }
            Op::Requeue(w, i) => {
                let Some(d) = self.pick(w, i) else { return };
                let current = self.is_current(w, &d).await;
                let reply =
                    self.store.requeue(&self.run, &self.workers[w], &d, &RequeueRequest::default()).await.unwrap();
                match reply {
                    RequeueReply::Stale => assert!(!current, "requeue of a current delivery was stale"),
                    RequeueReply::Requeued { retry_index } => {
                        assert!(current);
                        assert!(retry_index <= self.budgets.max_requeues);
                    }
                    RequeueReply::Finalized { .. } => assert!(current),
                    RequeueReply::Corrupt => panic!("corrupt on a live run"),
                }
            }
            Op::Abandon(w, i) => {
                let Some(d) = self.pick(w, i) else { return };
                let current = self.is_current(w, &d).await;
                let ack = self.store.abandon(&self.run, &self.workers[w], &d, 1).await.unwrap();
                assert_eq!(ack, if current { Ack::Ok } else { Ack::Stale });
            }
            Op::Release(w, i) => {
                let Some(d) = self.pick(w, i) else { return };
                let current = self.is_current(w, &d).await;
                let before = self.store.unit_state(&self.run, &d.unit).await.unwrap();
                let ack = self.store.release(&self.run, &self.workers[w], &d).await.unwrap();
                assert_eq!(ack, if current { Ack::Ok } else { Ack::Stale }, "release of {d:?}");
                let after = self.store.unit_state(&self.run, &d.unit).await.unwrap();
                assert_eq!(before, after, "a release spent a budget");
            }
            Op::Advance(ms) => self.clock.advance(Duration::from_millis(ms)),
        }
    }

    async fn check_invariants(&self) {
        let progress = self.store.progress(&self.run).await.unwrap().unwrap();
        let events = self.store.events(&self.run, None, usize::MAX).await.unwrap();
        let mut finalized: HashMap<UnitId, u32> = HashMap::new();
        for record in &events {
            if let Event::Finalized { header, .. } = &record.event {
                *finalized.entry(header.unit_id.clone()).or_default() += 1;
            }
            if let Some(h) = record.event.header() {
                assert_eq!(h.ownership_generation, 1 + h.retry_index + h.reclaim_count);
                assert!(h.retry_index <= self.budgets.max_requeues);
                assert!(h.reclaim_count <= self.budgets.max_reclaims);
            }
        }
        assert!(finalized.values().all(|n| *n == 1), "a unit was finalized twice: {finalized:?}");
        assert_eq!(progress.finalized, finalized.len() as u64);
        assert!(progress.finalized <= progress.total);
        assert!(progress.requeued_units <= self.budgets.max_requeued_units(self.total));
        let pending = self.store.pending(&self.run).await.unwrap();
        assert_eq!(progress.in_flight, pending.len() as u64);
        for p in &pending {
            assert!(!finalized.contains_key(&p.unit), "finalized unit {} still pending", p.unit);
        }
        assert!(events.windows(2).all(|w| w[0].id < w[1].id), "event ids not increasing");
    }

    /// Lets every worker finish everything, time passing so abandoned units are reclaimed.
    async fn drain(&mut self) {
        for _ in 0..10_000 {
            let progress = self.store.progress(&self.run).await.unwrap().unwrap();
            if progress.is_complete() {
                assert_eq!(progress.in_flight, 0);
                assert_eq!(progress.queued, 0);
                return;
            }
            match self.store.reserve(&self.run, &self.workers[0], RECLAIM_AFTER).await.unwrap() {
                ReserveReply::Delivered(d) => {
                    let ack = self
                        .store
                        .finalize(&self.run, &self.workers[0], &d, &FinalizeRequest::new(Outcome::Passed, 1))
                        .await
                        .unwrap();
                    assert_eq!(ack, Ack::Ok);
                }
                ReserveReply::ReclaimExhausted { .. } => {}
                ReserveReply::None => self.clock.advance(RECLAIM_AFTER.get()),
                ReserveReply::Corrupt => panic!("corrupt on a live run"),
                ReserveReply::Stopped => panic!("stopped without a failure limit"),
            }
        }
        panic!("the run did not drain");
    }
}

fn budgets() -> impl Strategy<Value = Budgets> {
    (0u32..3, 0u32..=10, 0u32..3).prop_map(|(max_requeues, tol, max_reclaims)| Budgets {
        max_requeues,
        requeue_tolerance: tol as f64 / 10.0,
        max_reclaims,
        max_failures: None,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_operations_keep_the_invariants(units in 1usize..8, budgets in budgets(), ops in prop::collection::vec(op(), 1..80)) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let mut world = World::new(units, budgets).await;
            for op in &ops {
                world.apply(op).await;
                world.check_invariants().await;
            }
            world.drain().await;
            world.check_invariants().await;
        });
    }
}
