//! Folder state and messages: what the engine reads, and the fenced
//! transaction through which it writes.

use std::borrow::Cow;

use leasehold_core::{FencingToken, LeaseKey};
use sqlx::{Any, Row, Transaction};

use super::webhooks::{record_outbox, user_and_webhooks, OutboxEvent};
use super::{now_ms, query_err, DbKind, Storage, StorageError};
use crate::events::{AccountChanged, EventSink, MailEvent, MailEventKind, SyncEvent};
use crate::source::Fence;

/// Rows per multi-row INSERT: 13 columns each stays far below SQLite's and
/// Postgres's parameter limits.
const INSERT_CHUNK: usize = 100;
/// The same on Postgres: a whole new-mail batch (6,500 parameters of its
/// 65,535).
const INSERT_CHUNK_POSTGRES: usize = 500;
/// UIDs per `IN (...)` list.
const DELETE_CHUNK: usize = 500;

/// The stored sync state of one folder (for its current UIDVALIDITY).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FolderState {
    /// The folder's UIDVALIDITY when it was last synced.
    pub uidvalidity: u32,
    /// Every message with a UID up to this one is stored.
    pub last_uid: u32,
    /// The server's UIDNEXT when every message below it was stored.
    pub uidnext: Option<u32>,
    /// Every change up to this HIGHESTMODSEQ is stored (CONDSTORE servers).
    pub highestmodseq: Option<u64>,
}

/// One message as stored.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MessageRow {
    /// Its UID.
    pub uid: u32,
    /// INTERNALDATE, ms since the epoch.
    pub internal_date: Option<i64>,
    /// RFC822.SIZE.
    pub size: Option<i64>,
    /// Its flags, space-separated, sorted.
    pub flags: String,
    /// The Message-ID header.
    pub message_id: Option<String>,
    /// The subject.
    pub subject: Option<String>,
    /// The first sender.
    pub from_addr: Option<String>,
    /// The recipients, comma-separated.
    pub to_addrs: Option<String>,
    /// The raw header.
    pub header: Option<String>,
    /// The start of the text body.
    pub preview: Option<String>,
}

fn uid_of(v: i64, account: &str, field: &'static str) -> Result<u32, StorageError> {
    u32::try_from(v).map_err(|_| StorageError::Corrupt { account: account.into(), field, value: v.to_string() })
}

/// `text` as both databases store it: Postgres refuses a NUL in text (and
/// with it the whole batch), and real mail has NULs in headers, so each
/// becomes U+FFFD.
pub(crate) fn storable_text(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(text)
    }
}

impl Storage {
    /// The stored state of `folder`, `None` before its first sync.
    pub async fn folder_state(&self, account: &LeaseKey, folder: &str) -> Result<Option<FolderState>, StorageError> {
        let a = account.as_str();
        let row = sqlx::query(
            "SELECT uidvalidity, last_uid, uidnext, highestmodseq FROM folders WHERE account_id = $1 AND name = $2",
        )
        .bind(a)
        .bind(folder)
        .fetch_optional(&self.pool)
        .await
        .map_err(query_err(format!("read state of {a}/{folder}")))?;
        let Some(row) = row else { return Ok(None) };
        let get = |c| query_err(format!("read {c} of {a}/{folder}"));
        let Some(uidvalidity) = row.try_get::<Option<i64>, _>(0).map_err(get("uidvalidity"))? else {
            return Ok(None);
        };
        let uidnext: Option<i64> = row.try_get(2).map_err(get("uidnext"))?;
        let modseq: Option<i64> = row.try_get(3).map_err(get("highestmodseq"))?;
        Ok(Some(FolderState {
            uidvalidity: uid_of(uidvalidity, a, "uidvalidity")?,
            last_uid: uid_of(row.try_get(1).map_err(get("last_uid"))?, a, "last_uid")?,
            uidnext: uidnext.map(|v| uid_of(v, a, "uidnext")).transpose()?,
            highestmodseq: modseq.map(|v| v as u64),
        }))
    }

    /// The UIDs stored for `folder` under `uidvalidity`, ascending.
    pub async fn stored_uids(
        &self,
        account: &LeaseKey,
        folder: &str,
        uidvalidity: u32,
    ) -> Result<Vec<u32>, StorageError> {
        let a = account.as_str();
        let rows = sqlx::query(
            "SELECT uid FROM messages WHERE account_id = $1 AND folder = $2 AND uidvalidity = $3 ORDER BY uid",
        )
        .bind(a)
        .bind(folder)
        .bind(i64::from(uidvalidity))
        .fetch_all(&self.pool)
        .await
        .map_err(query_err(format!("list UIDs of {a}/{folder}")))?;
        rows.iter().map(|r| uid_of(r.try_get(0).map_err(query_err("read uid"))?, a, "uid")).collect()
    }

    /// How many messages are stored for `folder` under `uidvalidity`.
    pub async fn message_count(&self, account: &LeaseKey, folder: &str, uidvalidity: u32) -> Result<u64, StorageError> {
        let a = account.as_str();
        let row =
            sqlx::query("SELECT COUNT(*) FROM messages WHERE account_id = $1 AND folder = $2 AND uidvalidity = $3")
                .bind(a)
                .bind(folder)
                .bind(i64::from(uidvalidity))
                .fetch_one(&self.pool)
                .await
                .map_err(query_err(format!("count messages of {a}/{folder}")))?;
        let n: i64 = row.try_get(0).map_err(query_err("read count"))?;
        Ok(n.max(0) as u64)
    }

    /// Opens a write transaction for the account of `fence`: checks that no
    /// newer token has written and records this one, as its first statement
    /// (see the [module docs](super)). Nothing is written unless the
    /// returned transaction is committed.
    pub async fn write(&self, fence: &Fence) -> Result<FencedTx, StorageError> {
        let a = fence.account.as_str();
        // Checked here, so between FETCH batches, and again before the commit.
        if fence.deadline.passed() {
            return Err(StorageError::LeaseExpired { account: fence.account.clone(), token: fence.token });
        }
        let mut tx = self.pool.begin().await.map_err(query_err(format!("begin a write of {a}")))?;
        let token = fence.token.0 as i64;
        let advanced =
            sqlx::query("UPDATE accounts SET fence_token = $1, fence_owner = $2 WHERE id = $3 AND fence_token <= $1")
                .bind(token)
                .bind(fence.worker.as_str())
                .bind(a)
                .execute(&mut *tx)
                .await
                .map_err(query_err(format!("check the fencing token of {a}")))?
                .rows_affected();
        if advanced == 0 {
            let current = sqlx::query("SELECT fence_token FROM accounts WHERE id = $1")
                .bind(a)
                .fetch_optional(&mut *tx)
                .await
                .map_err(query_err(format!("read the fencing token of {a}")))?;
            return Err(match current {
                None => StorageError::NotFound { what: "account", key: a.to_string() },
                Some(row) => {
                    let current: i64 = row.try_get(0).map_err(query_err("read fence_token"))?;
                    StorageError::Fenced {
                        account: fence.account.clone(),
                        token: fence.token,
                        current: FencingToken(current.max(0) as u64),
                    }
                }
            });
        }
        Ok(FencedTx {
            tx,
            kind: self.kind,
            fence: fence.clone(),
            account: a.to_string(),
            events: self.events.clone(),
            pending: Vec::new(),
            status_changed: false,
        })
    }
}

/// A write transaction of one owned account whose fencing token has been
/// checked and advanced. Dropping it without [`FencedTx::commit`] writes
/// nothing; neither does a commit after the fence's lease deadline (it rolls
/// back and answers [`StorageError::LeaseExpired`]).
#[derive(Debug)]
pub struct FencedTx {
    pub(super) tx: Transaction<'static, Any>,
    /// Which database: how a statement of many rows numbers its parameters.
    kind: DbKind,
    /// Whose write this is, and until when it may commit.
    fence: Fence,
    pub(super) account: String,
    events: Option<std::sync::Arc<dyn EventSink>>,
    /// What this transaction did to which message, announced after the commit.
    pending: Vec<(MailEventKind, String, u32, u32)>,
    /// Whether a poll outcome that changed the account's status was recorded.
    status_changed: bool,
}

impl FencedTx {
    /// Makes sure `folder` has a state row (with `role`, e.g. `sent`).
    pub async fn ensure_folder(&mut self, folder: &str, role: Option<&str>) -> Result<(), StorageError> {
        sqlx::query(
            "INSERT INTO folders (account_id, name, role) VALUES ($1, $2, $3) \
             ON CONFLICT (account_id, name) DO UPDATE SET role = excluded.role",
        )
        .bind(&self.account)
        .bind(folder)
        .bind(role)
        .execute(&mut *self.tx)
        .await
        .map_err(query_err(format!("record folder {}/{folder}", self.account)))?;
        Ok(())
    }

    /// Starts `folder` over under `uidvalidity`: every stored message of it
    /// (whatever their UIDVALIDITY) is deleted and its state cleared.
    pub async fn reset_folder(&mut self, folder: &str, uidvalidity: u32) -> Result<(), StorageError> {
        let what = format!("{}/{folder}", self.account);
        sqlx::query("DELETE FROM messages WHERE account_id = $1 AND folder = $2")
            .bind(&self.account)
            .bind(folder)
            .execute(&mut *self.tx)
            .await
            .map_err(query_err(format!("delete the messages of {what}")))?;
        sqlx::query(
            "UPDATE folders SET uidvalidity = $1, last_uid = 0, uidnext = NULL, highestmodseq = NULL \
             WHERE account_id = $2 AND name = $3",
        )
        .bind(i64::from(uidvalidity))
        .bind(&self.account)
        .bind(folder)
        .execute(&mut *self.tx)
        .await
        .map_err(query_err(format!("reset the state of {what}")))?;
        Ok(())
    }

    /// Removes `folder` (gone from the server): its messages, announced as
    /// deleted, and its state row. Returns how many messages went.
    pub async fn delete_folder(&mut self, folder: &str) -> Result<u64, StorageError> {
        let what = format!("{}/{folder}", self.account);
        let rows = sqlx::query("SELECT uidvalidity, uid FROM messages WHERE account_id = $1 AND folder = $2")
            .bind(&self.account)
            .bind(folder)
            .fetch_all(&mut *self.tx)
            .await
            .map_err(query_err(format!("read the messages of {what}")))?;
        let mut gone: Vec<(u32, u32)> = Vec::with_capacity(rows.len());
        for r in &rows {
            let v: i64 = r.try_get(0).map_err(query_err(format!("read uidvalidity of {what}")))?;
            let u: i64 = r.try_get(1).map_err(query_err(format!("read uid of {what}")))?;
            gone.push((v.clamp(0, i64::from(u32::MAX)) as u32, u.clamp(0, i64::from(u32::MAX)) as u32));
        }
        sqlx::query("DELETE FROM messages WHERE account_id = $1 AND folder = $2")
            .bind(&self.account)
            .bind(folder)
            .execute(&mut *self.tx)
            .await
            .map_err(query_err(format!("delete the messages of {what}")))?;
        sqlx::query("DELETE FROM folders WHERE account_id = $1 AND name = $2")
            .bind(&self.account)
            .bind(folder)
            .execute(&mut *self.tx)
            .await
            .map_err(query_err(format!("delete the folder {what}")))?;
        for (uidvalidity, uid) in &gone {
            self.announce(MailEventKind::Deleted, folder, *uidvalidity, [*uid]);
        }
        Ok(gone.len() as u64)
    }

    /// Stores new messages (a message already stored keeps its row and
    /// takes the new flags: a resumed sync never duplicates).
    pub async fn insert_messages(
        &mut self,
        folder: &str,
        uidvalidity: u32,
        rows: &[MessageRow],
    ) -> Result<(), StorageError> {
        const COLUMNS: usize = 13;
        // One statement per batch on Postgres (a round trip each); SQLite
        // runs in process.
        let chunk_rows = match self.kind {
            DbKind::Sqlite => INSERT_CHUNK,
            DbKind::Postgres => INSERT_CHUNK_POSTGRES,
        };
        for chunk in rows.chunks(chunk_rows) {
            let mut sql = String::from(
                "INSERT INTO messages (account_id, folder, uidvalidity, uid, internal_date, size, flags, \
                 message_id, subject, from_addr, to_addrs, header, preview) VALUES ",
            );
            for i in 0..chunk.len() {
                if i > 0 {
                    sql.push_str(", ");
                }
                sql.push('(');
                for k in 1..=COLUMNS {
                    if k > 1 {
                        sql.push_str(", ");
                    }
                    match self.kind {
                        // SQLite looks a numbered parameter's name up in a list,
                        // once per parameter: 1,300 numbered ones cost it more
                        // than the insert. Anonymous ones bind in order.
                        DbKind::Sqlite => sql.push('?'),
                        DbKind::Postgres => sql.push_str(&format!("${}", i * COLUMNS + k)),
                    }
                }
                sql.push(')');
            }
            sql.push_str(" ON CONFLICT (account_id, folder, uidvalidity, uid) DO UPDATE SET flags = excluded.flags");
            let texts: Vec<[Option<Cow<'_, str>>; 6]> = chunk
                .iter()
                .map(|r| {
                    [&r.message_id, &r.subject, &r.from_addr, &r.to_addrs, &r.header, &r.preview]
                        .map(|t| t.as_deref().map(storable_text))
                })
                .collect();
            // Only generated placeholders are spliced in, never a value.
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for (r, [message_id, subject, from_addr, to_addrs, header, preview]) in chunk.iter().zip(&texts) {
                q = q
                    .bind(&self.account)
                    .bind(folder)
                    .bind(i64::from(uidvalidity))
                    .bind(i64::from(r.uid))
                    .bind(r.internal_date)
                    .bind(r.size)
                    .bind(&r.flags)
                    .bind(message_id.as_deref())
                    .bind(subject.as_deref())
                    .bind(from_addr.as_deref())
                    .bind(to_addrs.as_deref())
                    .bind(header.as_deref())
                    .bind(preview.as_deref());
            }
            q.execute(&mut *self.tx)
                .await
                .map_err(query_err(format!("insert messages into {}/{folder}", self.account)))?;
        }
        self.announce(MailEventKind::New, folder, uidvalidity, rows.iter().map(|r| r.uid));
        Ok(())
    }

    /// Records that every message up to `last_uid` is stored.
    pub async fn set_last_uid(&mut self, folder: &str, last_uid: u32) -> Result<(), StorageError> {
        sqlx::query("UPDATE folders SET last_uid = $1 WHERE account_id = $2 AND name = $3")
            .bind(i64::from(last_uid))
            .bind(&self.account)
            .bind(folder)
            .execute(&mut *self.tx)
            .await
            .map_err(query_err(format!("advance {}/{folder}", self.account)))?;
        Ok(())
    }

    /// Sets the flags of stored messages; returns how many rows changed.
    pub async fn set_flags(
        &mut self,
        folder: &str,
        uidvalidity: u32,
        flags: &[(u32, String)],
    ) -> Result<u64, StorageError> {
        let mut changed = 0;
        for (uid, f) in flags {
            let n = sqlx::query(
                "UPDATE messages SET flags = $1 WHERE account_id = $2 AND folder = $3 AND uidvalidity = $4 \
                 AND uid = $5 AND flags <> $1",
            )
            .bind(f)
            .bind(&self.account)
            .bind(folder)
            .bind(i64::from(uidvalidity))
            .bind(i64::from(*uid))
            .execute(&mut *self.tx)
            .await
            .map_err(query_err(format!("update flags in {}/{folder}", self.account)))?
            .rows_affected();
            if n > 0 {
                self.announce(MailEventKind::Updated, folder, uidvalidity, [*uid]);
            }
            changed += n;
        }
        Ok(changed)
    }

    /// Deletes expunged messages; returns how many rows went.
    pub async fn delete_uids(&mut self, folder: &str, uidvalidity: u32, uids: &[u32]) -> Result<u64, StorageError> {
        let mut gone = 0;
        for chunk in uids.chunks(DELETE_CHUNK) {
            let list: Vec<String> = (0..chunk.len()).map(|i| format!("${}", i + 4)).collect();
            let sql = format!(
                "DELETE FROM messages WHERE account_id = $1 AND folder = $2 AND uidvalidity = $3 AND uid IN ({})",
                list.join(", ")
            );
            // Only generated placeholders are spliced in, never a value.
            let mut q =
                sqlx::query(sqlx::AssertSqlSafe(sql)).bind(&self.account).bind(folder).bind(i64::from(uidvalidity));
            for uid in chunk {
                q = q.bind(i64::from(*uid));
            }
            gone += q
                .execute(&mut *self.tx)
                .await
                .map_err(query_err(format!("delete expunged messages of {}/{folder}", self.account)))?
                .rows_affected();
        }
        self.announce(MailEventKind::Deleted, folder, uidvalidity, uids.iter().copied());
        Ok(gone)
    }

    /// Records the server's UIDNEXT and HIGHESTMODSEQ once every change they
    /// cover is stored (in this transaction or an earlier one).
    pub async fn set_marks(
        &mut self,
        folder: &str,
        uidnext: Option<u32>,
        highestmodseq: Option<u64>,
    ) -> Result<(), StorageError> {
        sqlx::query("UPDATE folders SET uidnext = $1, highestmodseq = $2 WHERE account_id = $3 AND name = $4")
            .bind(uidnext.map(i64::from))
            .bind(highestmodseq.map(|m| m as i64))
            .bind(&self.account)
            .bind(folder)
            .execute(&mut *self.tx)
            .await
            .map_err(query_err(format!("record the marks of {}/{folder}", self.account)))?;
        Ok(())
    }

    /// Records how many messages the server says `folder` holds (its EXISTS).
    pub async fn set_server_messages(&mut self, folder: &str, exists: u32) -> Result<(), StorageError> {
        sqlx::query("UPDATE folders SET server_messages = $1 WHERE account_id = $2 AND name = $3")
            .bind(i64::from(exists))
            .bind(&self.account)
            .bind(folder)
            .execute(&mut *self.tx)
            .await
            .map_err(query_err(format!("record the size of {}/{folder}", self.account)))?;
        Ok(())
    }

    /// Records a good poll of INBOX alone: its time, but only once a whole
    /// sync of the account has finished (`last_sync_at` means that one did).
    pub async fn record_inbox_poll(&mut self) -> Result<(), StorageError> {
        let changed = sqlx::query(
            "UPDATE accounts SET last_sync_at = $1, last_error = NULL WHERE id = $2 AND last_sync_at IS NOT NULL",
        )
        .bind(now_ms())
        .bind(&self.account)
        .execute(&mut *self.tx)
        .await
        .map_err(query_err(format!("record the INBOX poll of {}", self.account)))?
        .rows_affected();
        self.status_changed |= changed > 0;
        Ok(())
    }

    /// Records the end of a poll: its time when `error` is `None`, else the error.
    /// A good poll always changes the status (its time); an error only when
    /// it differs from the one recorded.
    pub async fn record_poll(&mut self, error: Option<&str>) -> Result<(), StorageError> {
        let q = match error {
            None => {
                sqlx::query("UPDATE accounts SET last_sync_at = $1, last_error = NULL WHERE id = $2").bind(now_ms())
            }
            Some(e) => sqlx::query(
                "UPDATE accounts SET last_error = $1 WHERE id = $2 AND (last_error IS NULL OR last_error <> $1)",
            )
            .bind(storable_text(e).into_owned()),
        };
        let changed = q
            .bind(&self.account)
            .execute(&mut *self.tx)
            .await
            .map_err(query_err(format!("record the poll of {}", self.account)))?
            .rows_affected();
        self.status_changed |= changed > 0;
        Ok(())
    }

    fn announce(&mut self, kind: MailEventKind, folder: &str, uidvalidity: u32, uids: impl IntoIterator<Item = u32>) {
        // Recorded with or without a sink: the webhook outbox needs them too.
        self.pending.extend(uids.into_iter().map(|uid| (kind, folder.to_string(), uidvalidity, uid)));
    }

    /// Commits everything written through this transaction, then announces
    /// its messages to the storage's event sink, if it has one.
    pub async fn commit(mut self) -> Result<(), StorageError> {
        let a = self.account;
        let needs_user = !self.pending.is_empty() || (self.status_changed && self.events.is_some());
        let user = if needs_user {
            let (user, hooks) = user_and_webhooks(&mut self.tx, &a).await?;
            // In this transaction, so a webhook's event is stored exactly
            // when the change it announces is.
            let outbox: Vec<OutboxEvent<'_>> = self
                .pending
                .iter()
                .map(|(kind, folder, uidvalidity, uid)| OutboxEvent {
                    kind: *kind,
                    folder,
                    uidvalidity: *uidvalidity,
                    uid: *uid,
                })
                .collect();
            record_outbox(&mut self.tx, &a, &hooks, &outbox).await?;
            Some(user)
        } else {
            None
        };
        let announce = match (self.events.take(), user) {
            (Some(sink), Some(user)) => Some((sink, user)),
            _ => None,
        };
        if self.fence.deadline.passed() {
            // Outlived its lease: a new owner may already be syncing.
            let expired = StorageError::LeaseExpired { account: self.fence.account.clone(), token: self.fence.token };
            self.tx.rollback().await.map_err(query_err(format!("roll back an expired write of {a}")))?;
            return Err(expired);
        }
        self.tx.commit().await.map_err(query_err(format!("commit a write of {a}")))?;
        let stored = self.pending.iter().filter(|(kind, ..)| *kind == MailEventKind::New).count();
        if stored > 0 {
            metrics::counter!("sync_worker_messages_synced_total").increment(stored as u64);
        }
        if let Some((sink, user)) = announce {
            let committed_at_ms = now_ms();
            let mut events: Vec<SyncEvent> = self
                .pending
                .into_iter()
                .map(|(kind, folder, uidvalidity, uid)| {
                    SyncEvent::Mail(MailEvent {
                        user: user.clone(),
                        account: a.clone(),
                        kind,
                        folder,
                        uidvalidity,
                        uid,
                        committed_at_ms,
                    })
                })
                .collect();
            if self.status_changed {
                events.push(SyncEvent::Account(AccountChanged { user, account: a }));
            }
            sink.publish(events);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::storable_text;

    #[test]
    fn a_nul_in_text_is_stored_as_a_replacement_character() {
        assert_eq!(storable_text("a\0b\0"), "a\u{FFFD}b\u{FFFD}");
        assert!(matches!(storable_text("plain"), std::borrow::Cow::Borrowed("plain")));
    }
}
