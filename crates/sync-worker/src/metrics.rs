//! What a process exposes at `/metrics`, in Prometheus text format.
//!
//! Counters and histograms are recorded where things happen, through the
//! `metrics` facade (a no-op until a recorder is installed). Gauges of what
//! a worker owns are read from its coordinator when the page is rendered
//! (`api::metrics_page`), so they cost nothing between scrapes. Every name starts with `sync_worker_`:
//!
//! | metric | kind | what |
//! | --- | --- | --- |
//! | `sync_worker_accounts{tier}` | gauge | accounts this worker owns, by tier |
//! | `sync_worker_account_health{state}` | gauge | owned accounts: `first_sync` (no poll finished yet), `up_to_date`, `failing` (the last poll failed) |
//! | `sync_worker_sync_lag_seconds` | gauge | the longest time since an owned account's last finished poll |
//! | `sync_worker_polls_total{tier,outcome}` | counter | periodic polls, `ok` or `error` |
//! | `sync_worker_poll_seconds{tier}` | histogram | how long a periodic poll took (connect, sync, disconnect) |
//! | `sync_worker_messages_synced_total` | counter | new messages stored (by polls and by hot accounts' IDLE) |
//! | `sync_worker_imap_connections_open` | gauge | IMAP connections open in this process |
//! | `sync_worker_imap_login_refusals_total` | counter | IMAP logins the servers refused |
//! | `sync_worker_api_logins_total{outcome}` | counter | API logins, `ok`, `failed` or `limited` |
//! | `sync_worker_websockets_open` | gauge | the API's open WebSockets |
//! | `sync_worker_push_seconds` | histogram | from a mail write's commit to its event sent on a WebSocket |
//! | `sync_worker_webhook_deliveries_total{outcome}` | counter | webhook POSTs, `delivered` or `failed` |

use std::sync::OnceLock;
use std::time::Duration;

use leasehold_core::Tier;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Push latencies' histogram buckets, in seconds.
const PUSH_BUCKETS: [f64; 9] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];
/// Poll durations' histogram buckets, in seconds.
const POLL_BUCKETS: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0];

/// The process's recorder, installed on first use: one per process, as the
/// `metrics` facade allows (tests that start several servers share it).
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full("sync_worker_poll_seconds".into()), &POLL_BUCKETS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full("sync_worker_push_seconds".into()), &PUSH_BUCKETS))
            .map(PrometheusBuilder::build_recorder);
        match recorder {
            Ok(recorder) => {
                let handle = recorder.handle();
                if metrics::set_global_recorder(recorder).is_err() {
                    tracing::warn!(
                        "another metrics recorder is installed: /metrics shows only the gauges read at render"
                    );
                }
                describe();
                handle
            }
            // Only an empty bucket list fails, and ours are fixed.
            Err(e) => unreachable!("the histogram buckets are fixed and non-empty: {e}"),
        }
    })
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!("sync_worker_accounts", "Accounts this worker owns, by tier");
    describe_gauge!("sync_worker_account_health", "Owned accounts by health: first_sync, up_to_date, failing");
    describe_gauge!("sync_worker_sync_lag_seconds", Unit::Seconds, "Longest time since an owned account's last poll");
    describe_counter!("sync_worker_polls_total", "Periodic polls by tier and outcome");
    describe_histogram!("sync_worker_poll_seconds", Unit::Seconds, "Periodic poll duration by tier");
    describe_counter!("sync_worker_messages_synced_total", "New messages stored");
    describe_gauge!("sync_worker_imap_connections_open", "IMAP connections open in this process");
    describe_counter!("sync_worker_imap_login_refusals_total", "IMAP logins refused by the servers");
    describe_counter!("sync_worker_api_logins_total", "API logins by outcome: ok, failed, limited");
    describe_gauge!("sync_worker_websockets_open", "Open WebSockets of the API");
    describe_histogram!("sync_worker_push_seconds", Unit::Seconds, "From a mail write's commit to its WebSocket event");
    describe_counter!("sync_worker_webhook_deliveries_total", "Webhook POSTs by outcome: delivered, failed");
}

/// One IMAP connection, counted in `sync_worker_imap_connections_open`
/// while it lives.
#[derive(Debug)]
pub struct OpenConnection(());

impl OpenConnection {
    /// Counts one more open connection.
    pub fn new() -> Self {
        metrics::gauge!("sync_worker_imap_connections_open").increment(1.0);
        Self(())
    }
}

impl Default for OpenConnection {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        metrics::gauge!("sync_worker_imap_connections_open").decrement(1.0);
    }
}

/// Records one periodic poll of an account in `tier`.
pub fn poll_done(tier: Tier, took: Duration, ok: bool) {
    let outcome = if ok { "ok" } else { "error" };
    metrics::counter!("sync_worker_polls_total", "tier" => tier.as_str(), "outcome" => outcome).increment(1);
    metrics::histogram!("sync_worker_poll_seconds", "tier" => tier.as_str()).record(took.as_secs_f64());
}
