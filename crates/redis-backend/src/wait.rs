//! [`RunLog::wait_for_events`](leasehold_core::RunLog::wait_for_events)
//! on Redis: `XREAD BLOCK` on the run's attempts stream, on the store's
//! blocking connection.
//!
//! The newest entry is read first (`XREVRANGE + - COUNT 1`): a caller that
//! is behind returns at once with the newest event, and a blocking read
//! then starts from an explicit entry id rather than `$`, so an entry
//! appended between the two calls still wakes it.

use std::time::Duration;

use leasehold_core::{EntryId, EventId, QueueError, RunId};
use redis::Value;
use tokio::time::Instant;

use crate::conn::Conn;
use crate::queue::{attempts_entry, EVENT_INDEX_BITS};
use crate::reply;
use crate::store::{queue_err, queue_reply_err, RedisStore};

/// The longest single `XREAD BLOCK`, as a share of the response timeout:
/// a block the client gives up on would look like a dead server.
const BLOCK_SHARE_OF_RESPONSE_TIMEOUT: u32 = 2;

/// See the trait method.
pub(crate) async fn wait_for_events(
    store: &RedisStore,
    run: &RunId,
    after: Option<EventId>,
    timeout: Duration,
) -> Result<Option<EventId>, QueueError> {
    let deadline = Instant::now() + timeout;
    let key = store.run_keys(run).attempts;
    let mut conn = store.conn();
    let newest: Value = redis::cmd("XREVRANGE")
        .arg(&key)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(&mut conn)
        .await
        .map_err(|e| queue_err("wait_for_events", run, e))?;
    let newest = last_event_of(run, reply::array("wait_for_events", newest).map_err(bad(run))?)?;
    if after.is_some() && newest > after {
        return Ok(newest);
    }
    let seen = after.or(newest);
    // XREAD returns entries after this one (the events of one entry are
    // written together, so an entry seen in part is seen whole).
    let from = seen.map_or_else(|| "0-0".to_owned(), |id| format!("{}-{}", id.ms, id.seq >> EVENT_INDEX_BITS));
    let longest_block = store.config().response_timeout / BLOCK_SHARE_OF_RESPONSE_TIMEOUT;
    // One blocked read at a time per store; a caller that cannot get the
    // connection before its deadline has waited its time.
    let Ok(mut blocking) = tokio::time::timeout_at(deadline, store.inner.blocking.lock()).await else {
        return Ok(after);
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(after);
        }
        // Taken out while it blocks and put back after: a wait dropped in
        // the middle (its caller woke another way) drops the connection with
        // it, so no later read queues behind a block nobody waits for.
        let mut conn = match blocking.take() {
            Some(conn) => conn,
            None => Conn::connect(store.config()).await.map_err(|e| QueueError::backend("wait_for_events", run, e))?,
        };
        let block_ms = left.min(longest_block).as_millis().max(1);
        let read: Value = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(block_ms as u64)
            .arg("STREAMS")
            .arg(&key)
            .arg(&from)
            .query_async(&mut conn)
            .await
            .map_err(|e| queue_err("wait_for_events", run, e))?;
        *blocking = Some(conn);
        let entries = stream_entries(run, read)?;
        if let Some(latest) = last_event_of(run, entries)? {
            return Ok(Some(latest));
        }
    }
}

fn bad(run: &RunId) -> impl Fn(reply::ReplyError) -> QueueError + '_ {
    move |e| queue_reply_err("wait_for_events", run, e)
}

/// The id of the last event of the last of `entries`.
fn last_event_of(run: &RunId, entries: Vec<Value>) -> Result<Option<EventId>, QueueError> {
    let Some(entry) = entries.into_iter().last() else { return Ok(None) };
    let (id, events): (EntryId, _) = attempts_entry(run, entry)?;
    let last = events.len().saturating_sub(1) as u64;
    Ok(Some(EventId::new(id.ms, (id.seq << EVENT_INDEX_BITS) | last)))
}

/// The entries of an `XREAD` reply on one stream (`Nil` when the block
/// timed out; an array of `[key, entries]` pairs in RESP2, a map in RESP3).
fn stream_entries(run: &RunId, read: Value) -> Result<Vec<Value>, QueueError> {
    let entries = match read {
        Value::Nil => return Ok(Vec::new()),
        Value::Map(streams) => streams.into_iter().next().map(|(_, entries)| entries),
        other => {
            let streams = reply::array("wait_for_events", other).map_err(bad(run))?;
            match streams.into_iter().next() {
                Some(stream) => reply::array("wait_for_events", stream).map_err(bad(run))?.into_iter().nth(1),
                None => None,
            }
        }
    };
    reply::array("wait_for_events", entries.unwrap_or(Value::Nil)).map_err(bad(run))
}
