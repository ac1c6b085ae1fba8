//! [`LeaseStore`] on Redis: the seed's lease primitives in Lua, plus fencing tokens.

use async_trait::async_trait;
use leasehold_core::{
    FencingToken, Lease, LeaseError, LeaseKey, LeaseStore, Tier, Ttl, UserActiveSubscription, UserId, WorkerId,
};
use redis::Value;

use crate::conn::{self, Call};
use crate::reply::{self, ReplyError};
use crate::scripts;
use crate::store::{lease_err, lease_reply_err, RedisStore};

/// The stored value of a lease: `"owner token"`.
fn lease_value(lease: &Lease) -> String {
    format!("{} {}", lease.owner, lease.token)
}

impl RedisStore {
    fn claim_call(&self, keys: &[LeaseKey], owner: &WorkerId, ttl: Ttl) -> Call {
        let k = self.lease_keys();
        let mut names = Vec::with_capacity(keys.len() * 3);
        for key in keys {
            names.push(k.lease(key));
            names.push(k.fence(key));
            names.push(k.tier(key));
        }
        Call::new(names).arg(owner.as_str()).arg(ttl.as_millis())
    }

    async fn claim_tokens(&self, keys: &[LeaseKey], owner: &WorkerId, ttl: Ttl) -> Result<Vec<u64>, LeaseError> {
        let label = keys.first().map(|k| k.to_string()).unwrap_or_default();
        let value = self
            .eval(&scripts::LEASE_CLAIM, &self.claim_call(keys, owner, ttl))
            .await
            .map_err(|e| lease_err("claim", &label, e))?;
        let items = reply::array("claim", value).map_err(|e| lease_reply_err("claim", &label, e))?;
        if items.len() != keys.len() {
            return Err(lease_reply_err(
                "claim",
                &label,
                ReplyError::new("claim", format!("{} answers for {} keys", items.len(), keys.len())),
            ));
        }
        items.iter().map(|v| reply::uint("claim", v).map_err(|e| lease_reply_err("claim", &label, e))).collect()
    }

    async fn simple(&self, op: &'static str, key: &str, cmd: &redis::Cmd) -> Result<Value, LeaseError> {
        cmd.query_async(&mut self.conn()).await.map_err(|e| lease_err(op, key, e))
    }
}

#[async_trait]
impl LeaseStore for RedisStore {
    async fn claim(&self, key: &LeaseKey, owner: &WorkerId, ttl: Ttl) -> Result<Option<Lease>, LeaseError> {
        let tokens = self.claim_tokens(std::slice::from_ref(key), owner, ttl).await?;
        Ok(tokens.first().filter(|t| **t > 0).map(|t| Lease {
            key: key.clone(),
            owner: owner.clone(),
            token: FencingToken(*t),
        }))
    }

    async fn claim_many(&self, keys: &[LeaseKey], owner: &WorkerId, ttl: Ttl) -> Result<Vec<Lease>, LeaseError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        // One script call for all keys: they share the lease space's hash tag.
        let tokens = self.claim_tokens(keys, owner, ttl).await?;
        Ok(keys
            .iter()
            .zip(tokens)
            .filter(|(_, t)| *t > 0)
            .map(|(key, t)| Lease { key: key.clone(), owner: owner.clone(), token: FencingToken(t) })
            .collect())
    }

    async fn renew(&self, lease: &Lease, ttl: Ttl) -> Result<bool, LeaseError> {
        let call = Call::new([self.lease_keys().lease(&lease.key)]).arg(lease_value(lease)).arg(ttl.as_millis());
        let value =
            self.eval(&scripts::LEASE_RENEW, &call).await.map_err(|e| lease_err("renew", lease.key.as_str(), e))?;
        Ok(reply::int("renew", &value).map_err(|e| lease_reply_err("renew", lease.key.as_str(), e))? == 1)
    }

    async fn renew_many(&self, leases: &[Lease], ttl: Ttl) -> Result<Vec<bool>, LeaseError> {
        let Some(first) = leases.first() else { return Ok(Vec::new()) };
        // One pipeline of renew calls; NOSCRIPT answers are reloaded and re-sent.
        let calls: Vec<Call> = leases
            .iter()
            .map(|l| Call::new([self.lease_keys().lease(&l.key)]).arg(lease_value(l)).arg(ttl.as_millis()))
            .collect();
        let results = conn::eval_pipelined(&mut self.conn(), &scripts::LEASE_RENEW, &calls)
            .await
            .map_err(|e| lease_err("renew", first.key.as_str(), e))?;
        leases
            .iter()
            .zip(results)
            .map(|(lease, r)| {
                let value = r.map_err(|e| lease_err("renew", lease.key.as_str(), e))?;
                Ok(reply::int("renew", &value).map_err(|e| lease_reply_err("renew", lease.key.as_str(), e))? == 1)
            })
            .collect()
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LeaseError> {
        let call = Call::new([self.lease_keys().lease(&lease.key)]).arg(lease_value(lease));
        let value =
            self.eval(&scripts::LEASE_RELEASE, &call).await.map_err(|e| lease_err("release", lease.key.as_str(), e))?;
        Ok(reply::int("release", &value).map_err(|e| lease_reply_err("release", lease.key.as_str(), e))? == 1)
    }

    async fn bind_deployment(&self, deployment: &str) -> Result<String, LeaseError> {
        let key = self.lease_keys().deployment();
        let value = self
            .eval(&scripts::DEPLOYMENT_BIND, &Call::new([&key]).arg(deployment))
            .await
            .map_err(|e| lease_err("bind_deployment", &key, e))?;
        reply::string("bind_deployment", &value).map_err(|e| lease_reply_err("bind_deployment", &key, e))
    }

    async fn raise_token(&self, key: &LeaseKey, past: FencingToken) -> Result<(), LeaseError> {
        let call = Call::new([self.lease_keys().fence(key)]).arg(past.0);
        let value = self
            .eval(&scripts::LEASE_RAISE_TOKEN, &call)
            .await
            .map_err(|e| lease_err("raise_token", key.as_str(), e))?;
        reply::uint::<u64>("raise_token", &value).map_err(|e| lease_reply_err("raise_token", key.as_str(), e))?;
        Ok(())
    }

    async fn holder(&self, key: &LeaseKey) -> Result<Option<Lease>, LeaseError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(self.lease_keys().lease(key));
        let value = self.simple("holder", key.as_str(), &cmd).await?;
        let Some(raw) = reply::opt_string("holder", &value).map_err(|e| lease_reply_err("holder", key.as_str(), e))?
        else {
            return Ok(None);
        };
        let corrupt = || LeaseError::Corrupt {
            key: key.to_string(),
            detail: format!("lease value {raw:?} is not \"owner token\""),
        };
        let (owner, token) = raw.rsplit_once(' ').ok_or_else(corrupt)?;
        let owner = WorkerId::new(owner).map_err(|_| corrupt())?;
        let token = token.parse().map_err(|_| corrupt())?;
        Ok(Some(Lease { key: key.clone(), owner, token: FencingToken(token) }))
    }

    async fn mark_live(&self, key: &LeaseKey) -> Result<(), LeaseError> {
        let mut cmd = redis::cmd("SADD");
        cmd.arg(self.lease_keys().live()).arg(key.as_str());
        self.simple("mark_live", key.as_str(), &cmd).await.map(|_| ())
    }

    async fn mark_not_live(&self, key: &LeaseKey) -> Result<(), LeaseError> {
        let k = self.lease_keys();
        let call = Call::new([k.live(), k.lease(key), k.tier(key)]).arg(key.as_str());
        self.eval(&scripts::LEASE_NOT_LIVE, &call).await.map_err(|e| lease_err("mark_not_live", key.as_str(), e))?;
        Ok(())
    }

    async fn live_keys(&self) -> Result<Vec<LeaseKey>, LeaseError> {
        let live = self.lease_keys().live();
        let mut cmd = redis::cmd("SMEMBERS");
        cmd.arg(&live);
        let value = self.simple("live_keys", &live, &cmd).await?;
        let items = reply::array("live_keys", value).map_err(|e| lease_reply_err("live_keys", &live, e))?;
        let mut keys = Vec::with_capacity(items.len());
        for item in &items {
            let s = reply::string("live_keys", item).map_err(|e| lease_reply_err("live_keys", &live, e))?;
            keys.push(LeaseKey::new(&s).map_err(|e| LeaseError::Corrupt { key: live.clone(), detail: e.to_string() })?);
        }
        keys.sort();
        Ok(keys)
    }

    async fn register_worker(&self, worker: &WorkerId, ttl: Ttl) -> Result<(), LeaseError> {
        let k = self.lease_keys();
        let call = Call::new([k.worker(worker), k.worker_index()]).arg(worker.as_str()).arg(ttl.as_millis());
        self.eval(&scripts::WORKER_REGISTER, &call)
            .await
            .map_err(|e| lease_err("register_worker", worker.as_str(), e))?;
        Ok(())
    }

    async fn deregister_worker(&self, worker: &WorkerId) -> Result<(), LeaseError> {
        let k = self.lease_keys();
        let mut pipe = redis::pipe();
        pipe.cmd("DEL").arg(k.worker(worker)).ignore().cmd("ZREM").arg(k.worker_index()).arg(worker.as_str()).ignore();
        pipe.query_async::<()>(&mut self.conn()).await.map_err(|e| lease_err("deregister_worker", worker.as_str(), e))
    }

    async fn live_workers(&self) -> Result<Vec<WorkerId>, LeaseError> {
        let index = self.lease_keys().worker_index();
        let value = self
            .eval(&scripts::WORKER_LIVE, &Call::new([&index]))
            .await
            .map_err(|e| lease_err("live_workers", &index, e))?;
        let items = reply::array("live_workers", value).map_err(|e| lease_reply_err("live_workers", &index, e))?;
        let mut workers = Vec::with_capacity(items.len());
        for item in &items {
            let s = reply::string("live_workers", item).map_err(|e| lease_reply_err("live_workers", &index, e))?;
            workers.push(
                WorkerId::new(&s).map_err(|e| LeaseError::Corrupt { key: index.clone(), detail: e.to_string() })?,
            );
        }
        workers.sort();
        Ok(workers)
    }

    async fn set_tier(&self, key: &LeaseKey, tier: Tier) -> Result<(), LeaseError> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.lease_keys().tier(key)).arg(tier.as_str());
        self.simple("set_tier", key.as_str(), &cmd).await.map(|_| ())
    }

    async fn tier(&self, key: &LeaseKey) -> Result<Option<Tier>, LeaseError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(self.lease_keys().tier(key));
        let value = self.simple("tier", key.as_str(), &cmd).await?;
        match reply::opt_string("tier", &value).map_err(|e| lease_reply_err("tier", key.as_str(), e))? {
            None => Ok(None),
            Some(s) => s.parse().map(Some).map_err(|e: String| LeaseError::Corrupt { key: key.to_string(), detail: e }),
        }
    }

    async fn tiers_or_default(&self, keys: &[LeaseKey], default: Tier) -> Result<Vec<Tier>, LeaseError> {
        let mut tiers = Vec::with_capacity(keys.len());
        // The keys share the lease space's tag: one script call per chunk.
        for chunk in keys.chunks(1024) {
            let label = chunk[0].to_string();
            let call = Call::new(chunk.iter().map(|k| self.lease_keys().tier(k))).arg(default.as_str());
            let value = self
                .eval(&scripts::TIERS_OR_DEFAULT, &call)
                .await
                .map_err(|e| lease_err("tiers_or_default", &label, e))?;
            let items =
                reply::array("tiers_or_default", value).map_err(|e| lease_reply_err("tiers_or_default", &label, e))?;
            if items.len() != chunk.len() {
                return Err(lease_reply_err(
                    "tiers_or_default",
                    &label,
                    ReplyError::new("tiers_or_default", format!("{} answers for {} keys", items.len(), chunk.len())),
                ));
            }
            for (key, item) in chunk.iter().zip(&items) {
                let raw = reply::string("tiers_or_default", item)
                    .map_err(|e| lease_reply_err("tiers_or_default", key.as_str(), e))?;
                tiers.push(raw.parse().map_err(|e: String| LeaseError::Corrupt { key: key.to_string(), detail: e })?);
            }
        }
        Ok(tiers)
    }

    async fn mark_user_active(&self, user: &UserId, grace: Ttl) -> Result<(), LeaseError> {
        let k = self.lease_keys();
        let call = Call::new([k.session(user)]).arg(user.as_str()).arg(grace.as_millis()).arg(k.user_active_channel());
        self.eval(&scripts::USER_ACTIVE, &call).await.map_err(|e| lease_err("mark_user_active", user.as_str(), e))?;
        Ok(())
    }

    async fn is_user_active(&self, user: &UserId) -> Result<bool, LeaseError> {
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(self.lease_keys().session(user));
        let value = self.simple("is_user_active", user.as_str(), &cmd).await?;
        Ok(reply::int("is_user_active", &value).map_err(|e| lease_reply_err("is_user_active", user.as_str(), e))? == 1)
    }

    async fn subscribe_user_active(&self) -> Result<UserActiveSubscription, LeaseError> {
        self.inner.user_active.subscribe().await.map_err(|detail| LeaseError::Backend {
            op: "subscribe_user_active",
            key: self.lease_keys().user_active_channel().to_owned(),
            source: detail.into(),
        })
    }
}
