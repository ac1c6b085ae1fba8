//! The accounts table is the source of truth for what should be synced:
//! every worker makes the lease store's live set match it, at start and
//! every `RECONCILE_INTERVAL`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{LeaseKey, LeaseStore};

use super::task::AbortOnDrop;
use crate::errors::{error_chain, SyncError};
use crate::storage::Storage;

/// What one reconciliation changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Accounts marked live.
    pub added: usize,
    /// Accounts marked not live (removed from the table).
    pub removed: usize,
}

/// Makes the live set equal to the accounts table, once.
pub async fn reconcile(storage: &Storage, store: &dyn LeaseStore) -> Result<Reconciled, SyncError> {
    // Never reconcile another deployment's live set away.
    check_deployment(storage, store).await?;
    let wanted: HashSet<LeaseKey> = storage.account_keys().await?.into_iter().collect();
    let live: HashSet<LeaseKey> = store.live_keys().await?.into_iter().collect();
    let mut done = Reconciled::default();
    for key in wanted.difference(&live) {
        store.mark_live(key).await?;
        done.added += 1;
    }
    for key in live.difference(&wanted) {
        store.mark_not_live(key).await?;
        done.removed += 1;
    }
    if done != Reconciled::default() {
        tracing::info!(added = done.added, removed = done.removed, "live set reconciled with the accounts table");
    }
    Ok(done)
}

/// Reconciles every `every` until the handle is dropped. A failed round is
/// logged and retried at the next one.
pub fn spawn(storage: Storage, store: Arc<dyn LeaseStore>, every: Duration) -> Reconciler {
    Reconciler {
        _task: AbortOnDrop(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = reconcile(&storage, store.as_ref()).await {
                    tracing::warn!(error = %error_chain(&e), "reconciling the live set failed; retrying at the next interval");
                }
            }
        })),
    }
}

/// The running reconciler; dropping it stops it.
#[derive(Debug)]
pub struct Reconciler {
    _task: AbortOnDrop<()>,
}

/// Binds the lease store's key space to this database's deployment (the
/// first to ask records its id) and checks that it is this one's:
/// [`SyncError::OtherDeployment`] when another deployment's database bound it.
pub async fn check_deployment(storage: &Storage, store: &dyn LeaseStore) -> Result<(), SyncError> {
    let database = storage.deployment_id().await?;
    let key_space = store.bind_deployment(&database).await?;
    if key_space == database {
        Ok(())
    } else {
        Err(SyncError::OtherDeployment { database, key_space })
    }
}
