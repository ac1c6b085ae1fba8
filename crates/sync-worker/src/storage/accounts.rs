//! Users and accounts: the operator's and the API's side of the storage,
//! and the [`AccountDirectory`] the coordinator asks.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use async_trait::async_trait;
use leasehold_core::{LeaseKey, UserId};
use sqlx::Row;

use super::{now_ms, query_err, Storage, StorageError};
use crate::directory::AccountDirectory;
use crate::errors::DirectoryError;
use crate::oauth2::OAuth2Grant;
use crate::secret::SecretKey;

/// An e-mail address, trimmed and lower-cased; checked once, here.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Email(String);

/// What is wrong with an e-mail address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an e-mail address: expected name@domain, without spaces")]
pub struct BadEmail(String);

impl FromStr for Email {
    type Err = BadEmail;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let v = s.trim().to_lowercase();
        let ok = match v.split_once('@') {
            Some((local, domain)) => !local.is_empty() && !domain.is_empty() && !domain.contains('@') && v.len() <= 254,
            None => false,
        };
        if ok && !v.chars().any(|c| c.is_whitespace() || c.is_control()) {
            Ok(Self(v))
        } else {
            Err(BadEmail(s.to_string()))
        }
    }
}

impl Email {
    /// The address.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Email {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How the engine reaches an account's server.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Security {
    /// TLS from the first byte (usually port 993).
    Tls,
    /// Plain TCP upgraded with STARTTLS before login (usually port 143).
    Starttls,
    /// No encryption at all: only for loopback servers and tests, and only
    /// when the account says so.
    Plain,
}

impl Security {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Security::Tls => "tls",
            Security::Starttls => "starttls",
            Security::Plain => "plain",
        }
    }

    fn parse(account: &str, s: &str) -> Result<Self, StorageError> {
        match s {
            "tls" => Ok(Security::Tls),
            "starttls" => Ok(Security::Starttls),
            "plain" => Ok(Security::Plain),
            _ => Err(StorageError::Corrupt { account: account.into(), field: "security", value: s.into() }),
        }
    }
}

impl fmt::Display for Security {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserRecord {
    /// The user's id (a UUID).
    pub id: UserId,
    /// The user's address.
    pub email: Email,
}

/// An account to add.
#[derive(Debug, Clone)]
pub struct NewAccount {
    /// Its user.
    pub user: UserId,
    /// The IMAP server's host name.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// How to reach it.
    pub security: Security,
    /// The IMAP login.
    pub username: String,
    /// How it logs in (its secret stored encrypted).
    pub auth: AccountAuth,
}

/// How an account logs in, with its secret.
#[derive(Clone, PartialEq, Eq)]
pub enum AccountAuth {
    /// A password (AUTHENTICATE PLAIN or LOGIN).
    Password(String),
    /// An OAuth2 grant (OAUTHBEARER or XOAUTH2 with an access token got by it).
    OAuth2(OAuth2Grant),
}

impl AccountAuth {
    /// The stored name: `password` or `oauth2`.
    pub fn kind(&self) -> &'static str {
        match self {
            AccountAuth::Password(_) => "password",
            AccountAuth::OAuth2(_) => "oauth2",
        }
    }

    /// The secret, encrypted for `account`.
    fn seal(&self, key: &SecretKey, account: &str) -> String {
        match self {
            AccountAuth::Password(p) => key.seal(account, p),
            // Serializing strings into JSON cannot fail.
            AccountAuth::OAuth2(g) => key.seal(account, &serde_json::to_string(g).unwrap_or_default()),
        }
    }

    /// What [`AccountAuth::seal`] made, of the stored `kind`.
    fn open(key: &SecretKey, account: &str, kind: &str, sealed: &str) -> Result<Self, StorageError> {
        let secret = key.open(account, sealed)?;
        match kind {
            "password" => Ok(AccountAuth::Password(secret)),
            "oauth2" => serde_json::from_str(&secret).map(AccountAuth::OAuth2).map_err(|e| StorageError::Corrupt {
                account: account.into(),
                field: "oauth2 grant",
                value: e.to_string(),
            }),
            _ => Err(StorageError::Corrupt { account: account.into(), field: "auth", value: kind.into() }),
        }
    }
}

impl fmt::Debug for AccountAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AccountAuth::Password(_) => f.write_str("Password(<redacted>)"),
            AccountAuth::OAuth2(g) => f.debug_tuple("OAuth2").field(g).finish(),
        }
    }
}

/// What an account's server and login are, with the secret decrypted.
#[derive(Clone)]
pub struct Credentials {
    /// The IMAP server's host name.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// How to reach it.
    pub security: Security,
    /// The IMAP login.
    pub username: String,
    /// How it logs in.
    pub auth: AccountAuth,
}

/// What `account update` and `PATCH /v1/accounts/{id}` change of an
/// account's login; what is `None` stays.
#[derive(Clone, Default)]
pub struct LoginChange {
    /// Another server host name.
    pub host: Option<String>,
    /// Another port.
    pub port: Option<u16>,
    /// Another way to reach the server.
    pub security: Option<Security>,
    /// Another password or OAuth2 grant.
    pub auth: Option<AccountAuth>,
}

impl LoginChange {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.host.is_none() && self.port.is_none() && self.security.is_none() && self.auth.is_none()
    }

    /// `current` with these changes.
    pub fn apply(self, current: Credentials) -> Credentials {
        Credentials {
            host: self.host.unwrap_or(current.host),
            port: self.port.unwrap_or(current.port),
            security: self.security.unwrap_or(current.security),
            username: current.username,
            auth: self.auth.unwrap_or(current.auth),
        }
    }
}

impl fmt::Debug for LoginChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginChange")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("security", &self.security)
            .field("auth", &self.auth)
            .finish()
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("security", &self.security)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// An account as listed (no password).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AccountSummary {
    /// The account id (a UUID: the lease key).
    pub id: String,
    /// Its user's e-mail address.
    pub user: String,
    /// The IMAP server's host name.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// How it is reached.
    pub security: Security,
    /// The IMAP login.
    pub username: String,
    /// When the last poll ended well (ms since the epoch).
    pub last_sync_at: Option<i64>,
    /// The last poll's error, cleared by the next good one.
    pub last_error: Option<String>,
    /// The worker that last wrote for it.
    pub owner: Option<String>,
}

/// How many messages one folder holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FolderCount {
    /// The folder's IMAP name.
    pub name: String,
    /// Messages stored for it.
    pub messages: i64,
}

/// The account summary query, with a tail (`WHERE`, `ORDER BY`).
macro_rules! select_summary {
    ($tail:literal) => {
        concat!(
            "SELECT a.id, u.email, a.host, a.port, a.security, a.username, a.last_sync_at, a.last_error, a.fence_owner \
             FROM accounts a JOIN users u ON u.id = a.user_id ",
            $tail
        )
    };
}

fn summary(row: &sqlx::any::AnyRow) -> Result<AccountSummary, StorageError> {
    let get = |op| query_err(format!("read account column {op}"));
    let id: String = row.try_get(0).map_err(get("id"))?;
    let port: i64 = row.try_get(3).map_err(get("port"))?;
    let security: String = row.try_get(4).map_err(get("security"))?;
    Ok(AccountSummary {
        security: Security::parse(&id, &security)?,
        port: u16::try_from(port).map_err(|_| StorageError::Corrupt {
            account: id.clone(),
            field: "port",
            value: port.to_string(),
        })?,
        user: row.try_get(1).map_err(get("user"))?,
        host: row.try_get(2).map_err(get("host"))?,
        username: row.try_get(5).map_err(get("username"))?,
        last_sync_at: row.try_get(6).map_err(get("last_sync_at"))?,
        last_error: row.try_get(7).map_err(get("last_error"))?,
        owner: row.try_get(8).map_err(get("fence_owner"))?,
        id,
    })
}

impl Storage {
    /// Adds a user; a duplicate address is [`StorageError::Duplicate`].
    pub async fn add_user(&self, email: &Email) -> Result<UserRecord, StorageError> {
        if self.user_by_email(email).await?.is_some() {
            return Err(StorageError::Duplicate { what: format!("user {email}") });
        }
        let id = uuid::Uuid::new_v4().to_string();
        sqlx::query("INSERT INTO users (id, email, created_at) VALUES ($1, $2, $3)")
            .bind(&id)
            .bind(email.as_str())
            .bind(now_ms())
            .execute(&self.pool)
            .await
            .map_err(|e| match e {
                sqlx::Error::Database(d) if d.is_unique_violation() => {
                    StorageError::Duplicate { what: format!("user {email}") }
                }
                e => StorageError::Query { op: format!("insert user {email}"), source: e },
            })?;
        let id = UserId::new(&id).map_err(|_| StorageError::Corrupt {
            account: String::new(),
            field: "user id",
            value: id,
        })?;
        Ok(UserRecord { id, email: email.clone() })
    }

    /// The user with `email`, if any.
    pub async fn user_by_email(&self, email: &Email) -> Result<Option<UserRecord>, StorageError> {
        let row = sqlx::query("SELECT id FROM users WHERE email = $1")
            .bind(email.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(query_err(format!("look up user {email}")))?;
        row.map(|r| {
            let id: String = r.try_get(0).map_err(query_err("read user id"))?;
            let id = UserId::new(&id).map_err(|_| StorageError::Corrupt {
                account: String::new(),
                field: "user id",
                value: id,
            })?;
            Ok(UserRecord { id, email: email.clone() })
        })
        .transpose()
    }

    /// Adds an account (its password encrypted) and returns its id.
    pub async fn add_account(&self, new: &NewAccount) -> Result<LeaseKey, StorageError> {
        let what = || format!("account {}@{}:{}", new.username, new.host, new.port);
        if self.same_mailbox(&new.user, &new.host, new.port, &new.username, None, None).await?.is_some() {
            return Err(StorageError::Duplicate { what: what() });
        }
        let id = uuid::Uuid::new_v4().to_string();
        let sealed = new.auth.seal(&self.secret, &id);
        sqlx::query(
            "INSERT INTO accounts (id, user_id, host, port, security, username, auth, password_enc, created_at, bucket) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&id)
        .bind(new.user.as_str())
        .bind(&new.host)
        .bind(i64::from(new.port))
        .bind(new.security.as_str())
        .bind(&new.username)
        .bind(new.auth.kind())
        .bind(&sealed)
        .bind(now_ms())
        .bind(i64::from(self.bucket_of(&id).0))
        .execute(&self.pool)
        .await
        .map_err(|e| match e {
            sqlx::Error::Database(d) if d.is_unique_violation() => StorageError::Duplicate { what: what() },
            e => StorageError::Query { op: format!("insert {}", what()), source: e },
        })?;
        LeaseKey::new(&id).map_err(|_| StorageError::Corrupt { account: id.clone(), field: "id", value: id.clone() })
    }

    /// Changes `id`'s server, security and password (its login was checked
    /// with them), keeping its synced mail, and forgets its refused logins:
    /// the next attempt may come at once. `server_ip` is the address that
    /// took that login (the per-user duplicate check's); `None` keeps the
    /// stored one.
    pub async fn update_login(
        &self,
        id: &LeaseKey,
        login: &Credentials,
        server_ip: Option<IpAddr>,
    ) -> Result<(), StorageError> {
        let what = || format!("account {}@{}:{}", login.username, login.host, login.port);
        let sealed = login.auth.seal(&self.secret, id.as_str());
        let updated = sqlx::query(
            "UPDATE accounts SET host = $1, port = $2, security = $3, auth = $4, password_enc = $5, \
             login_failures = 0, login_retry_at = NULL, last_error = NULL, server_ip = COALESCE($6, server_ip) \
             WHERE id = $7",
        )
        .bind(&login.host)
        .bind(i64::from(login.port))
        .bind(login.security.as_str())
        .bind(login.auth.kind())
        .bind(&sealed)
        .bind(server_ip.map(|ip| ip.to_canonical().to_string()))
        .bind(id.as_str())
        .execute(&self.pool)
        .await
        .map_err(|e| match e {
            sqlx::Error::Database(d) if d.is_unique_violation() => StorageError::Duplicate { what: what() },
            e => StorageError::Query { op: format!("update {}", what()), source: e },
        })?
        .rows_affected();
        if updated == 0 {
            return Err(StorageError::NotFound { what: "account", key: id.to_string() });
        }
        Ok(())
    }

    /// Every account id: what should be synced (the live set's source of truth).
    pub async fn account_keys(&self) -> Result<Vec<LeaseKey>, StorageError> {
        let rows = sqlx::query("SELECT id FROM accounts ORDER BY id")
            .fetch_all(&self.pool)
            .await
            .map_err(query_err("list account ids"))?;
        rows.iter()
            .map(|r| {
                let id: String = r.try_get(0).map_err(query_err("read account id"))?;
                LeaseKey::new(&id).map_err(|_| StorageError::Corrupt { account: id.clone(), field: "id", value: id })
            })
            .collect()
    }

    /// Every account, by user then host.
    pub async fn list_accounts(&self) -> Result<Vec<AccountSummary>, StorageError> {
        let rows = sqlx::query(select_summary!("ORDER BY u.email, a.host, a.username"))
            .fetch_all(&self.pool)
            .await
            .map_err(query_err("list accounts"))?;
        rows.iter().map(summary).collect()
    }

    /// One account, if it exists.
    pub async fn account(&self, id: &str) -> Result<Option<AccountSummary>, StorageError> {
        let row = sqlx::query(select_summary!("WHERE a.id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(query_err(format!("read account {id}")))?;
        row.as_ref().map(summary).transpose()
    }

    /// The server, login and decrypted password of `account`.
    pub async fn credentials(&self, account: &LeaseKey) -> Result<Credentials, StorageError> {
        let id = account.as_str();
        let row = sqlx::query("SELECT host, port, security, username, auth, password_enc FROM accounts WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(query_err(format!("read credentials of {id}")))?
            .ok_or_else(|| StorageError::NotFound { what: "account", key: id.to_string() })?;
        let get = |c| query_err(format!("read {c} of {id}"));
        let port: i64 = row.try_get(1).map_err(get("port"))?;
        let security: String = row.try_get(2).map_err(get("security"))?;
        let kind: String = row.try_get(4).map_err(get("auth"))?;
        let sealed: String = row.try_get(5).map_err(get("password"))?;
        Ok(Credentials {
            host: row.try_get(0).map_err(get("host"))?,
            port: u16::try_from(port).map_err(|_| StorageError::Corrupt {
                account: id.into(),
                field: "port",
                value: port.to_string(),
            })?,
            security: Security::parse(id, &security)?,
            username: row.try_get(3).map_err(get("username"))?,
            auth: AccountAuth::open(&self.secret, id, &kind, &sealed)?,
        })
    }

    /// Stores the refresh token `old`'s token endpoint rotated it to, unless
    /// the account's login changed meanwhile (then the new login stands);
    /// `false` when it did.
    pub async fn rotate_refresh_token(
        &self,
        account: &LeaseKey,
        old: &OAuth2Grant,
        refresh_token: String,
    ) -> Result<bool, StorageError> {
        let id = account.as_str();
        let row = sqlx::query("SELECT auth, password_enc FROM accounts WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(query_err(format!("read the grant of {id}")))?;
        let Some(row) = row else { return Ok(false) };
        let kind: String = row.try_get(0).map_err(query_err(format!("read auth of {id}")))?;
        let sealed: String = row.try_get(1).map_err(query_err(format!("read the grant of {id}")))?;
        if AccountAuth::open(&self.secret, id, &kind, &sealed)? != AccountAuth::OAuth2(old.clone()) {
            return Ok(false);
        }
        let rotated = AccountAuth::OAuth2(OAuth2Grant { refresh_token, ..old.clone() });
        // Compare-and-set on the sealed value: a concurrent update wins.
        let updated = sqlx::query("UPDATE accounts SET password_enc = $1 WHERE id = $2 AND password_enc = $3")
            .bind(rotated.seal(&self.secret, id))
            .bind(id)
            .bind(&sealed)
            .execute(&self.pool)
            .await
            .map_err(query_err(format!("store the rotated refresh token of {id}")))?
            .rows_affected();
        Ok(updated == 1)
    }

    /// Messages per folder of `account`, by folder name.
    pub async fn folder_counts(&self, account: &str) -> Result<Vec<FolderCount>, StorageError> {
        let rows = sqlx::query(
            "SELECT f.name, COUNT(m.uid) FROM folders f \
             LEFT JOIN messages m ON m.account_id = f.account_id AND m.folder = f.name AND m.uidvalidity = f.uidvalidity \
             WHERE f.account_id = $1 GROUP BY f.name ORDER BY f.name",
        )
        .bind(account)
        .fetch_all(&self.pool)
        .await
        .map_err(query_err(format!("count messages of {account}")))?;
        rows.iter()
            .map(|r| {
                Ok(FolderCount {
                    name: r.try_get(0).map_err(query_err("read folder name"))?,
                    messages: r.try_get(1).map_err(query_err("read message count"))?,
                })
            })
            .collect()
    }

    /// Removes `account` and all its mail; `false` when it did not exist.
    pub async fn remove_account(&self, account: &str) -> Result<bool, StorageError> {
        let mut tx = self.pool.begin().await.map_err(query_err(format!("begin removing {account}")))?;
        // The account row is locked first, as a fenced write locks it: taking
        // the mail rows first would deadlock with a sync committing right now.
        let exists = sqlx::query("UPDATE accounts SET fence_token = fence_token WHERE id = $1")
            .bind(account)
            .execute(&mut *tx)
            .await
            .map_err(query_err(format!("lock account {account} for removal")))?
            .rows_affected();
        if exists == 0 {
            return Ok(false);
        }
        for (table, sql) in [
            ("cached views", "DELETE FROM message_views WHERE account_id = $1"),
            ("messages", "DELETE FROM messages WHERE account_id = $1"),
            ("folders", "DELETE FROM folders WHERE account_id = $1"),
        ] {
            sqlx::query(sql)
                .bind(account)
                .execute(&mut *tx)
                .await
                .map_err(query_err(format!("delete {table} of {account}")))?;
        }
        let gone = sqlx::query("DELETE FROM accounts WHERE id = $1")
            .bind(account)
            .execute(&mut *tx)
            .await
            .map_err(query_err(format!("delete account {account}")))?
            .rows_affected();
        tx.commit().await.map_err(query_err(format!("commit removing {account}")))?;
        Ok(gone > 0)
    }

    /// The newest internal date of `account`'s mail (ms since the epoch).
    pub async fn latest_internal_date(&self, account: &LeaseKey) -> Result<Option<i64>, StorageError> {
        let row = sqlx::query("SELECT MAX(internal_date) FROM messages WHERE account_id = $1")
            .bind(account.as_str())
            .fetch_one(&self.pool)
            .await
            .map_err(query_err(format!("newest mail of {account}")))?;
        row.try_get::<Option<i64>, _>(0).map_err(query_err(format!("read newest mail of {account}")))
    }

    /// Forgets every stored fencing token. Only for the in-memory lease
    /// store: its tokens restart at 1 with the process, and it cannot be
    /// shared, so no other process can own these accounts.
    pub async fn reset_fences(&self) -> Result<(), StorageError> {
        sqlx::query("UPDATE accounts SET fence_token = 0")
            .execute(&self.pool)
            .await
            .map_err(query_err("reset fencing tokens"))?;
        Ok(())
    }
}

#[async_trait]
impl AccountDirectory for Storage {
    async fn user_of(&self, account: &LeaseKey) -> Result<Option<UserId>, DirectoryError> {
        let row = sqlx::query("SELECT user_id FROM accounts WHERE id = $1")
            .bind(account.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| DirectoryError { op: "user_of", source: Box::new(e) })?;
        let Some(row) = row else { return Ok(None) };
        let id: String = row.try_get(0).map_err(|e| DirectoryError { op: "user_of", source: Box::new(e) })?;
        UserId::new(&id).map(Some).map_err(|e| DirectoryError { op: "user_of", source: Box::new(e) })
    }

    async fn users_of(&self, accounts: &[LeaseKey]) -> Result<Vec<Option<UserId>>, DirectoryError> {
        Storage::users_of(self, accounts).await.map_err(|e| DirectoryError { op: "users_of", source: Box::new(e) })
    }

    fn bucket_count(&self) -> leasehold_core::BucketCount {
        Storage::bucket_count(self)
    }

    async fn accounts_in_buckets(
        &self,
        buckets: &[leasehold_core::BucketId],
    ) -> Result<Vec<crate::directory::BucketAccount>, DirectoryError> {
        Storage::accounts_in_buckets(self, buckets)
            .await
            .map_err(|e| DirectoryError { op: "accounts_in_buckets", source: Box::new(e) })
    }

    async fn bucket_weights(
        &self,
        only: Option<&[leasehold_core::BucketId]>,
    ) -> Result<Vec<(leasehold_core::BucketId, u64)>, DirectoryError> {
        Storage::bucket_weights(self, only)
            .await
            .map_err(|e| DirectoryError { op: "bucket_weights", source: Box::new(e) })
    }

    async fn highest_token_in_bucket(
        &self,
        bucket: leasehold_core::BucketId,
    ) -> Result<leasehold_core::FencingToken, DirectoryError> {
        Storage::highest_token_in_bucket(self, bucket)
            .await
            .map_err(|e| DirectoryError { op: "highest_token_in_bucket", source: Box::new(e) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails_are_checked_once() {
        assert_eq!(" A@B.org ".parse::<Email>().unwrap().as_str(), "a@b.org");
        for bad in ["", "ab", "@b", "a@", "a b@c", "a@b@c"] {
            assert!(bad.parse::<Email>().is_err(), "{bad:?}");
        }
    }
}
