//! One mailbox, one account per user: uniqueness is per user, on the host
//! (lower-cased), the port and the username (case-insensitive), and two
//! names of one server count as one by the address that took the login.
//! Two users may each hold the same mailbox.
//!
//! The first schema made `(host, port, username)` unique across all users,
//! inline in `CREATE TABLE accounts`. Postgres drops that constraint; SQLite
//! cannot drop an inline constraint, so the table is rebuilt without it
//! (SQLite's documented procedure: foreign keys off, copy, drop, rename),
//! once, at open. Then a per-user unique index takes its place.

use std::net::IpAddr;

use leasehold_core::UserId;
use sqlx::Row;

use super::{query_err, DbKind, Storage, StorageError};

/// The per-user index that replaces the global constraint.
const PER_USER_INDEX: &str =
    "CREATE UNIQUE INDEX IF NOT EXISTS accounts_unique_per_user ON accounts (user_id, lower(host), port, lower(username))";

/// The global constraint's text in SQLite's stored `CREATE TABLE`.
const GLOBAL_UNIQUE: &str = "UNIQUE (host, port, username)";

impl Storage {
    /// Replaces the global uniqueness of 0001 by the per-user index; does
    /// nothing once done.
    ///
    /// Every start runs this, beside running workers: it reads the catalog
    /// first and takes no lock once done (an `ALTER TABLE` or a
    /// `CREATE INDEX` waits for every open write transaction of the table,
    /// and every write after it waits behind it).
    pub(super) async fn ensure_per_user_accounts(&self) -> Result<(), StorageError> {
        let per_user = match self.kind {
            DbKind::Postgres => {
                let global = "SELECT COUNT(*) FROM pg_constraint WHERE conname = 'accounts_host_port_username_key'";
                if self.catalog_count(global).await? > 0 {
                    sqlx::query("ALTER TABLE accounts DROP CONSTRAINT IF EXISTS accounts_host_port_username_key")
                        .execute(&self.pool)
                        .await
                        .map_err(query_err("drop the global account uniqueness"))?;
                }
                "SELECT COUNT(*) FROM pg_indexes WHERE indexname = 'accounts_unique_per_user'"
            }
            DbKind::Sqlite => {
                // Reads the stored schema and rebuilds only while it holds the constraint.
                self.rebuild_sqlite_accounts().await?;
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = 'accounts_unique_per_user'"
            }
        };
        if self.catalog_count(per_user).await? == 0 {
            let made = sqlx::query(PER_USER_INDEX).execute(&self.pool).await;
            // Two processes starting at once on a new database both try;
            // Postgres's IF NOT EXISTS does not hold under that race.
            if let Err(e) = made {
                if self.catalog_count(per_user).await? == 0 {
                    return Err(query_err("make the per-user account index")(e));
                }
            }
        }
        Ok(())
    }

    pub(super) async fn catalog_count(&self, sql: &'static str) -> Result<i64, StorageError> {
        sqlx::query(sql)
            .fetch_one(&self.pool)
            .await
            .and_then(|row| row.try_get(0))
            .map_err(query_err("read the accounts table's constraints"))
    }

    async fn rebuild_sqlite_accounts(&self) -> Result<(), StorageError> {
        let sql: String = sqlx::query("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'accounts'")
            .fetch_one(&self.pool)
            .await
            .and_then(|row| row.try_get(0))
            .map_err(query_err("read the accounts table's schema"))?;
        let Some(at) = sql.find(GLOBAL_UNIQUE) else { return Ok(()) };
        // The constraint with the comma before it; columns added later may follow it.
        let before = sql[..at].trim_end();
        let Some(without_comma) = before.strip_suffix(',') else {
            return Err(StorageError::Corrupt {
                account: "(schema)".into(),
                field: "accounts table",
                value: sql.clone(),
            });
        };
        let rebuilt = format!("{without_comma}{}", &sql[at + GLOBAL_UNIQUE.len()..]);
        // A table once renamed is stored with its name quoted.
        let rebuilt = ["CREATE TABLE \"accounts\"", "CREATE TABLE accounts"]
            .iter()
            .find(|head| rebuilt.starts_with(*head))
            .map(|head| format!("CREATE TABLE accounts_rebuilt{}", &rebuilt[head.len()..]))
            .ok_or_else(|| StorageError::Corrupt {
                account: "(schema)".into(),
                field: "accounts table",
                value: sql.clone(),
            })?;
        let step = |what: &'static str| query_err(format!("rebuild the accounts table: {what}"));
        let mut conn = self.pool.acquire().await.map_err(step("connect"))?;
        // Off outside the transaction (SQLite ignores it inside one), so the
        // DROP deletes no message through ON DELETE CASCADE.
        sqlx::query("PRAGMA foreign_keys = OFF").execute(&mut *conn).await.map_err(step("foreign keys off"))?;
        let result = async {
            sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await.map_err(step("begin"))?;
            let steps = async {
                // Built from the stored schema, not from input.
                let create = sqlx::query(sqlx::AssertSqlSafe(rebuilt));
                create.execute(&mut *conn).await.map_err(step("create"))?;
                let steps: [(&'static str, &'static str); 4] = [
                    ("INSERT INTO accounts_rebuilt SELECT * FROM accounts", "copy"),
                    ("DROP TABLE accounts", "drop the old table"),
                    ("ALTER TABLE accounts_rebuilt RENAME TO accounts", "rename"),
                    ("CREATE INDEX IF NOT EXISTS accounts_by_user ON accounts (user_id)", "index by user"),
                ];
                for (sql, what) in steps {
                    sqlx::query(sql).execute(&mut *conn).await.map_err(step(what))?;
                }
                let broken =
                    sqlx::query("PRAGMA foreign_key_check").fetch_all(&mut *conn).await.map_err(step("check"))?;
                if !broken.is_empty() {
                    return Err(StorageError::Corrupt {
                        account: "(schema)".into(),
                        field: "foreign keys after the accounts rebuild",
                        value: format!("{} rows", broken.len()),
                    });
                }
                Ok(())
            }
            .await;
            let end = if steps.is_ok() { "COMMIT" } else { "ROLLBACK" };
            sqlx::query(end).execute(&mut *conn).await.map_err(step("commit"))?;
            steps
        }
        .await;
        sqlx::query("PRAGMA foreign_keys = ON").execute(&mut *conn).await.map_err(step("foreign keys on"))?;
        result
    }

    /// The id of `user`'s account that is the same mailbox as (`host`,
    /// `port`, `username`) at `server_ip`, if any: the same port and
    /// username (case-insensitive), and the same host (case-insensitive) or
    /// the same server address; `except` is not counted (an update's own).
    pub async fn same_mailbox(
        &self,
        user: &UserId,
        host: &str,
        port: u16,
        username: &str,
        server_ip: Option<IpAddr>,
        except: Option<&str>,
    ) -> Result<Option<String>, StorageError> {
        let rows = sqlx::query(
            "SELECT id, host, server_ip FROM accounts WHERE user_id = $1 AND port = $2 AND lower(username) = lower($3)",
        )
        .bind(user.as_str())
        .bind(i64::from(port))
        .bind(username)
        .fetch_all(&self.pool)
        .await
        .map_err(query_err(format!("look up {user}'s accounts of {username}@{host}:{port}")))?;
        let ip = server_ip.map(|ip| ip.to_canonical().to_string());
        for row in rows {
            let get = |c| query_err(format!("read {c} of an account of {user}"));
            let id: String = row.try_get(0).map_err(get("id"))?;
            let their_host: String = row.try_get(1).map_err(get("host"))?;
            let their_ip: Option<String> = row.try_get(2).map_err(get("server_ip"))?;
            if except == Some(id.as_str()) {
                continue;
            }
            if their_host.eq_ignore_ascii_case(host) || (ip.is_some() && their_ip == ip) {
                return Ok(Some(id));
            }
        }
        Ok(None)
    }

    /// Records the address of the server that took `account`'s login.
    pub async fn record_server_ip(&self, account: &str, server_ip: IpAddr) -> Result<(), StorageError> {
        sqlx::query("UPDATE accounts SET server_ip = $1 WHERE id = $2")
            .bind(server_ip.to_canonical().to_string())
            .bind(account)
            .execute(&self.pool)
            .await
            .map_err(query_err(format!("record the server address of {account}")))?;
        Ok(())
    }
}
