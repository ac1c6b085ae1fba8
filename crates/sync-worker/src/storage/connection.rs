//! What a worker's database connections carry: its name, and timeouts that
//! keep a paused worker from holding up the account's next owner.
//!
//! On Postgres every connection of a worker's pool sets, once, when it is
//! opened:
//!
//! * `application_name` = the worker id, so `pg_stat_activity` and the
//!   server's log say whose connection is whose;
//! * `idle_in_transaction_session_timeout` = a third of the lease TTL: a
//!   worker stopped (SIGSTOP, a long GC-like stall, a dead network) inside a
//!   write transaction loses that transaction and its row locks, so the new
//!   owner's claim and writes are not held up past it. Nothing is committed
//!   from such a transaction: the server ends the session, and the stalled
//!   worker's commit fails when it resumes. Write transactions hold no IMAP
//!   round trip (the engine fetches first, then writes), so a healthy one is
//!   never idle that long;
//! * `lock_timeout` = half the lease TTL: a statement waiting on a row lock
//!   fails rather than waiting past the lease (the runner retries). It is
//!   longer than the idle timeout on purpose: a new owner waiting on a
//!   stalled owner's row lock gets it when the stalled session is ended,
//!   rather than giving up just before.
//!
//! SQLite runs in one process (`serve`), so nothing there can pause one
//! writer while another waits: the settings do not apply.
//!
//! **Cancelled transactions.** A write task that is cancelled (its runner
//! aborted when the lease is lost) drops its [`FencedTx`](super::FencedTx)
//! mid-transaction. sqlx guarantees the rollback: dropping a transaction
//! queues a `ROLLBACK` on its connection, and the pool flushes it (its
//! release ping waits for the connection to be ready, which also finishes a
//! query cut off mid-flight) before anyone else gets the connection; a
//! cancelled `BEGIN` is rolled back by a guard in sqlx-postgres's transaction
//! manager. The test `a_cancelled_write_leaves_no_connection_in_a_transaction`
//! holds sqlx to it on Postgres through `pg_stat_activity`.

use std::time::Duration;

use leasehold_core::WorkerId;

/// How a worker's connections introduce themselves and time out (Postgres).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectionSettings {
    /// `application_name`: the worker id.
    pub application_name: Option<String>,
    /// `idle_in_transaction_session_timeout`; `None` keeps the server's.
    pub idle_in_transaction_timeout: Option<Duration>,
    /// `lock_timeout`; `None` keeps the server's.
    pub lock_timeout: Option<Duration>,
}

impl ConnectionSettings {
    /// The settings of worker `worker` holding leases for `lease_ttl`:
    /// its id as `application_name`, an idle-in-transaction timeout of a
    /// third of the TTL and a lock timeout of half of it.
    pub fn for_worker(worker: &WorkerId, lease_ttl: Duration) -> Self {
        let at_least_1ms = |d: Duration| d.max(Duration::from_millis(1));
        Self {
            application_name: Some(worker.to_string()),
            idle_in_transaction_timeout: Some(at_least_1ms(lease_ttl / 3)),
            lock_timeout: Some(at_least_1ms(lease_ttl / 2)),
        }
    }

    /// `(setting, value)` pairs for `set_config`, in the order they are set.
    pub(super) fn postgres_settings(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(name) = &self.application_name {
            out.push(("application_name", name.clone()));
        }
        let ms = |t: Duration| format!("{}ms", t.as_millis().max(1));
        if let Some(t) = self.idle_in_transaction_timeout {
            out.push(("idle_in_transaction_session_timeout", ms(t)));
        }
        if let Some(t) = self.lock_timeout {
            out.push(("lock_timeout", ms(t)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_names_its_connections_and_times_out_well_within_its_ttl() {
        let s = ConnectionSettings::for_worker(&WorkerId::new("w-7").unwrap(), Duration::from_secs(3));
        assert_eq!(
            s.postgres_settings(),
            [
                ("application_name", "w-7".to_string()),
                ("idle_in_transaction_session_timeout", "1000ms".to_string()),
                ("lock_timeout", "1500ms".to_string()),
            ]
        );
        assert!(ConnectionSettings::default().postgres_settings().is_empty());
    }
}
