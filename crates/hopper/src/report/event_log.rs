//! The one reader of a build's event log: every page of it, in order. The
//! report and the timeline are both folds over what it reads.

use std::sync::Arc;

use leasehold_core::{Event, RunId, UnitQueue};

use crate::errors::HopperError;

/// Events read per page.
const EVENT_PAGE: usize = 1000;

/// Every event of `run`'s log, oldest first (empty when the run has none).
pub async fn read_events(queue: &Arc<dyn UnitQueue>, run: &RunId) -> Result<Vec<Event>, HopperError> {
    let mut events = Vec::new();
    let mut after = None;
    loop {
        let page = queue.events(run, after, EVENT_PAGE).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        // A short page is the last one: no need to ask for an empty one.
        let full = page.len() == EVENT_PAGE;
        events.extend(page.into_iter().map(|r| r.event));
        if !full {
            break;
        }
    }
    Ok(events)
}
