//! The `/metrics` page: what [`crate::metrics`] recorded, with the gauges
//! read at the scrape (the worker's owned accounts, the open WebSockets).

use std::time::Duration;

use leasehold_core::Tier;

use crate::coordinator::CoordinatorObserver;

/// The page: the recorded metrics, with the owned-account gauges of
/// `worker` (when this process runs one) and the open WebSockets (when it
/// serves the API) read now.
pub fn render(worker: Option<&CoordinatorObserver>, websockets: Option<usize>) -> String {
    let handle = crate::metrics::handle();
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
