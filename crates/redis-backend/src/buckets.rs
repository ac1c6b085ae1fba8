//! [`BucketLeases`] on Redis: `lua/bucket_*.lua`, one script call per operation.

use async_trait::async_trait;
use leasehold_core::{
    BalancePolicy, BucketBinding, BucketChanges, BucketCount, BucketId, BucketLease, BucketLeases, BucketTick,
    FencingToken, LeaseError, Ttl, WorkerId,
};
use redis::Value;

use crate::conn::Call;
use crate::reply::{self, ReplyError};
use crate::scripts;
use crate::store::{lease_err, lease_reply_err, RedisStore};

/// What errors name as the key of a store-wide bucket operation.
const ALL: &str = "buckets";

fn uints(what: &'static str, value: Value) -> Result<Vec<u64>, ReplyError> {
    reply::array(what, value)?.iter().map(|v| reply::uint(what, v)).collect()
}

fn lease(bucket: u64, owner: &WorkerId, token: u64) -> Result<BucketLease, ReplyError> {
    let bucket = u32::try_from(bucket).map_err(|_| ReplyError::new("tick", format!("bucket {bucket} is not a u32")))?;
    Ok(BucketLease { bucket: BucketId(bucket), owner: owner.clone(), token: FencingToken(token) })
}

impl RedisStore {
    async fn weights_call(
        &self,
        op: &'static str,
        mode: &str,
        pairs: &[(BucketId, i64)],
    ) -> Result<Vec<u64>, LeaseError> {
        let k = self.lease_keys().buckets();
        let mut call = Call::new([&k.meta, &k.weights, &k.owners, &k.expiry, &k.versions])
            .arg(mode)
            .arg(self.lease_keys().bucket_change_channel());
        for (bucket, value) in pairs {
            call.push(bucket.0);
            call.push(*value);
        }
        let label = pairs.first().map(|(b, _)| b.to_string()).unwrap_or_default();
        let value = self.eval(&scripts::BUCKET_WEIGHTS, &call).await.map_err(|e| lease_err(op, &label, e))?;
        uints(op, value).map_err(|e| lease_reply_err(op, &label, e))
    }

    async fn release_call(&self, leave: &str, leases: &[BucketLease]) -> Result<Vec<bool>, LeaseError> {
        let k = self.lease_keys().buckets();
        let mut call = Call::new([&k.weights, &k.owners, &k.expiry, &k.workers, &k.loads]).arg(leave);
        for lease in leases {
            call.push(lease.bucket.0);
            call.push(lease.owner.as_str());
            call.push(lease.token.0);
        }
        let value =
            self.eval(&scripts::BUCKET_RELEASE, &call).await.map_err(|e| lease_err("release_buckets", ALL, e))?;
        let answers = uints("release_buckets", value).map_err(|e| lease_reply_err("release_buckets", ALL, e))?;
        Ok(answers.into_iter().map(|a| a == 1).collect())
    }
}

#[async_trait]
impl BucketLeases for RedisStore {
    async fn bind_buckets(&self, count: BucketCount) -> Result<BucketBinding, LeaseError> {
        let meta = self.lease_keys().buckets().meta;
        let op = "bind_buckets";
        let value = self
            .eval(&scripts::BUCKET_BIND, &Call::new([&meta]).arg(count.get()))
            .await
            .map_err(|e| lease_err(op, &meta, e))?;
        let parts = reply::array(op, value).map_err(|e| lease_reply_err(op, &meta, e))?;
        let recorded = reply::string(op, reply::at(op, &parts, 0).map_err(|e| lease_reply_err(op, &meta, e))?)
            .map_err(|e| lease_reply_err(op, &meta, e))?;
        let now = reply::int(op, reply::at(op, &parts, 1).map_err(|e| lease_reply_err(op, &meta, e))?)
            .map_err(|e| lease_reply_err(op, &meta, e))?;
        let corrupt = || LeaseError::Corrupt { key: meta.clone(), detail: format!("bucket count {recorded:?}") };
        let count = BucketCount::new(recorded.parse().map_err(|_| corrupt())?).map_err(|_| corrupt())?;
        Ok(BucketBinding { count, recorded_now: now == 1 })
    }

    async fn add_weight(&self, bucket: BucketId, delta: i64) -> Result<u64, LeaseError> {
        let weights = self.weights_call("add_weight", "add", &[(bucket, delta)]).await?;
        weights.first().copied().ok_or_else(|| LeaseError::Corrupt {
            key: bucket.to_string(),
            detail: "add_weight answered nothing".to_owned(),
        })
    }

    async fn set_weights(&self, weights: &[(BucketId, u64)]) -> Result<(), LeaseError> {
        // A few thousand buckets per call at most keeps each script short.
        for chunk in weights.chunks(1024) {
            let pairs: Vec<(BucketId, i64)> =
                chunk.iter().map(|(b, w)| (*b, i64::try_from(*w).unwrap_or(i64::MAX))).collect();
            self.weights_call("set_weights", "set", &pairs).await?;
        }
        Ok(())
    }

    async fn subscribe_bucket_changes(&self) -> Result<BucketChanges, LeaseError> {
        let rx = self.inner.bucket_changes.subscribe().await.map_err(|detail| LeaseError::Backend {
            op: "subscribe_bucket_changes",
            key: self.lease_keys().bucket_change_channel().to_owned(),
            source: detail.into(),
        })?;
        Ok(BucketChanges::new(rx))
    }

    async fn join(&self, owner: &WorkerId, ttl: Ttl) -> Result<(), LeaseError> {
        let k = self.lease_keys().buckets();
        let call = Call::new([&k.workers, &k.loads]).arg(owner.as_str()).arg(ttl.as_millis());
        self.eval(&scripts::BUCKET_JOIN, &call).await.map_err(|e| lease_err("join", owner.as_str(), e))?;
        Ok(())
    }

    async fn tick(
        &self,
        owner: &WorkerId,
        held: &[BucketLease],
        ttl: Ttl,
        policy: &BalancePolicy,
    ) -> Result<BucketTick, LeaseError> {
        let k = self.lease_keys().buckets();
        let mut call =
            Call::new([&k.meta, &k.weights, &k.fences, &k.owners, &k.expiry, &k.workers, &k.loads, &k.versions])
                .arg(owner.as_str())
                .arg(ttl.as_millis())
                .arg(policy.slack_pct())
                .arg(policy.max_claims())
                .arg(policy.max_sheds());
        for lease in held {
            call.push(lease.bucket.0);
            call.push(lease.token.0);
        }
        let op = "tick";
        let err = |e| lease_reply_err(op, owner.as_str(), e);
        let value = self.eval(&scripts::BUCKET_TICK, &call).await.map_err(|e| lease_err(op, owner.as_str(), e))?;
        let mut parts = reply::array(op, value).map_err(err)?.into_iter();
        let mut next = || parts.next().ok_or_else(|| err(ReplyError::new(op, "fewer than 6 parts")));
        let figures = uints(op, next()?).map_err(err)?;
        let flags = uints(op, next()?).map_err(err)?;
        let claimed = uints(op, next()?).map_err(err)?;
        let shed = uints(op, next()?).map_err(err)?;
        let versions = uints(op, next()?).map_err(err)?;
        let soonest = uints(op, next()?).map_err(err)?;
        let [workers, total_weight, load, cap] = figures[..] else {
            return Err(err(ReplyError::new(op, format!("{} figures, not 4", figures.len()))));
        };
        if flags.len() != held.len() {
            return Err(err(ReplyError::new(op, format!("{} answers for {} leases", flags.len(), held.len()))));
        }
        let soonest_expiry = soonest.first().map(|ms| std::time::Duration::from_millis(*ms));
        let mut tick = BucketTick { workers, total_weight, load, cap, soonest_expiry, ..BucketTick::default() };
        for (lease, flag) in held.iter().zip(flags) {
            if flag == 1 { &mut tick.kept } else { &mut tick.lost }.push(lease.clone());
        }
        for pair in claimed.chunks(2) {
            let [bucket, token] = pair[..] else { return Err(err(ReplyError::new(op, "an odd claimed list"))) };
            tick.claimed.push(lease(bucket, owner, token).map_err(err)?);
        }
        for bucket in shed {
            if let Some(lease) = tick.kept.iter().find(|l| u64::from(l.bucket.0) == bucket) {
                tick.shed.push(lease.clone());
            }
        }
        let buckets: Vec<BucketId> = tick.kept.iter().chain(&tick.claimed).map(|l| l.bucket).collect();
        if buckets.len() != versions.len() {
            return Err(err(ReplyError::new(
                op,
                format!("{} change counts for {} buckets", versions.len(), buckets.len()),
            )));
        }
        tick.versions = buckets.into_iter().zip(versions).collect();
        Ok(tick)
    }

    async fn release_buckets(&self, leases: &[BucketLease]) -> Result<Vec<bool>, LeaseError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        self.release_call("", leases).await
    }

    async fn leave(&self, owner: &WorkerId, held: &[BucketLease]) -> Result<(), LeaseError> {
        self.release_call(owner.as_str(), held).await.map(|_| ())
    }

    async fn bucket_holder(&self, bucket: BucketId) -> Result<Option<BucketLease>, LeaseError> {
        let k = self.lease_keys().buckets();
        let label = bucket.to_string();
        let value = self
            .eval(&scripts::BUCKET_HOLDER, &Call::new([&k.owners, &k.expiry]).arg(bucket.0))
            .await
            .map_err(|e| lease_err("bucket_holder", &label, e))?;
        let Some(raw) =
            reply::opt_string("bucket_holder", &value).map_err(|e| lease_reply_err("bucket_holder", &label, e))?
        else {
            return Ok(None);
        };
        let corrupt =
            || LeaseError::Corrupt { key: label.clone(), detail: format!("owner {raw:?} is not \"owner token\"") };
        let (owner, token) = raw.rsplit_once(' ').ok_or_else(corrupt)?;
        let owner = WorkerId::new(owner).map_err(|_| corrupt())?;
        Ok(Some(BucketLease { bucket, owner, token: FencingToken(token.parse().map_err(|_| corrupt())?) }))
    }

    async fn weight(&self, bucket: BucketId) -> Result<u64, LeaseError> {
        let label = bucket.to_string();
        let mut cmd = redis::cmd("HGET");
        cmd.arg(self.lease_keys().buckets().weights).arg(bucket.0);
        let value: Value = cmd.query_async(&mut self.conn()).await.map_err(|e| lease_err("weight", &label, e))?;
        match reply::opt_string("weight", &value).map_err(|e| lease_reply_err("weight", &label, e))? {
            None => Ok(0),
            Some(raw) => raw.parse().map_err(|_| LeaseError::Corrupt { key: label, detail: format!("weight {raw:?}") }),
        }
    }

    async fn raise_bucket_token(&self, bucket: BucketId, past: FencingToken) -> Result<(), LeaseError> {
        let label = bucket.to_string();
        let fences = self.lease_keys().buckets().fences;
        self.eval(&scripts::BUCKET_RAISE_TOKEN, &Call::new([&fences]).arg(bucket.0).arg(past.0))
            .await
            .map_err(|e| lease_err("raise_bucket_token", &label, e))?;
        Ok(())
    }
}
