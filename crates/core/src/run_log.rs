//! The read side of the unit queue.
//!
//! See [`RunLog`] for the contract.

use std::time::Duration;

use async_trait::async_trait;

use crate::errors::QueueError;
use crate::events::{EventId, EventRecord};
use crate::ids::{RunId, UnitId};
use crate::queue::{Budgets, PendingDelivery, Progress, UnitSpec, UnitState, WorkerRecord};

/// What a run looks like from outside: its counters, budgets, units, event
/// log, worker records and pending deliveries. The read-only half of
/// [`UnitQueue`](crate::UnitQueue), which every queue also is: code that
/// only looks at a run (a report, a status line, a timeline) takes a
/// `RunLog` and cannot move a unit.
///
/// # Contract
///
/// * **Reads change nothing observable.** No method here appends an event, touches a
///   worker record, renews the run's inactivity TTL or counts as a sign of
///   life of any worker. Reading a run as often as one likes cannot keep it
///   alive, nor change what a transition of
///   [`UnitQueue`](crate::UnitQueue) replies.
/// * **A run that does not exist is not an error.** It reads as empty:
///   `None` counters and budgets, no units, no events, no workers, nothing
///   pending. A run past its inactivity TTL does not exist. An error
///   ([`QueueError`]) means the store could not be read at all (a
///   transport failure, or stored state the contract does not allow).
/// * **Reads are not a snapshot.** The run may move between two reads (a
///   worker finalizing while a report reads them): a caller that needs
///   several reads to agree follows the event log, or reads again.
/// * **The event log is append-only and ordered.** Event ids strictly
///   increase; [`RunLog::events`] pages through the log by position (the
///   id of the last event read), so a reader that follows it sees every
///   event once, in order, whatever is appended meanwhile.
/// * Every backend answers the same reads for the same history (the
///   memory backend is the reference); the conformance suite holds them to
///   it.
///
/// # Example
///
/// A status line only reads, so it takes a `RunLog`; a worker's queue is
/// handed to it as it is (`&dyn UnitQueue` upcasts to `&dyn RunLog`, and
/// `Arc<dyn UnitQueue>` to `Arc<dyn RunLog>`).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use leasehold_core::{Budgets, QueueError, RunId, RunLog, RunSpec, UnitId, UnitQueue, UnitSpec};
///
/// async fn status_line(log: &dyn RunLog, run: &RunId) -> Result<String, QueueError> {
///     Ok(match log.progress(run).await? {
///         Some(p) => format!("{run}: {}/{} finalized, {} in flight", p.finalized, p.total, p.in_flight),
///         None => format!("{run}: no such run"),
///     })
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let queue: Arc<dyn UnitQueue> = Arc::new(leasehold_mem::MemoryStore::new());
/// let run = RunId::new("build-7")?;
/// // A run that does not exist reads as empty, not as an error.
/// assert_eq!(status_line(&*queue, &run).await?, "build-7: no such run");
///
/// let units = vec![UnitSpec::new(UnitId::new("a")?, "test")];
/// let spec = RunSpec { run: run.clone(), units, budgets: Budgets::default(), ttl: Duration::from_secs(60) };
/// queue.initialize(&spec).await?;
/// let log: Arc<dyn RunLog> = queue.clone();
/// assert_eq!(status_line(&*log, &run).await?, "build-7: 0/1 finalized, 0 in flight");
/// // Reading changes nothing: no worker record, no event.
/// assert!(log.workers(&run).await?.is_empty());
/// assert!(log.events(&run, None, 10).await?.is_empty());
/// # Ok(())
/// # }
/// ```
#[async_trait]
pub trait RunLog: Send + Sync + 'static {
    /// The run's counters; `None` when the run does not exist.
    async fn progress(&self, run: &RunId) -> Result<Option<Progress>, QueueError>;

    /// The run's frozen budgets; `None` when the run does not exist.
    async fn budgets(&self, run: &RunId) -> Result<Option<Budgets>, QueueError>;

    /// The run's units in their initial order (empty when the run does not exist).
    async fn units(&self, run: &RunId) -> Result<Vec<UnitSpec>, QueueError>;

    /// A unit's retry state; `None` when the run or unit does not exist.
    async fn unit_state(&self, run: &RunId, unit: &UnitId) -> Result<Option<UnitState>, QueueError>;

    /// Up to `limit` events after `after` (from the start when `None`), in order.
    async fn events(&self, run: &RunId, after: Option<EventId>, limit: usize) -> Result<Vec<EventRecord>, QueueError>;

    /// Waits until the run's event log holds an event after `after`, or
    /// until `timeout` has passed, and returns the id of the newest event
    /// it saw (`after` when none came in time). With `after` = `None` it
    /// waits for an event appended after the call began.
    ///
    /// Every transition that changes a run appends an event (a delivery, a
    /// finalize, a requeue, a release), so this is how a waiting worker
    /// hears that there may be work, or that the run completed, without
    /// polling. It is a wake-up, not a read: callers read what they need
    /// afterwards, and bound every wait, since a change that appends no
    /// event (a unit held back for another worker becoming free to all)
    /// wakes nobody. It returns at once when `after` is older than the
    /// newest event, and does not fail for a run that does not exist (it
    /// waits for the run's first event).
    async fn wait_for_events(
        &self,
        run: &RunId,
        after: Option<EventId>,
        timeout: Duration,
    ) -> Result<Option<EventId>, QueueError>;

    /// The run's worker records, sorted by worker id.
    async fn workers(&self, run: &RunId) -> Result<Vec<WorkerRecord>, QueueError>;

    /// Deliveries pending on workers, in entry order (priority stream first).
    async fn pending(&self, run: &RunId) -> Result<Vec<PendingDelivery>, QueueError>;
}
