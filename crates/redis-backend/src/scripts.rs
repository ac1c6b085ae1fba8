//! The Lua scripts, compiled into the binary and sent by SHA1.

use std::sync::LazyLock;

use redis::Script;

/// A Lua function library: loaded once with `FUNCTION LOAD` and called
/// with `FCALL`, so its body (every local function of it) runs once at load
/// and not at every call, as a script's body does at every `EVALSHA`. On
/// the transition script that body cost 175k instructions a call
/// (`docs/queue-model.md`).
pub(crate) struct Library {
    name: String,
    code: String,
}

impl Library {
    /// The library of `body`, which registers one function named by the
    /// global-free local `FUNCTION_NAME` that the loader defines first. The
    /// library and its function are named after the body's SHA-1, so two
    /// versions that share one Redis never replace or call each other's.
    fn new(body: &str) -> Self {
        let hash = Script::new(body).get_hash().to_owned();
        let name = format!("leasehold_{}", &hash[..16]);
        let code = format!("#!lua name={name}\nlocal FUNCTION_NAME = \"{name}\"\n{body}");
        Self { name, code }
    }

    /// The name of the library and of its one function.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The code `FUNCTION LOAD` takes.
    pub(crate) fn code(&self) -> &str {
        &self.code
    }
}

/// Unit-queue transitions: one function library (rspec-hopper's
/// `transition.lua`, extended), kept as one file per part (helpers, one per
/// mode, the dispatch) and joined here in order: later parts use what
/// earlier ones define.
pub(crate) static TRANSITION: LazyLock<Library> = LazyLock::new(|| {
    Library::new(concat!(
        include_str!("../lua/transition/prelude.lua"),
        include_str!("../lua/transition/helpers.lua"),
        include_str!("../lua/transition/events.lua"),
        include_str!("../lua/transition/ranges.lua"),
        include_str!("../lua/transition/reserve.lua"),
        include_str!("../lua/transition/heartbeat.lua"),
        include_str!("../lua/transition/finalize.lua"),
        include_str!("../lua/transition/requeue.lua"),
        include_str!("../lua/transition/abandon.lua"),
        include_str!("../lua/transition/release.lua"),
        include_str!("../lua/transition/liveness.lua"),
        include_str!("../lua/transition/append_event.lua"),
        include_str!("../lua/transition/dispatch.lua"),
    ))
});
/// Run initialisation (leader election).
pub(crate) static INITIALIZE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/initialize.lua")));
/// A run's counters.
pub(crate) static PROGRESS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/progress.lua")));
/// A run's pending deliveries.
pub(crate) static PENDING: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/pending.lua")));
/// Lease claims.
pub(crate) static LEASE_CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/lease_claim.lua")));
/// Raising a fence counter past a stored token.
pub(crate) static LEASE_RAISE_TOKEN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/lease_raise_token.lua")));
/// Binding the key space to a deployment.
pub(crate) static DEPLOYMENT_BIND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/deployment_bind.lua")));
/// Lease renewal.
pub(crate) static LEASE_RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/lease_renew.lua")));
/// Lease release.
pub(crate) static LEASE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/lease_release.lua")));
/// `mark_not_live`.
pub(crate) static LEASE_NOT_LIVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/lease_not_live.lua")));
/// Worker registration.
pub(crate) static WORKER_REGISTER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/worker_register.lua")));
/// Live workers.
pub(crate) static WORKER_LIVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/worker_live.lua")));
/// Counting one run's outcomes into the units' pass streaks.
pub(crate) static TIMINGS_OUTCOMES: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/timings_outcomes.lua")));
/// Presence + `user.active`.
pub(crate) static USER_ACTIVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/user_active.lua")));
/// Binding the bucket count.
pub(crate) static BUCKET_BIND: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/bucket_bind.lua")));
/// Bucket weights.
pub(crate) static BUCKET_WEIGHTS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/bucket_weights.lua")));
/// A worker's balancing step.
pub(crate) static BUCKET_TICK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/bucket_tick.lua")));
/// Releasing bucket leases (and leaving).
pub(crate) static BUCKET_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/bucket_release.lua")));
/// A bucket's current lease.
pub(crate) static BUCKET_HOLDER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/bucket_holder.lua")));
/// Raising a bucket's fence counter.
pub(crate) static BUCKET_RAISE_TOKEN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/bucket_raise_token.lua")));
/// Tiers, each set to a default first when it has none.
pub(crate) static TIERS_OR_DEFAULT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/tiers_or_default.lua")));
/// A worker joining the bucket workers.
pub(crate) static BUCKET_JOIN: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/bucket_join.lua")));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_is_named_after_its_code() {
        let (a, b) = (Library::new("return 1"), Library::new("return 2"));
        assert_ne!(a.name(), b.name());
        assert_eq!(a.name(), Library::new("return 1").name());
        assert!(a.code().starts_with(&format!("#!lua name={}\n", a.name())), "{}", a.code());
        assert!(a.name().chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{}", a.name());
    }
}
