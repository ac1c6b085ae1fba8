//! A task handle that aborts its task when dropped: the runner's loops and
//! the reconciler end with whoever owns them, never outliving it.

use tokio::task::JoinHandle;

/// A task handle that aborts the task when dropped, so no loop outlives its owner.
#[derive(Debug)]
pub(crate) struct AbortOnDrop<T>(pub(crate) JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
