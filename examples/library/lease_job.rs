//! A job that runs only while it holds a lease, and stops when fenced.
//!
//! ```text
//! cargo run -p leasehold-examples --example lease_job -- [mem:// | redis://host:port]
//! ```
//!
//! Two workers want to run the same job (a nightly report, say). `worker-a`
//! claims the lease and works, renewing it as it goes, until it stalls (a GC
//! pause, a frozen VM) for longer than the lease's TTL. `worker-b`, which
//! kept trying to claim, then wins the key under a greater fencing token and
//! does the job. When `worker-a` wakes, the write it was about to make
//! carries its old token, and the downstream store, which keeps the highest
//! token it has seen, refuses it: `worker-a` stops. Its lease, checked
//! against owner and token, renews and releases nothing any more.
//!
//! The program exits non-zero when any of these promises breaks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use downstream::FencedSink;
use leasehold_core::{Lease, LeaseKey, LeaseStore, Ttl, WorkerId};

/// How long a lease lasts without a renew.
const TTL: Ttl = Ttl::from_millis(1_000);
/// A third of the TTL: two renews may be late before the lease is lost.
const RENEW_EVERY: Duration = Duration::from_millis(300);
/// One step of the job.
const STEP: Duration = Duration::from_millis(100);
/// Steps of the whole job.
const STEPS: u32 = 8;
/// worker-a's stall: twice the TTL, so its lease surely expires.
const STALL: Duration = Duration::from_millis(2_000);

#[tokio::main]
async fn main() -> Result<()> {
    let url = leasehold_examples::url_from_args();
    let store = leasehold_examples::connect(&url).await?.leases;
    println!("lease_job on {url}");

    let key = LeaseKey::new("nightly-report")?;
    let sink = Arc::new(FencedSink::default());
    let (a_holds, a_has_claimed) = tokio::sync::oneshot::channel();
    let a = WorkerId::new("worker-a")?;
    let a = tokio::spawn(run_job(store.clone(), key.clone(), a, sink.clone(), Some(3), Some(a_holds)));
    // b starts once a holds the lease, so the story is the same on every run.
    a_has_claimed.await.context("worker-a ended before it claimed")?;
    let b = WorkerId::new("worker-b")?;
    let b = tokio::spawn(run_job(store.clone(), key.clone(), b, sink.clone(), None, None));
    let a = a.await.context("worker-a panicked")??;
    let b = b.await.context("worker-b panicked")??;

    // The promises, checked on what happened.
    let Ended::Fenced(a_lease) = &a else { bail!("worker-a was never fenced: {a:?}") };
    let Ended::Finished { lease: b_lease, released } = &b else { bail!("worker-b did not finish the job: {b:?}") };
    ensure!(b_lease.token > a_lease.token, "the takeover's token {} is not above {}", b_lease.token, a_lease.token);
    ensure!(*released, "worker-b's release of its own lease answered false");
    let writes = sink.accepted();
    let first_b = writes.iter().position(|w| w.owner == b_lease.owner).context("worker-b wrote nothing")?;
    ensure!(
        writes[first_b..].iter().all(|w| w.owner == b_lease.owner),
        "worker-a wrote after worker-b took over: {writes:?}"
    );
    ensure!(!store.renew(a_lease, TTL).await?, "worker-a's old lease still renews");
    ensure!(!store.release(a_lease).await?, "worker-a's old lease still releases");
    ensure!(store.holder(&key).await?.is_none(), "the key is still held after the job");
    println!("ok: the writes the store accepted:");
    for write in &writes {
        println!("  {} step {} under token {}", write.owner, write.step, write.token);
    }
    Ok(())
}

/// How a worker's job ended.
#[derive(Debug)]
enum Ended {
    /// The lease was lost, or a newer holder's token was seen: the worker stopped.
    Fenced(Lease),
    /// Every step was done; `released` is what the release answered.
    Finished { lease: Lease, released: bool },
}

/// Waits for the lease on `key`, then works step by step while holding it.
/// `stall_after` makes the worker stall for [`STALL`] before that step's
/// write: the worst moment, after its last check that it holds the lease.
/// `claimed` is told when the lease is won.
async fn run_job(
    store: Arc<dyn LeaseStore>,
    key: LeaseKey,
    me: WorkerId,
    sink: Arc<FencedSink>,
    stall_after: Option<u32>,
    claimed: Option<tokio::sync::oneshot::Sender<()>>,
) -> Result<Ended> {
    // A claim of a held key answers None: try again until the holder lets go
    // (or its lease runs out).
    let lease = loop {
        if let Some(lease) = store.claim(&key, &me, TTL).await? {
            break lease;
        }
        tokio::time::sleep(STEP).await;
    };
    println!("{me}: holds {key} under token {}", lease.token);
    if let Some(claimed) = claimed {
        // Nobody waiting is no reason to stop working.
        let _ = claimed.send(());
    }
    let mut renewed = Instant::now();
    for step in 1..=STEPS {
        if renewed.elapsed() >= RENEW_EVERY {
            // false: taken over, expired or dropped. Stop at once.
            if !store.renew(&lease, TTL).await? {
                println!("{me}: its renew was refused: the lease is lost, stopping");
                return Ok(Ended::Fenced(lease));
            }
            renewed = Instant::now();
        }
        if stall_after == Some(step) {
            println!("{me}: stalls for {STALL:?} (longer than its lease)");
            tokio::time::sleep(STALL).await;
        }
        // The downstream store is the last line: a renew checked a moment
        // ago says nothing about now, the token does.
        if !sink.write(&me, lease.token, step) {
            println!("{me}: the store refused its write under token {}: a newer holder wrote, stopping", lease.token);
            return Ok(Ended::Fenced(lease));
        }
        tokio::time::sleep(STEP).await;
    }
    let released = store.release(&lease).await?;
    println!("{me}: done, released {key}");
    Ok(Ended::Finished { lease, released })
}

/// A stand-in for the storage the job writes to: it keeps the highest
/// fencing token it has seen and refuses writes under a lower one (what a
/// database does with `WHERE token >= last_token`).
mod downstream {
    use std::sync::Mutex;

    use leasehold_core::{FencingToken, WorkerId};

    /// One accepted write.
    #[derive(Debug, Clone)]
    pub struct Write {
        /// Who wrote.
        pub owner: WorkerId,
        /// Under which token.
        pub token: FencingToken,
        /// Which step of the job.
        pub step: u32,
    }

    /// The highest token seen, and the writes accepted.
    #[derive(Debug, Default)]
    pub struct FencedSink {
        state: Mutex<(Option<FencingToken>, Vec<Write>)>,
    }

    impl FencedSink {
        /// Accepts the write unless a greater token has been seen.
        pub fn write(&self, owner: &WorkerId, token: FencingToken, step: u32) -> bool {
            let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let (highest, writes) = &mut *state;
            if highest.is_some_and(|h| token < h) {
                return false;
            }
            *highest = Some(token);
            writes.push(Write { owner: owner.clone(), token, step });
            true
        }

        /// The accepted writes, in order.
        pub fn accepted(&self) -> Vec<Write> {
            self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).1.clone()
        }
    }
}
