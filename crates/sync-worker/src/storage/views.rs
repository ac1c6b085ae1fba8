//! Accounts, folders and messages as one user sees them: what the API
//! lists and shows.
//!
//! **Message ids.** A message is named by its folder, the folder's
//! UIDVALIDITY and its UID ([`MessageKey`]), encoded as one opaque
//! URL-safe token. **Order and cursor.** Messages are listed newest first
//! in arrival order (UID descending, which the primary key serves); the
//! cursor is the last UID returned, bound to the folder's UIDVALIDITY, so
//! pages neither repeat nor skip while new mail arrives.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine as _;
use leasehold_core::UserId;
use sqlx::Row;

use super::{corrupt, now_ms, query_err, DbKind, Storage, StorageError};

/// One folder of an account, with how many messages are stored for it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct FolderInfo {
    /// The folder's IMAP name.
    pub name: String,
    /// Its special use (`sent`, `drafts`, ...), if any.
    pub role: Option<String>,
    /// Its UIDVALIDITY, once synced.
    pub uidvalidity: Option<u32>,
    /// Messages stored for it.
    pub messages: i64,
    /// Messages the server said it holds when it was last selected (`None`
    /// before that).
    pub on_server: Option<i64>,
    /// Stored messages without `\Seen`.
    pub unread: i64,
}

/// Which message: folder, UIDVALIDITY and UID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageKey {
    /// The folder.
    pub folder: String,
    /// The folder's UIDVALIDITY.
    pub uidvalidity: u32,
    /// The UID.
    pub uid: u32,
}

impl MessageKey {
    /// The opaque id the API shows.
    pub fn encode(&self) -> String {
        B64URL.encode(format!("{}:{}:{}", self.uidvalidity, self.uid, self.folder))
    }

    /// Reads an id made by [`MessageKey::encode`]; `None` when it is not one.
    pub fn decode(id: &str) -> Option<Self> {
        let raw = String::from_utf8(B64URL.decode(id).ok()?).ok()?;
        let mut parts = raw.splitn(3, ':');
        let uidvalidity = parts.next()?.parse().ok()?;
        let uid = parts.next()?.parse().ok()?;
        let folder = parts.next()?.to_string();
        Some(Self { folder, uidvalidity, uid })
    }
}

/// A message as listed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct MessageSummary {
    /// Its id ([`MessageKey::encode`]).
    pub id: String,
    /// Its folder.
    pub folder: String,
    /// Its UID.
    pub uid: u32,
    /// The subject.
    pub subject: Option<String>,
    /// The first sender.
    pub from: Option<String>,
    /// The recipients, comma-separated.
    pub to: Option<String>,
    /// INTERNALDATE (ms since the epoch).
    pub date: Option<i64>,
    /// Its flags.
    pub flags: Vec<String>,
    /// RFC822.SIZE.
    pub size: Option<i64>,
    /// The start of the text body.
    pub preview: Option<String>,
}

/// A message with everything stored of it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct MessageDetail {
    /// What the list shows.
    #[serde(flatten)]
    pub summary: MessageSummary,
    /// The Message-ID header.
    pub message_id: Option<String>,
    /// The raw header.
    pub header: Option<String>,
}

const MESSAGE_COLUMNS: &str =
    "uid, subject, from_addr, to_addrs, internal_date, flags, size, preview, message_id, header";

/// What a list shows of a message: the first columns of [`MESSAGE_COLUMNS`],
/// so a page does not read (and copy) every stored header.
pub(super) const SUMMARY_COLUMNS: &str = "uid, subject, from_addr, to_addrs, internal_date, flags, size, preview";

/// The error of reading column `c` of a message row of `account`/`folder`,
/// its text made only when it happens (a page reads hundreds of columns).
fn column_err<'a>(account: &'a str, folder: &'a str, c: &'static str) -> impl FnOnce(sqlx::Error) -> StorageError + 'a {
    move |source| StorageError::Query { op: format!("read message column {c} of {account}/{folder}"), source }
}

/// The values of [`SUMMARY_COLUMNS`], in order, as a row or a JSON array.
#[derive(serde::Deserialize)]
pub(super) struct SummaryColumns(
    i64,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<i64>,
    String,
    Option<i64>,
    Option<String>,
);

impl SummaryColumns {
    /// Reads a row whose first columns are [`SUMMARY_COLUMNS`].
    pub(super) fn of_row(account: &str, folder: &str, row: &sqlx::any::AnyRow) -> Result<Self, StorageError> {
        let get = |c| column_err(account, folder, c);
        Ok(SummaryColumns(
            row.try_get(0).map_err(get("uid"))?,
            row.try_get(1).map_err(get("subject"))?,
            row.try_get(2).map_err(get("from_addr"))?,
            row.try_get(3).map_err(get("to_addrs"))?,
            row.try_get(4).map_err(get("internal_date"))?,
            row.try_get(5).map_err(get("flags"))?,
            row.try_get(6).map_err(get("size"))?,
            row.try_get(7).map_err(get("preview"))?,
        ))
    }

    pub(super) fn summary(self, account: &str, folder: &str, uidvalidity: u32) -> Result<MessageSummary, StorageError> {
        let SummaryColumns(uid, subject, from, to, date, flags, size, preview) = self;
        let uid = u32::try_from(uid).map_err(|_| corrupt(account, "uid", uid))?;
        Ok(MessageSummary {
            id: MessageKey { folder: folder.to_string(), uidvalidity, uid }.encode(),
            folder: folder.to_string(),
            uid,
            subject,
            from,
            to,
            date,
            flags: flags.split_whitespace().map(str::to_string).collect(),
            size,
            preview,
        })
    }
}

/// Reads a row of [`MESSAGE_COLUMNS`].
fn message_of(
    account: &str,
    folder: &str,
    uidvalidity: u32,
    row: &sqlx::any::AnyRow,
) -> Result<MessageDetail, StorageError> {
    let get = |c| column_err(account, folder, c);
    Ok(MessageDetail {
        summary: SummaryColumns::of_row(account, folder, row)?.summary(account, folder, uidvalidity)?,
        message_id: row.try_get(8).map_err(get("message_id"))?,
        header: row.try_get(9).map_err(get("header"))?,
    })
}

impl Storage {
    /// The user of `account`, if the account exists.
    pub async fn account_user(&self, account: &str) -> Result<Option<UserId>, StorageError> {
        let row = sqlx::query("SELECT user_id FROM accounts WHERE id = $1")
            .bind(account)
            .fetch_optional(&self.pool)
            .await
            .map_err(query_err(format!("read the user of account {account}")))?;
        let Some(row) = row else { return Ok(None) };
        let id: String = row.try_get(0).map_err(query_err("read account user"))?;
        Ok(Some(UserId::new(&id).map_err(|_| corrupt(account, "user_id", &id))?))
    }

    /// The ids of `user`'s accounts, oldest first.
    pub async fn account_ids_of(&self, user: &UserId) -> Result<Vec<String>, StorageError> {
        let rows = sqlx::query("SELECT id FROM accounts WHERE user_id = $1 ORDER BY created_at, id")
            .bind(user.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(query_err(format!("list the accounts of user {user}")))?;
        rows.iter().map(|r| r.try_get(0).map_err(query_err("read account id"))).collect()
    }

    /// The folders of `account` with their message counts, by name.
    pub async fn folders(&self, account: &str) -> Result<Vec<FolderInfo>, StorageError> {
        let rows = sqlx::query(
            "SELECT f.name, f.role, f.uidvalidity, COUNT(m.uid), f.server_messages, \
             COALESCE(SUM(CASE WHEN m.uid IS NOT NULL AND m.flags NOT LIKE '%\\Seen%' ESCAPE '!' THEN 1 ELSE 0 END), 0) \
             FROM folders f \
             LEFT JOIN messages m ON m.account_id = f.account_id AND m.folder = f.name AND m.uidvalidity = f.uidvalidity \
             WHERE f.account_id = $1 GROUP BY f.name, f.role, f.uidvalidity, f.server_messages ORDER BY f.name",
        )
        .bind(account)
        .fetch_all(&self.pool)
        .await
        .map_err(query_err(format!("list the folders of {account}")))?;
        rows.iter()
            .map(|r| {
                let uidvalidity: Option<i64> = r.try_get(2).map_err(query_err("read uidvalidity"))?;
                Ok(FolderInfo {
                    name: r.try_get(0).map_err(query_err("read folder name"))?,
                    role: r.try_get(1).map_err(query_err("read folder role"))?,
                    uidvalidity: uidvalidity
                        .map(|v| u32::try_from(v).map_err(|_| corrupt(account, "uidvalidity", v)))
                        .transpose()?,
                    messages: r.try_get(3).map_err(query_err("read message count"))?,
                    on_server: r.try_get(4).map_err(query_err("read the server's message count"))?,
                    unread: r.try_get(5).map_err(query_err("read the unread count"))?,
                })
            })
            .collect()
    }

    /// For a message list, in one query: `None` when `account` is not
    /// `user`'s (or does not exist), else the current UIDVALIDITY of `folder`
    /// (`None` when the folder is unknown or not synced yet).
    pub async fn owned_folder_uidvalidity(
        &self,
        user: &UserId,
        account: &str,
        folder: &str,
    ) -> Result<Option<Option<u32>>, StorageError> {
        let row = sqlx::query(
            "SELECT f.uidvalidity FROM accounts a LEFT JOIN folders f ON f.account_id = a.id AND f.name = $2 \
             WHERE a.id = $1 AND a.user_id = $3",
        )
        .bind(account)
        .bind(folder)
        .bind(user.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(query_err(format!("read the UIDVALIDITY of {account}/{folder}")))?;
        let Some(row) = row else { return Ok(None) };
        let v: Option<i64> = row.try_get(0).map_err(query_err("read uidvalidity"))?;
        Ok(Some(v.map(|v| u32::try_from(v).map_err(|_| corrupt(account, "uidvalidity", v))).transpose()?))
    }

    /// The hot path of a message list, in one query: the current
    /// UIDVALIDITY of `folder` and its page under that UIDVALIDITY (newest,
    /// that is highest UID, first, below `before_uid` when given) when `token_hash` is an unexpired session
    /// of the user who owns `account` and the page is not empty. `None` in
    /// every other case: the caller tells those apart with the separate
    /// checks, which only a failing or empty request pays for.
    pub async fn session_message_page(
        &self,
        token_hash: &str,
        account: &str,
        folder: &str,
        before_uid: Option<u32>,
        limit: u32,
    ) -> Result<Option<(u32, Vec<MessageSummary>)>, StorageError> {
        // The database hands back the page as one JSON array of rows: one
        // value to fetch and convert, where 50 rows of 8 columns cost 50
        // hand-offs between SQLite's thread and ours (perf: context switches
        // were a third of the server's CPU) and 400 value conversions.
        let (aggregate, end) = match self.kind {
            DbKind::Sqlite => ("json_group_array(json_array", "ORDER BY uid DESC)"),
            DbKind::Postgres => ("json_agg(json_build_array", "ORDER BY uid DESC)::text"),
        };
        // The summary columns are names only `messages` has, so they need no prefix.
        let sql = format!(
            "SELECT {aggregate}({SUMMARY_COLUMNS}) {end}, MIN(uidvalidity) FROM (\
             SELECT {SUMMARY_COLUMNS}, f.uidvalidity FROM sessions s \
             JOIN accounts a ON a.user_id = s.user_id \
             JOIN folders f ON f.account_id = a.id \
             JOIN messages m ON m.account_id = f.account_id AND m.folder = f.name AND m.uidvalidity = f.uidvalidity \
             WHERE s.token_hash = $1 AND s.expires_at > $2 AND a.id = $3 AND f.name = $4 AND m.uid < $5 \
             ORDER BY m.uid DESC LIMIT {limit}) page"
        );
        // Spliced in: constant SQL and the limit, a `u32`. A bound LIMIT
        // would cost a re-prepare per run: SQLite (3.4x on) plans with its
        // value, so rebinding it expires the cached statement (perf: the list
        // re-parsed and re-planned its query every time, 9 % of the server's
        // CPU). The few page sizes clients use get a statement each.
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(token_hash)
            .bind(now_ms())
            .bind(account)
            .bind(folder)
            .bind(before_uid.map_or(i64::MAX, i64::from))
            .fetch_one(&self.pool)
            .await
            .map_err(query_err(format!("list the messages of {account}/{folder}")))?;
        let read = |c| query_err(format!("read the page of {account}/{folder}: {c}"));
        // No rows: no UIDVALIDITY (and an empty or null array).
        let Some(uidvalidity) = row.try_get::<Option<i64>, _>(1).map_err(read("uidvalidity"))? else {
            return Ok(None);
        };
        let uidvalidity = u32::try_from(uidvalidity).map_err(|_| corrupt(account, "uidvalidity", uidvalidity))?;
        let rows: String = row.try_get(0).map_err(read("rows"))?;
        let rows: Vec<SummaryColumns> = serde_json::from_str(&rows).map_err(|e| corrupt(account, "message page", e))?;
        let page = rows.into_iter().map(|c| c.summary(account, folder, uidvalidity)).collect::<Result<_, _>>()?;
        Ok(Some((uidvalidity, page)))
    }

    /// One message, if stored.
    pub async fn message(&self, account: &str, key: &MessageKey) -> Result<Option<MessageDetail>, StorageError> {
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE account_id = $1 AND folder = $2 AND uidvalidity = $3 AND uid = $4"
        );
        // Only the constant column list is spliced in, never a value.
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(account)
            .bind(&key.folder)
            .bind(i64::from(key.uidvalidity))
            .bind(i64::from(key.uid))
            .fetch_optional(&self.pool)
            .await
            .map_err(query_err(format!("read message {}/{} of {account}", key.folder, key.uid)))?;
        row.map(|r| message_of(account, &key.folder, key.uidvalidity, &r)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_round_trip_and_reject_garbage() {
        let k = MessageKey { folder: "Archive:2024/ü".into(), uidvalidity: 7, uid: 42 };
        assert_eq!(MessageKey::decode(&k.encode()), Some(k));
        for bad in ["", "!!", "bm9wZQ", &B64URL.encode("1:x:INBOX")] {
            assert_eq!(MessageKey::decode(bad), None, "{bad}");
        }
    }
}
