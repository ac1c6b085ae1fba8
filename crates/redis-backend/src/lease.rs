//! [`LeaseStore`] on Redis: the seed's lease primitives in Lua, plus fencing tokens.

use async_trait::async_trait;
use leasehold_core::{FencingToken, Lease, LeaseError, LeaseKey, LeaseStore, Ttl, WorkerId};
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

    pub(crate) async fn simple(&self, op: &'static str, key: &str, cmd: &redis::Cmd) -> Result<Value, LeaseError> {
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
}
