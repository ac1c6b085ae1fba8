//! Reads about an account's folders that the engine needs to follow the
//! server's folder list (created, renamed and deleted folders).

use leasehold_core::LeaseKey;
use sqlx::Row;

use super::{query_err, Storage, StorageError};

impl Storage {
    /// The names of every folder storage holds for `account`.
    pub async fn folder_names(&self, account: &LeaseKey) -> Result<Vec<String>, StorageError> {
        let a = account.as_str();
        let rows = sqlx::query("SELECT name FROM folders WHERE account_id = $1 ORDER BY name")
            .bind(a)
            .fetch_all(self.pool())
            .await
            .map_err(query_err(format!("list the folders of {a}")))?;
        rows.iter()
            .map(|r| r.try_get::<String, _>(0).map_err(query_err(format!("read a folder name of {a}"))))
            .collect()
    }
}
