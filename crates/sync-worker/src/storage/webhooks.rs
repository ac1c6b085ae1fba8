//! Webhooks and their deliveries (see `migrations/0500_webhooks.sql`).
//!
//! * The API adds, lists, removes and resumes a user's webhooks.
//! * A fenced write ([`super::FencedTx::commit`]) records, in its own
//!   transaction, one delivery per (webhook, event) of the account's user:
//!   the outbox. A paused webhook's deliveries are recorded as held.
//! * The worker's dispatcher ([`crate::webhooks`]) reads open batches,
//!   reads one delivery to attempt it, and records each attempt's outcome.

use leasehold_core::UserId;
use sqlx::{Any, Row, Transaction};

use super::{corrupt, now_ms, query_err, MessageKey, Storage, StorageError};
use crate::events::MailEventKind;

/// Deliveries per multi-row INSERT (8 columns each).
const OUTBOX_CHUNK: usize = 100;

/// What happened to a delivery so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Not delivered yet: being attempted, or waiting for its next attempt.
    Pending,
    /// The receiver answered 2xx.
    Delivered,
    /// Every attempt the retry budget allows failed.
    Failed,
    /// Its webhook is paused: it waits, unsent, until the webhook is resumed.
    Held,
}

impl DeliveryState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
            DeliveryState::Held => "held",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => DeliveryState::Pending,
            "delivered" => DeliveryState::Delivered,
            "failed" => DeliveryState::Failed,
            "held" => DeliveryState::Held,
            _ => return None,
        })
    }
}

/// A webhook as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookRecord {
    /// Its id (a UUID).
    pub id: String,
    /// Where events are POSTed.
    pub url: String,
    /// The events it receives.
    pub events: Vec<MailEventKind>,
    /// When it was made (ms since the epoch).
    pub created_at: i64,
    /// When it was paused, if it is.
    pub paused_at: Option<i64>,
    /// Why it was paused.
    pub paused_reason: Option<String>,
    /// The last 2xx answer (ms since the epoch).
    pub last_success_at: Option<i64>,
    /// The last failed attempt (ms since the epoch).
    pub last_failure_at: Option<i64>,
    /// The last failed attempt's error.
    pub last_error: Option<String>,
    /// Deliveries not yet delivered (pending or held).
    pub undelivered: i64,
}

/// One delivery, as the dispatcher attempts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryJob {
    /// The delivery's id (its unit id).
    pub id: String,
    /// Its webhook.
    pub webhook_id: String,
    /// The webhook's URL.
    pub url: String,
    /// The webhook's signing secret (decrypted).
    pub secret: String,
    /// The event's id.
    pub event_id: String,
    /// The event's name.
    pub event: String,
    /// The JSON body to send.
    pub body: String,
    /// What happened to it so far.
    pub state: DeliveryState,
    /// Whether its webhook is paused.
    pub paused: bool,
    /// Attempts so far.
    pub attempts: i64,
    /// The batch (queue run) it belongs to now: a resume moves it to a new one.
    pub run_id: String,
}

/// One delivery, as the API lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct DeliveryRecord {
    /// The delivery's id (the `X-Webhook-Delivery` header).
    pub id: String,
    /// The event's id (in the body and the `X-Webhook-Event-Id` header).
    pub event_id: String,
    /// The event's name.
    pub event: String,
    /// What happened to it so far.
    pub state: DeliveryState,
    /// Attempts so far.
    pub attempts: i64,
    /// The receiver's last HTTP status, if it answered.
    pub last_status: Option<i64>,
    /// The last failed attempt's error.
    pub last_error: Option<String>,
    /// When the event happened (ms since the epoch).
    pub created_at: i64,
    /// When it was delivered or given up on (ms since the epoch).
    pub finished_at: Option<i64>,
}

/// How one attempt went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// The receiver answered 2xx with this status.
    Delivered {
        /// The status.
        status: u16,
    },
    /// It did not: a status outside 2xx, or no answer.
    Failed {
        /// The status, if the receiver answered.
        status: Option<u16>,
        /// What went wrong, in words.
        error: String,
    },
}

fn event_names(events: &[MailEventKind]) -> String {
    events.iter().map(|e| e.as_str()).collect::<Vec<_>>().join(" ")
}

fn parse_events(id: &str, stored: &str) -> Result<Vec<MailEventKind>, StorageError> {
    stored
        .split(' ')
        .filter(|s| !s.is_empty())
        .map(|name| MailEventKind::parse(name).ok_or_else(|| corrupt(id, "webhook event", name)))
        .collect()
}

const WEBHOOK_COLUMNS: &str = "w.id, w.url, w.events, w.created_at, w.paused_at, w.paused_reason, \
    w.last_success_at, w.last_failure_at, w.last_error, \
    (SELECT COUNT(*) FROM webhook_deliveries d WHERE d.webhook_id = w.id AND d.state IN ('pending', 'held'))";

fn webhook_of(row: &sqlx::any::AnyRow) -> Result<WebhookRecord, StorageError> {
    let get = |e| query_err(format!("read a webhook's {e}"));
    let id: String = row.try_get(0).map_err(get("id"))?;
    let events: String = row.try_get(2).map_err(get("events"))?;
    Ok(WebhookRecord {
        events: parse_events(&id, &events)?,
        url: row.try_get(1).map_err(get("url"))?,
        created_at: row.try_get(3).map_err(get("creation time"))?,
        paused_at: row.try_get(4).map_err(get("pause time"))?,
        paused_reason: row.try_get(5).map_err(get("pause reason"))?,
        last_success_at: row.try_get(6).map_err(get("last success"))?,
        last_failure_at: row.try_get(7).map_err(get("last failure"))?,
        last_error: row.try_get(8).map_err(get("last error"))?,
        undelivered: row.try_get(9).map_err(get("undelivered count"))?,
        id,
    })
}

impl Storage {
    /// Adds a webhook of `user`'s; `secret` is stored sealed.
    pub async fn add_webhook(
        &self,
        user: &UserId,
        url: &str,
        events: &[MailEventKind],
        secret: &str,
    ) -> Result<WebhookRecord, StorageError> {
        let id = uuid::Uuid::new_v4().to_string();
        let sealed = self.secret.seal(&format!("webhook:{id}"), secret);
        sqlx::query(
            "INSERT INTO webhooks (id, user_id, url, events, secret, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&id)
        .bind(user.as_str())
        .bind(url)
        .bind(event_names(events))
        .bind(sealed)
        .bind(now_ms())
        .execute(&self.pool)
        .await
        .map_err(query_err(format!("add a webhook of user {user}")))?;
        self.webhook(user, &id).await?.ok_or(StorageError::NotFound { what: "webhook", key: id })
    }

    /// `user`'s webhooks, oldest first.
    pub async fn webhooks(&self, user: &UserId) -> Result<Vec<WebhookRecord>, StorageError> {
        // Constant columns; the values are bound.
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {WEBHOOK_COLUMNS} FROM webhooks w WHERE w.user_id = $1 ORDER BY w.created_at, w.id"
        )))
        .bind(user.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(query_err(format!("list the webhooks of user {user}")))?;
        rows.iter().map(webhook_of).collect()
    }

    /// Webhook `id` of `user`'s; `None` when it does not exist or is another user's.
    pub async fn webhook(&self, user: &UserId, id: &str) -> Result<Option<WebhookRecord>, StorageError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {WEBHOOK_COLUMNS} FROM webhooks w WHERE w.id = $1 AND w.user_id = $2"
        )))
        .bind(id)
        .bind(user.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(query_err(format!("read webhook {id}")))?;
        row.as_ref().map(webhook_of).transpose()
    }

    /// Removes webhook `id` of `user`'s and its deliveries; `false` when it
    /// does not exist or is another user's. A delivery of it being attempted
    /// finds its row gone and is dropped without a POST.
    pub async fn remove_webhook(&self, user: &UserId, id: &str) -> Result<bool, StorageError> {
        let gone = sqlx::query("DELETE FROM webhooks WHERE id = $1 AND user_id = $2")
            .bind(id)
            .bind(user.as_str())
            .execute(&self.pool)
            .await
            .map_err(query_err(format!("remove webhook {id}")))?
            .rows_affected();
        Ok(gone > 0)
    }

    /// Resumes webhook `id` of `user`'s: clears the pause and puts its held
    /// and failed deliveries into a new batch, to be attempted again with a
    /// fresh retry budget. `None` when it does not exist or is another user's.
    pub async fn resume_webhook(&self, user: &UserId, id: &str) -> Result<Option<WebhookRecord>, StorageError> {
        let mut tx = self.pool.begin().await.map_err(query_err(format!("begin resuming webhook {id}")))?;
        let found =
            sqlx::query("UPDATE webhooks SET paused_at = NULL, paused_reason = NULL WHERE id = $1 AND user_id = $2")
                .bind(id)
                .bind(user.as_str())
                .execute(&mut *tx)
                .await
                .map_err(query_err(format!("resume webhook {id}")))?
                .rows_affected();
        if found == 0 {
            return Ok(None);
        }
        let run = new_batch(&mut tx).await?;
        sqlx::query(
            "UPDATE webhook_deliveries SET run_id = $1, state = 'pending', attempts = 0, finished_at = NULL \
             WHERE webhook_id = $2 AND state IN ('held', 'failed')",
        )
        .bind(&run)
        .bind(id)
        .execute(&mut *tx)
        .await
        .map_err(query_err(format!("requeue the held deliveries of webhook {id}")))?;
        tx.commit().await.map_err(query_err(format!("commit resuming webhook {id}")))?;
        self.webhook(user, id).await
    }

    /// The latest `limit` deliveries of webhook `id` (which the caller has
    /// checked is the user's), newest first.
    pub async fn webhook_deliveries(&self, id: &str, limit: u32) -> Result<Vec<DeliveryRecord>, StorageError> {
        let rows = sqlx::query(
            "SELECT id, event_id, event, state, attempts, last_status, last_error, created_at, finished_at \
             FROM webhook_deliveries WHERE webhook_id = $1 ORDER BY created_at DESC, id LIMIT $2",
        )
        .bind(id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(query_err(format!("list the deliveries of webhook {id}")))?;
        rows.iter()
            .map(|row| {
                let get = |e| query_err(format!("read a delivery's {e} of webhook {id}"));
                let state: String = row.try_get(3).map_err(get("state"))?;
                Ok(DeliveryRecord {
                    id: row.try_get(0).map_err(get("id"))?,
                    event_id: row.try_get(1).map_err(get("event id"))?,
                    event: row.try_get(2).map_err(get("event"))?,
                    state: DeliveryState::parse(&state).ok_or_else(|| corrupt(id, "delivery state", &state))?,
                    attempts: row.try_get(4).map_err(get("attempts"))?,
                    last_status: row.try_get(5).map_err(get("last status"))?,
                    last_error: row.try_get(6).map_err(get("last error"))?,
                    created_at: row.try_get(7).map_err(get("creation time"))?,
                    finished_at: row.try_get(8).map_err(get("finish time"))?,
                })
            })
            .collect()
    }

    /// Up to `limit` batches with a delivery that may still be attempted, oldest first.
    pub async fn open_webhook_batches(&self, limit: u32) -> Result<Vec<String>, StorageError> {
        let rows =
            sqlx::query("SELECT run_id FROM webhook_batches WHERE done = 0 ORDER BY created_at, run_id LIMIT $1")
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await
                .map_err(query_err("list the open webhook batches"))?;
        rows.iter().map(|r| r.try_get(0).map_err(query_err("read a webhook batch"))).collect()
    }

    /// The deliveries of batch `run`, in the order they were recorded.
    pub async fn webhook_batch_units(&self, run: &str) -> Result<Vec<String>, StorageError> {
        let rows = sqlx::query("SELECT id FROM webhook_deliveries WHERE run_id = $1 ORDER BY created_at, id")
            .bind(run)
            .fetch_all(&self.pool)
            .await
            .map_err(query_err(format!("list the deliveries of webhook batch {run}")))?;
        rows.iter().map(|r| r.try_get(0).map_err(query_err(format!("read a delivery of batch {run}")))).collect()
    }

    /// Marks batch `run` done: none of its deliveries will be attempted
    /// again, and one still pending (its worker died between the queue's
    /// last word and this row's) is recorded as failed.
    pub async fn finish_webhook_batch(&self, run: &str) -> Result<(), StorageError> {
        let mut tx = self.pool.begin().await.map_err(query_err(format!("begin finishing webhook batch {run}")))?;
        sqlx::query(
            "UPDATE webhook_deliveries SET state = 'failed', finished_at = $1 WHERE run_id = $2 AND state = 'pending'",
        )
        .bind(now_ms())
        .bind(run)
        .execute(&mut *tx)
        .await
        .map_err(query_err(format!("fail what is left of webhook batch {run}")))?;
        sqlx::query("UPDATE webhook_batches SET done = 1 WHERE run_id = $1")
            .bind(run)
            .execute(&mut *tx)
            .await
            .map_err(query_err(format!("finish webhook batch {run}")))?;
        tx.commit().await.map_err(query_err(format!("commit finishing webhook batch {run}")))
    }

    /// Deletes done batches (and their deliveries) recorded before `before_ms`.
    pub async fn prune_webhook_batches(&self, before_ms: i64) -> Result<u64, StorageError> {
        Ok(sqlx::query("DELETE FROM webhook_batches WHERE done = 1 AND created_at < $1")
            .bind(before_ms)
            .execute(&self.pool)
            .await
            .map_err(query_err("prune old webhook batches"))?
            .rows_affected())
    }

    /// Delivery `id` with its webhook's URL, secret and pause; `None` when it
    /// (or its webhook) was removed.
    pub async fn delivery_job(&self, id: &str) -> Result<Option<DeliveryJob>, StorageError> {
        let row = sqlx::query(
            "SELECT d.webhook_id, w.url, w.secret, d.event_id, d.event, d.body, d.state, w.paused_at, d.attempts, d.run_id \
             FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id WHERE d.id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(query_err(format!("read webhook delivery {id}")))?;
        let Some(row) = row else { return Ok(None) };
        let get = |e| query_err(format!("read the {e} of webhook delivery {id}"));
        let webhook_id: String = row.try_get(0).map_err(get("webhook"))?;
        let sealed: String = row.try_get(2).map_err(get("secret"))?;
        let state: String = row.try_get(6).map_err(get("state"))?;
        let paused_at: Option<i64> = row.try_get(7).map_err(get("pause"))?;
        Ok(Some(DeliveryJob {
            id: id.to_string(),
            url: row.try_get(1).map_err(get("URL"))?,
            secret: self.secret.open(&format!("webhook:{webhook_id}"), &sealed)?,
            webhook_id,
            event_id: row.try_get(3).map_err(get("event id"))?,
            event: row.try_get(4).map_err(get("event"))?,
            body: row.try_get(5).map_err(get("body"))?,
            state: DeliveryState::parse(&state).ok_or_else(|| corrupt(id, "delivery state", &state))?,
            paused: paused_at.is_some(),
            attempts: row.try_get(8).map_err(get("attempts"))?,
            run_id: row.try_get(9).map_err(get("batch"))?,
        }))
    }

    /// Records attempts of deliveries, each `(webhook, delivery, outcome)`,
    /// in one transaction (the dispatcher's group commit: on SQLite every
    /// commit waits for the disk, so one per POST would bound deliveries to
    /// the disk's commit rate). A 2xx delivers a delivery; a failure counts
    /// the attempt and leaves it pending. Each webhook's last success or
    /// failure is its latest attempt's in the list.
    pub async fn record_delivery_attempts(
        &self,
        attempts: &[(String, String, AttemptOutcome)],
    ) -> Result<(), StorageError> {
        if attempts.is_empty() {
            return Ok(());
        }
        let now = now_ms();
        let n = attempts.len();
        let mut tx = self.pool.begin().await.map_err(query_err(format!("begin recording {n} delivery attempts")))?;
        let mut latest: std::collections::BTreeMap<&str, &AttemptOutcome> = std::collections::BTreeMap::new();
        for (webhook, id, outcome) in attempts {
            latest.insert(webhook, outcome);
            let q = match outcome {
                AttemptOutcome::Delivered { status } => sqlx::query(
                    "UPDATE webhook_deliveries SET state = 'delivered', attempts = attempts + 1, last_status = $1, \
                     finished_at = $2 WHERE id = $3",
                )
                .bind(i64::from(*status))
                .bind(now),
                AttemptOutcome::Failed { status, error } => sqlx::query(
                    "UPDATE webhook_deliveries SET attempts = attempts + 1, last_status = $1, last_error = $2 \
                     WHERE id = $3",
                )
                .bind(status.map(i64::from))
                .bind(error.as_str()),
            };
            q.bind(id.as_str())
                .execute(&mut *tx)
                .await
                .map_err(query_err(format!("record an attempt of delivery {id}")))?;
        }
        for (webhook, outcome) in latest {
            let q = match outcome {
                AttemptOutcome::Delivered { .. } => {
                    sqlx::query("UPDATE webhooks SET last_success_at = $1 WHERE id = $2").bind(now)
                }
                AttemptOutcome::Failed { error, .. } => {
                    sqlx::query("UPDATE webhooks SET last_failure_at = $1, last_error = $2 WHERE id = $3")
                        .bind(now)
                        .bind(error.as_str())
                }
            };
            q.bind(webhook)
                .execute(&mut *tx)
                .await
                .map_err(query_err(format!("record the last attempt of webhook {webhook}")))?;
        }
        tx.commit().await.map_err(query_err(format!("commit recording {n} delivery attempts")))
    }

    /// Gives delivery `id` up as `state` (failed, or held while its webhook
    /// is paused); with `pause`, pauses its webhook for that reason.
    pub async fn end_delivery(
        &self,
        webhook: &str,
        id: &str,
        state: DeliveryState,
        pause: Option<&str>,
    ) -> Result<(), StorageError> {
        let mut tx = self.pool.begin().await.map_err(query_err(format!("begin ending delivery {id}")))?;
        sqlx::query("UPDATE webhook_deliveries SET state = $1, finished_at = $2 WHERE id = $3 AND state = 'pending'")
            .bind(state.as_str())
            .bind(now_ms())
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(query_err(format!("record delivery {id} {}", state.as_str())))?;
        if let Some(reason) = pause {
            sqlx::query("UPDATE webhooks SET paused_at = $1, paused_reason = $2 WHERE id = $3 AND paused_at IS NULL")
                .bind(now_ms())
                .bind(reason)
                .bind(webhook)
                .execute(&mut *tx)
                .await
                .map_err(query_err(format!("pause webhook {webhook}")))?;
        }
        tx.commit().await.map_err(query_err(format!("commit ending delivery {id}")))
    }
}

/// Starts a new batch in `tx`; its id is the run id of its unit-queue run.
async fn new_batch(tx: &mut Transaction<'static, Any>) -> Result<String, StorageError> {
    let run = format!("webhooks-{}", uuid::Uuid::new_v4().simple());
    sqlx::query("INSERT INTO webhook_batches (run_id, created_at) VALUES ($1, $2)")
        .bind(&run)
        .bind(now_ms())
        .execute(&mut **tx)
        .await
        .map_err(query_err("start a webhook batch"))?;
    Ok(run)
}

/// The id of event `e` of `account`. A message is new once and deleted
/// once, so those events' ids are derived from the message: a batch stored
/// again (a poll that overlapped another, a new owner) announces the same
/// event with the same id, and its delivery, whose id is derived from the
/// webhook and the event, is recorded once. Each flag change is an event
/// of its own.
fn event_id(account: &str, e: &OutboxEvent<'_>) -> String {
    match e.kind {
        MailEventKind::Updated => uuid::Uuid::new_v4().to_string(),
        kind => digest_id(&[account, kind.as_str(), e.folder, &e.uidvalidity.to_string(), &e.uid.to_string()]),
    }
}

/// A UUID-shaped id derived from `parts` (SHA-256, each part length-prefixed).
fn digest_id(parts: &[&str]) -> String {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Uuid::from_bytes(bytes).to_string()
}

/// One event a fenced write announces.
pub(super) struct OutboxEvent<'a> {
    pub kind: MailEventKind,
    pub folder: &'a str,
    pub uidvalidity: u32,
    pub uid: u32,
}

/// A webhook as the outbox needs it: the events it takes, its id, whether it is paused.
pub(super) struct OutboxHook {
    kinds: Vec<MailEventKind>,
    id: String,
    paused: bool,
}

/// The user of `account` and that user's webhooks, in one round trip of
/// the fenced write `tx` (every commit that announces something reads them).
pub(super) async fn user_and_webhooks(
    tx: &mut Transaction<'static, Any>,
    account: &str,
) -> Result<(String, Vec<OutboxHook>), StorageError> {
    let rows = sqlx::query(
        "SELECT a.user_id, w.id, w.events, w.paused_at FROM accounts a \
         LEFT JOIN webhooks w ON w.user_id = a.user_id WHERE a.id = $1",
    )
    .bind(account)
    .fetch_all(&mut **tx)
    .await
    .map_err(query_err(format!("read the user and webhooks of {account}")))?;
    let get = |e| query_err(format!("read the {e} of account {account}'s webhooks"));
    let Some(first) = rows.first() else {
        return Err(StorageError::NotFound { what: "account", key: account.to_string() });
    };
    let user: String = first.try_get(0).map_err(get("user"))?;
    let mut hooks = Vec::with_capacity(rows.len());
    for row in &rows {
        let Some(id) = row.try_get::<Option<String>, _>(1).map_err(get("id"))? else { continue };
        let names: String = row.try_get(2).map_err(get("events"))?;
        let paused: Option<i64> = row.try_get(3).map_err(get("pause"))?;
        hooks.push(OutboxHook { kinds: parse_events(&id, &names)?, id, paused: paused.is_some() });
    }
    Ok((user, hooks))
}

/// Records, in the fenced write `tx` of `account`, one delivery per event
/// and webhook in `hooks` that takes it (held for a paused webhook).
/// Writes nothing when no webhook takes these events.
pub(super) async fn record_outbox(
    tx: &mut Transaction<'static, Any>,
    account: &str,
    hooks: &[OutboxHook],
    events: &[OutboxEvent<'_>],
) -> Result<(), StorageError> {
    if !hooks.iter().any(|h| events.iter().any(|e| h.kinds.contains(&e.kind))) {
        return Ok(());
    }
    let run = new_batch(tx).await?;
    let now = now_ms();
    let mut deliveries = Vec::new();
    for e in events {
        let event_id = event_id(account, e);
        let message_id = MessageKey { folder: e.folder.to_string(), uidvalidity: e.uidvalidity, uid: e.uid }.encode();
        for OutboxHook { kinds, id: webhook, paused } in hooks {
            if !kinds.contains(&e.kind) {
                continue;
            }
            let body = serde_json::json!({
                "id": event_id,
                "type": e.kind.as_str(),
                "created_at": now,
                "webhook_id": webhook,
                "account_id": account,
                "data": {
                    "message_id": message_id,
                    "folder": e.folder,
                    "uidvalidity": e.uidvalidity,
                    "uid": e.uid,
                },
            });
            let state = if *paused { DeliveryState::Held } else { DeliveryState::Pending };
            deliveries.push((
                digest_id(&[webhook, &event_id]),
                webhook.as_str(),
                event_id.clone(),
                e.kind,
                body,
                state,
            ));
        }
    }
    for chunk in deliveries.chunks(OUTBOX_CHUNK) {
        let mut sql = String::from(
            "INSERT INTO webhook_deliveries (id, run_id, webhook_id, event_id, event, body, created_at, state) VALUES ",
        );
        let tail = " ON CONFLICT (id) DO NOTHING";
        for i in 0..chunk.len() {
            let p = i * 8;
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&format!(
                "(${}, ${}, ${}, ${}, ${}, ${}, ${}, ${})",
                p + 1,
                p + 2,
                p + 3,
                p + 4,
                p + 5,
                p + 6,
                p + 7,
                p + 8
            ));
        }
        sql.push_str(tail);
        // Only placeholders are spliced in; every value is bound.
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (id, webhook, event_id, kind, body, state) in chunk {
            q = q
                .bind(id.as_str())
                .bind(run.as_str())
                .bind(*webhook)
                .bind(event_id.as_str())
                .bind(kind.as_str())
                .bind(body.to_string())
                .bind(now)
                .bind(state.as_str());
        }
        q.execute(&mut **tx).await.map_err(query_err(format!("record the webhook deliveries of {account}")))?;
    }
    Ok(())
}
