//! Group commit of attempt outcomes: the attempts that end while one
//! transaction is being written go into the next, together. An attempt's
//! task waits for its outcome to be stored before it tells the queue, so
//! the rows stay ahead of the queue.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::storage::{AttemptOutcome, Storage, StorageError};

/// Most outcomes written in one transaction.
const MAX_GROUP: usize = 256;

type Reply = oneshot::Sender<Result<(), Arc<StorageError>>>;

/// Why an outcome was not stored.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The transaction failed (every outcome of its group failed with it).
    #[error("could not record webhook delivery attempts")]
    Storage(#[source] Arc<StorageError>),
    /// The recorder stopped (its dispatcher is stopping).
    #[error("the webhook attempt recorder stopped")]
    Stopped,
}

/// The recorder's handle; it stops once every clone is dropped.
#[derive(Debug, Clone)]
pub(super) struct Recorder {
    tx: mpsc::Sender<((String, String, AttemptOutcome), Reply)>,
}

impl Recorder {
    pub(super) fn spawn(storage: Storage) -> Self {
        let (tx, mut rx) = mpsc::channel::<((String, String, AttemptOutcome), Reply)>(MAX_GROUP * 4);
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut group = vec![first];
                while group.len() < MAX_GROUP {
                    match rx.try_recv() {
                        Ok(next) => group.push(next),
                        Err(_) => break,
                    }
                }
                let (rows, replies): (Vec<_>, Vec<_>) = group.into_iter().unzip();
                let stored = storage.record_delivery_attempts(&rows).await.map_err(Arc::new);
                for reply in replies {
                    let _ = reply.send(stored.clone());
                }
            }
        });
        Self { tx }
    }

    /// Stores `outcome` of delivery `id` of `webhook`, with whatever else ended meanwhile.
    pub(super) async fn record(&self, webhook: &str, id: &str, outcome: AttemptOutcome) -> Result<(), RecordError> {
        let (reply, stored) = oneshot::channel();
        self.tx
            .send(((webhook.to_string(), id.to_string(), outcome), reply))
            .await
            .map_err(|_| RecordError::Stopped)?;
        stored.await.map_err(|_| RecordError::Stopped)?.map_err(RecordError::Storage)
    }
}
