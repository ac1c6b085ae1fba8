//! What a process exposes at `/metrics`, in Prometheus text format.
//!
//! Counters and histograms are recorded where things happen, through the
//! `metrics` facade (a no-op until a recorder is installed). Gauges of what
//! a worker owns are read from its coordinator when the page is rendered, so
//! they cost nothing between scrapes. Every name starts with `sync_worker_`:
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

use crate::coordinator::CoordinatorObserver;

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

/// The page: the recorded metrics, with the owned-account gauges of
/// `worker` (when this process runs one) and the open WebSockets (when it
/// serves the API) read now.
pub fn render(worker: Option<&CoordinatorObserver>, websockets: Option<usize>) -> String {
    let handle = handle();
    if let Some(w) = worker {
        record_owned(w);
    }
    if let Some(n) = websockets {
        metrics::gauge!("sync_worker_websockets_open").set(n as f64);
    }
    handle.render()
}

fn record_owned(worker: &CoordinatorObserver) {
    let mut tiers: Vec<(&'static str, u64)> = [Tier::Hot, Tier::Warm, Tier::Cold].map(|t| (t.as_str(), 0)).into();
    let (mut first, mut ok, mut failing, mut lag) = (0u64, 0u64, 0u64, Duration::ZERO);
    let now = tokio::time::Instant::now();
    for a in worker.owned() {
        match tiers.iter_mut().find(|(name, _)| *name == a.tier.as_str()) {
            Some((_, n)) => *n += 1,
            None => tiers.push((a.tier.as_str(), 1)),
        }
        match (&a.status.last_error, a.status.last_sync) {
            (Some(_), _) => failing += 1,
            (None, None) => first += 1,
            (None, Some(_)) => ok += 1,
        }
        if let Some(at) = a.status.last_sync {
            lag = lag.max(now.saturating_duration_since(at));
        }
    }
    for (tier, n) in tiers {
        metrics::gauge!("sync_worker_accounts", "tier" => tier).set(n as f64);
    }
    for (state, n) in [("first_sync", first), ("up_to_date", ok), ("failing", failing)] {
        metrics::gauge!("sync_worker_account_health", "state" => state).set(n as f64);
    }
    metrics::gauge!("sync_worker_sync_lag_seconds").set(lag.as_secs_f64());
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
