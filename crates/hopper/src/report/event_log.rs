//! The one reader of a build's event log: every page of it, in order, read
//! once. The report and the timeline are both folds over what it reads; the
//! report's wait follows the log by position ([`LogFollower`]) instead of
//! reading it again from the start.

use std::time::Duration;

use leasehold_core::{Event, EventId, RunId, RunLog};

use crate::errors::HopperError;

/// Events read per page.
const EVENT_PAGE: usize = 5000;

/// Every event of `run`'s log, oldest first (empty when the run has none).
pub async fn read_events(queue: &dyn RunLog, run: &RunId) -> Result<Vec<Event>, HopperError> {
    LogFollower::new(queue, run.clone()).read_new().await
}

/// Follows one build's event log by position: each read returns only the
/// events after the last one it returned, and [`LogFollower::wait`] blocks
/// on the log (the queue's [`RunLog::wait_for_events`]) instead of
/// polling it.
pub struct LogFollower<'a> {
    queue: &'a dyn RunLog,
    run: RunId,
    /// The newest event read so far.
    read_up_to: Option<EventId>,
    /// The newest event the log is known to hold (read or not).
    newest_seen: Option<EventId>,
}

impl<'a> LogFollower<'a> {
    /// A follower at the start of `run`'s log.
    pub fn new(queue: &'a dyn RunLog, run: RunId) -> Self {
        LogFollower { queue, run, read_up_to: None, newest_seen: None }
    }

    /// The events appended since the last read (all of them at first), oldest first.
    pub async fn read_new(&mut self) -> Result<Vec<Event>, HopperError> {
        let mut events = Vec::new();
        loop {
            let page = self.queue.events(&self.run, self.read_up_to, EVENT_PAGE).await?;
            let Some(last) = page.last() else { break };
            self.read_up_to = Some(last.id);
            // A short page is the last one: no need to ask for an empty one.
            let full = page.len() == EVENT_PAGE;
            events.extend(page.into_iter().map(|r| r.event));
            if !full {
                break;
            }
        }
        self.newest_seen = self.newest_seen.max(self.read_up_to);
        Ok(events)
    }

    /// Waits until the log holds an event this follower has not seen, or
    /// `timeout` passes; true when there is one. A failed wait (the queue
    /// is away) sleeps out the timeout instead: the caller's next read, which
    /// rides out outages, says whether the queue is back.
    pub async fn wait(&mut self, timeout: Duration) -> bool {
        let after = self.newest_seen;
        match self.queue.wait_for_events(&self.run, after, timeout).await {
            Ok(newest) => {
                self.newest_seen = newest.max(after);
                newest > after
            }
            Err(error) => {
                tracing::debug!(run = %self.run, %error, "waiting on the event log failed; sleeping instead");
                tokio::time::sleep(timeout).await;
                false
            }
        }
    }
}
