//! New mail's batches parsed and committed on a task of their own, while the
//! connection fetches the next batch: the FETCH of batch N+1 (the server's
//! work and the socket's) overlaps the parse and the commit of batch N,
//! where one ran after the other before.
//!
//! At most one batch waits behind the one being written, so memory stays at
//! about three batches whatever the folder's size. Each batch is its own
//! fenced transaction with its `last_uid`, exactly as when it was written
//! inline: a crash resumes after the last committed batch, and a stale
//! owner's commit is refused by the fence as before.

use async_imap::types::Fetch;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::message::row_of;
use crate::source::Fence;
use crate::storage::{Storage, StorageError};

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
    /// stored.
    pub(super) fn spawn(storage: Storage, fence: Fence, key: String, uidvalidity: u32, from: u32) -> Self {
        let (account, folder) = (fence.account.to_string(), key.clone());
        let (batches, mut queue) = mpsc::channel::<Batch>(1);
        let task = tokio::spawn(async move {
            let mut written = Written::default();
            while let Some(batch) = queue.recv().await {
                let rows: Vec<_> = batch.fetched.iter().filter_map(row_of).filter(|r| r.uid >= from).collect();
                drop(batch.fetched);
                let mut tx = storage.write(&fence).await?;
                tx.insert_messages(&key, uidvalidity, &rows).await?;
                if let Some(last) = batch.last {
                    tx.set_last_uid(&key, last).await?;
                }
                tx.commit().await?;
                if batch.last.is_some() {
                    written.last_uid = batch.last;
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
