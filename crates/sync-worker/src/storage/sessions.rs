//! Users' password hashes and login sessions: what the API's sign-up,
//! login and logout read and write. A session is stored under the hash of
//! its token, never the token itself.

use leasehold_core::UserId;
use sqlx::Row;

use super::{corrupt, now_ms, query_err, Email, Storage, StorageError};

/// A stored session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    /// Its user.
    pub user: UserId,
    /// When it expires (ms since the epoch).
    pub expires_at: i64,
}

impl Storage {
    /// Records `user`'s password hash (a PHC string).
    pub async fn set_password_hash(&self, user: &UserId, hash: &str) -> Result<(), StorageError> {
        sqlx::query("UPDATE users SET password_hash = $1 WHERE id = $2")
            .bind(hash)
            .bind(user.as_str())
            .execute(&self.pool)
            .await
            .map_err(query_err(format!("set the password of user {user}")))?;
        Ok(())
    }

    /// The user with `email` and their password hash (`None`: no password set).
    pub async fn password_hash(&self, email: &Email) -> Result<Option<(UserId, Option<String>)>, StorageError> {
        let row = sqlx::query("SELECT id, password_hash FROM users WHERE email = $1")
            .bind(email.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(query_err(format!("read the password of user {email}")))?;
        let Some(row) = row else { return Ok(None) };
        let id: String = row.try_get(0).map_err(query_err("read user id"))?;
        let id = UserId::new(&id).map_err(|_| corrupt("", "user id", &id))?;
        Ok(Some((id, row.try_get(1).map_err(query_err("read password hash"))?)))
    }

    /// Stores a session for `user`, named by the hash of its token.
    pub async fn add_session(&self, token_hash: &str, user: &UserId, expires_at: i64) -> Result<(), StorageError> {
        sqlx::query("INSERT INTO sessions (token_hash, user_id, created_at, expires_at) VALUES ($1, $2, $3, $4)")
            .bind(token_hash)
            .bind(user.as_str())
            .bind(now_ms())
            .bind(expires_at)
            .execute(&self.pool)
            .await
            .map_err(query_err(format!("store a session of user {user}")))?;
        Ok(())
    }

    /// The unexpired session whose token hashes to `token_hash`, if any.
    pub async fn session(&self, token_hash: &str) -> Result<Option<SessionRecord>, StorageError> {
        let row = sqlx::query("SELECT user_id, expires_at FROM sessions WHERE token_hash = $1 AND expires_at > $2")
            .bind(token_hash)
            .bind(now_ms())
            .fetch_optional(&self.pool)
            .await
            .map_err(query_err("look up a session"))?;
        let Some(row) = row else { return Ok(None) };
        let id: String = row.try_get(0).map_err(query_err("read session user"))?;
        Ok(Some(SessionRecord {
            user: UserId::new(&id).map_err(|_| corrupt("", "session user", &id))?,
            expires_at: row.try_get(1).map_err(query_err("read session expiry"))?,
        }))
    }

    /// Deletes the session whose token hashes to `token_hash`, and every expired one.
    pub async fn remove_session(&self, token_hash: &str) -> Result<(), StorageError> {
        sqlx::query("DELETE FROM sessions WHERE token_hash = $1 OR expires_at <= $2")
            .bind(token_hash)
            .bind(now_ms())
            .execute(&self.pool)
            .await
            .map_err(query_err("delete a session"))?;
        Ok(())
    }
}
