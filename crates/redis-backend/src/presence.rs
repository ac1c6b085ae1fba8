//! [`Presence`] on Redis: a key's tier is a string beside its lease (the
//! claim and drop scripts set and delete it), and a user's presence is a
//! key with a TTL plus a `PUBLISH` on the `user.active` channel.

use async_trait::async_trait;
use leasehold_core::{LeaseError, LeaseKey, Presence, Tier, Ttl, UserActiveSubscription, UserId};

use crate::conn::Call;
use crate::reply::{self, ReplyError};
use crate::scripts;
use crate::store::{lease_err, lease_reply_err, RedisStore};

#[async_trait]
impl Presence for RedisStore {
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
        let rx = self.inner.user_active.subscribe().await.map_err(|detail| LeaseError::Backend {
            op: "subscribe_user_active",
            key: self.lease_keys().user_active_channel().to_owned(),
            source: detail.into(),
        })?;
        Ok(UserActiveSubscription::new(rx))
    }
}
