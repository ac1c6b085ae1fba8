//! New mail's batches parsed and committed on tasks of their own, while the
//! connection fetches the next batch: the FETCH of batch N+1 (the server's
//! work and the socket's) overlaps the parse and the commit of batch N,
//! where one ran after the other before.
//!
//! A batch is parsed on one task and committed on another, with at most one
//! batch waiting before each, so memory stays at a few batches whatever the
//! folder's size. Each batch is its own fenced transaction with its
//! `last_uid`, exactly as when it was written inline: a crash resumes after
//! the last committed batch, and a stale owner's commit is refused by the
//! fence as before.

use async_imap::types::Fetch;
use leasehold_core::bus::AbortOnDrop;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::message::row_of;
use crate::source::Fence;
use crate::storage::{MessageRow, Storage, StorageError};

/// One fetched batch and the UID its commit may move `last_uid` to
/// (`None`: the answer did not begin with the batch's first UID, so
/// `last_uid` stays where it is).
struct Batch {
    fetched: Vec<Fetch>,
    last: Option<u32>,
}

/// What the writer committed.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Written {
    /// `last_uid` after the last committed batch (`None`: none committed).
    pub last_uid: Option<u32>,
    /// Messages stored.
    pub messages: u64,
}

/// The writing end of one folder's new-mail sync.
pub(super) struct BatchWriter {
    account: String,
    folder: String,
    batches: Option<mpsc::Sender<Batch>>,
    task: Option<JoinHandle<Result<Written, StorageError>>>,
}

impl BatchWriter {
    /// Starts the writer for folder `key` (the stored name) at `uidvalidity`;
    /// rows with a UID below `from` (an `n:*` answer's highest UID) are not
    /// stored. Two tasks: one parses a batch while the other commits the
    /// batch before it (on Postgres the commit is a round trip and a WAL
    /// flush, which would otherwise leave the parse idle).
    pub(super) fn spawn(storage: Storage, fence: Fence, key: String, uidvalidity: u32, from: u32) -> Self {
        let (account, folder) = (fence.account.to_string(), key.clone());
        let (batches, mut to_parse) = mpsc::channel::<Batch>(1);
        let (parsed, mut to_write) = mpsc::channel::<(Vec<MessageRow>, Option<u32>)>(1);
        let parse = tokio::spawn(async move {
            while let Some(batch) = to_parse.recv().await {
                let rows: Vec<_> = batch.fetched.iter().filter_map(row_of).filter(|r| r.uid >= from).collect();
                drop(batch.fetched);
                if parsed.send((rows, batch.last)).await.is_err() {
                    return; // the writer failed: its result says why
                }
            }
        });
        let task = tokio::spawn(async move {
            // The parse task ends with the writer (an error, or an abort).
            let _parse = AbortOnDrop(parse);
            let mut written = Written::default();
            while let Some((rows, last)) = to_write.recv().await {
                let mut tx = storage.write(&fence).await?;
                tx.insert_messages(&key, uidvalidity, &rows).await?;
                if let Some(last) = last {
                    tx.set_last_uid(&key, last).await?;
                }
                tx.commit().await?;
                if last.is_some() {
                    written.last_uid = last;
                }
                written.messages += rows.len() as u64;
            }
            Ok(written)
        });
        Self { account, folder, batches: Some(batches), task: Some(task) }
    }

    /// Hands a batch over, waiting while another one is queued. `false`: the
    /// writer has stopped on an error, which [`finish`](Self::finish) returns.
    pub(super) async fn send(&self, fetched: Vec<Fetch>, last: Option<u32>) -> bool {
        match &self.batches {
            Some(batches) => batches.send(Batch { fetched, last }).await.is_ok(),
            None => false,
        }
    }

    /// Waits until every batch handed over is committed (or the first
    /// failure) and says what was written.
    pub(super) async fn finish(mut self) -> Result<Written, StorageError> {
        self.batches = None;
        let Some(task) = self.task.take() else { return Ok(Written::default()) };
        match task.await {
            Ok(result) => result,
            // A panic in the writer is a bug; it is not swallowed.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(StorageError::WriterStopped { account: self.account.clone(), folder: self.folder.clone() }),
        }
    }
}

impl Drop for BatchWriter {
    /// A sync that is dropped (its runner stopped) writes nothing more.
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
