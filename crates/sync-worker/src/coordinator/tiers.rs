//! The tier policy, as pure functions of what the coordinator read.
//!
//! * **hot**: the user has a live session (`sess:active:{user}`), or the
//!   account's newest mail is younger than `TIER_HOT_ACTIVITY_H`;
//! * **cold**: no session and no mail younger than `TIER_COLD_AFTER_H`
//!   (an account with no mail at all is cold too);
//! * **warm**: anything else.
//!
//! Then the hot budget: while a worker has more than `HOT_BUDGET_PER_WORKER`
//! hot accounts, the least recently active (oldest newest mail) hot accounts
//! *without* a session are demoted to warm. Accounts with a session are never
//! demoted: a user looking at their mail gets it at once.

use std::time::Duration;

use leasehold_core::Tier;

use crate::config::Config;

/// The thresholds of the tier policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierPolicy {
    /// Mail younger than this makes an account hot.
    pub hot_activity: Duration,
    /// No mail younger than this (and no session) makes an account cold.
    pub cold_after: Duration,
    /// Most hot accounts a worker keeps (session-holding ones excepted).
    pub hot_budget: usize,
}

impl From<&Config> for TierPolicy {
    fn from(c: &Config) -> Self {
        Self { hot_activity: c.tier_hot_activity, cold_after: c.tier_cold_after, hot_budget: c.hot_budget_per_worker }
    }
}

/// What the policy looks at for one account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierInputs {
    /// Whether the account's user has a live session.
    pub session: bool,
    /// The newest internal date of the account's mail (ms since the epoch).
    pub latest_mail_ms: Option<u64>,
}

impl TierPolicy {
    /// The tier of one account before the hot budget is applied.
    pub fn base_tier(&self, now_ms: u64, inputs: TierInputs) -> Tier {
        let age = inputs.latest_mail_ms.map(|t| Duration::from_millis(now_ms.saturating_sub(t)));
        if inputs.session || age.is_some_and(|a| a <= self.hot_activity) {
            Tier::Hot
        } else if age.is_none_or(|a| a > self.cold_after) {
            Tier::Cold
        } else {
            Tier::Warm
        }
    }

    /// Tiers for a worker's accounts: [`TierPolicy::base_tier`] of each, then
    /// the hot budget. Returns one tier per input, in order.
    pub fn assign(&self, now_ms: u64, inputs: &[TierInputs]) -> Vec<Tier> {
        let mut tiers: Vec<Tier> = inputs.iter().map(|i| self.base_tier(now_ms, *i)).collect();
        let hot = tiers.iter().filter(|t| **t == Tier::Hot).count();
        if hot > self.hot_budget {
            let mut demotable: Vec<usize> =
                (0..inputs.len()).filter(|&i| tiers[i] == Tier::Hot && !inputs[i].session).collect();
            // Least recently active first; ties by position for determinism.
            demotable.sort_by_key(|&i| (inputs[i].latest_mail_ms.unwrap_or(0), i));
            for i in demotable.into_iter().take(hot - self.hot_budget) {
                tiers[i] = Tier::Warm;
            }
        }
        tiers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 3_600_000;
    const NOW: u64 = 1_000 * H;

    fn policy(budget: usize) -> TierPolicy {
        TierPolicy {
            hot_activity: Duration::from_secs(2 * 3600),
            cold_after: Duration::from_secs(48 * 3600),
            hot_budget: budget,
        }
    }

    fn inputs(session: bool, age_h: Option<u64>) -> TierInputs {
        TierInputs { session, latest_mail_ms: age_h.map(|a| NOW - a * H) }
    }

    #[test]
    fn base_tiers() {
        let p = policy(10);
        assert_eq!(p.base_tier(NOW, inputs(true, None)), Tier::Hot);
        assert_eq!(p.base_tier(NOW, inputs(false, Some(1))), Tier::Hot);
        assert_eq!(p.base_tier(NOW, inputs(false, Some(2))), Tier::Hot);
        assert_eq!(p.base_tier(NOW, inputs(false, Some(3))), Tier::Warm);
        assert_eq!(p.base_tier(NOW, inputs(false, Some(48))), Tier::Warm);
        assert_eq!(p.base_tier(NOW, inputs(false, Some(49))), Tier::Cold);
        assert_eq!(p.base_tier(NOW, inputs(false, None)), Tier::Cold);
        assert_eq!(p.base_tier(NOW, inputs(true, Some(100))), Tier::Hot);
    }

    #[test]
    fn budget_demotes_least_recently_active_sessionless_accounts() {
        let p = policy(2);
        let ins = [inputs(false, Some(1)), inputs(true, Some(50)), inputs(false, Some(0)), inputs(true, None)];
        // 4 hot, budget 2: only session-less ones may go; the older (1 h) goes first, then the newer.
        assert_eq!(p.assign(NOW, &ins), vec![Tier::Warm, Tier::Hot, Tier::Warm, Tier::Hot]);
        let p = policy(3);
        assert_eq!(p.assign(NOW, &ins), vec![Tier::Warm, Tier::Hot, Tier::Hot, Tier::Hot]);
        let p = policy(4);
        assert_eq!(p.assign(NOW, &ins), vec![Tier::Hot; 4]);
    }
}
