//! The database's deployment id (see `migrations/0200_deployment.sql`).

use sqlx::Row;

use super::{query_err, Storage, StorageError};

impl Storage {
    /// This database's deployment id, made (a UUID) and recorded on first use.
    pub async fn deployment_id(&self) -> Result<String, StorageError> {
        // Of two workers starting together on a fresh database, one inserts.
        sqlx::query("INSERT INTO deployment (singleton, id) VALUES (1, $1) ON CONFLICT (singleton) DO NOTHING")
            .bind(uuid::Uuid::new_v4().to_string())
            .execute(&self.pool)
            .await
            .map_err(query_err("record the deployment id"))?;
        let row = sqlx::query("SELECT id FROM deployment WHERE singleton = 1")
            .fetch_one(&self.pool)
            .await
            .map_err(query_err("read the deployment id"))?;
        row.try_get(0).map_err(query_err("read the deployment id"))
    }
}
