//! Hash partitioning of `messages` by account on Postgres: an option for a
//! large deployment (`PG_MESSAGE_PARTITIONS`), applied once, after the
//! migrations. Every key and index of `messages` leads with the account id,
//! so each account's mail lives in one partition and every query of the
//! engine and the API (all of them name the account) reads one partition.
//!
//! The conversion is one transaction under an exclusive lock of `messages`:
//! the table is renamed aside, a partitioned `messages` is made with the
//! same columns, keys and indexes (by their own names, so later checks such
//! as the search index's still find them), the rows are copied, the foreign
//! keys that pointed at the old table are pointed at the new one, and the
//! old table is dropped. Two processes starting together serialise on the
//! lock; the second finds the work done.

use std::num::NonZeroU16;

use sqlx::Row;

use super::{query_err, DbKind, Storage, StorageError};

/// How `messages` is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessagesLayout {
    /// One table (SQLite, or Postgres without the option).
    Table,
    /// Hash-partitioned by account id into this many partitions.
    Partitioned(u16),
}

/// Why `messages` could not be partitioned as asked.
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    /// Partitioning is a Postgres feature.
    #[error(
        "PG_MESSAGE_PARTITIONS is for Postgres: this database is SQLite; unset it, or use a postgres:// DATABASE_URL"
    )]
    NotPostgres,
    /// The table is partitioned already, into another count.
    #[error(
        "messages is partitioned into {have} partitions, not the {asked} PG_MESSAGE_PARTITIONS asks for: \
         set PG_MESSAGE_PARTITIONS={have} (a count is fixed once the table is partitioned)"
    )]
    OtherCount {
        /// The partitions it has.
        have: u16,
        /// The partitions asked for.
        asked: u16,
    },
    /// Triggers on `messages` would not survive the conversion.
    #[error("messages has triggers ({names}): drop them, partition, then make them again")]
    Triggers {
        /// Their names.
        names: String,
    },
    /// The database failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl Storage {
    /// How `messages` is stored now.
    pub async fn messages_layout(&self) -> Result<MessagesLayout, StorageError> {
        if self.kind != DbKind::Postgres {
            return Ok(MessagesLayout::Table);
        }
        let row = sqlx::query(
            "SELECT c.relkind::text, (SELECT COUNT(*) FROM pg_inherits i WHERE i.inhparent = c.oid) \
             FROM pg_class c WHERE c.oid = to_regclass('messages')",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(query_err("read how messages is stored"))?;
        let kind: String = row.try_get(0).map_err(query_err("read how messages is stored"))?;
        let count: i64 = row.try_get(1).map_err(query_err("read how messages is stored"))?;
        Ok(if kind == "p" {
            MessagesLayout::Partitioned(u16::try_from(count).unwrap_or(u16::MAX))
        } else {
            MessagesLayout::Table
        })
    }

    /// Partitions `messages` by hash of the account id into `partitions`,
    /// keeping every row, key and index (see the module's docs). A table
    /// partitioned already into that count is left as it is; into another,
    /// it is an error.
    pub async fn partition_messages(&self, partitions: NonZeroU16) -> Result<MessagesLayout, PartitionError> {
        if self.kind != DbKind::Postgres {
            return Err(PartitionError::NotPostgres);
        }
        let asked = partitions.get();
        // Every start with the option comes here: once partitioned, a look
        // at the catalog answers, with no lock that would queue every query
        // of messages behind the running transactions.
        match self.messages_layout().await? {
            MessagesLayout::Partitioned(have) if have != asked => {
                return Err(PartitionError::OtherCount { have, asked });
            }
            MessagesLayout::Partitioned(have) => return Ok(MessagesLayout::Partitioned(have)),
            MessagesLayout::Table => {}
        }
        let mut tx = self.pool.begin().await.map_err(query_err("begin partitioning messages"))?;
        // Whoever comes second waits here, then finds the work done.
        sqlx::query("LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
            .execute(&mut *tx)
            .await
            .map_err(query_err("lock messages to partition it"))?;
        let kind: String = sqlx::query("SELECT relkind::text FROM pg_class WHERE oid = 'messages'::regclass")
            .fetch_one(&mut *tx)
            .await
            .and_then(|r| r.try_get(0))
            .map_err(query_err("read how messages is stored"))?;
        if kind == "p" {
            drop(tx);
            return match self.messages_layout().await? {
                MessagesLayout::Partitioned(have) if have != asked => Err(PartitionError::OtherCount { have, asked }),
                layout => Ok(layout),
            };
        }
        let triggers: Vec<String> = sqlx::query(
            "SELECT tgname::text FROM pg_trigger WHERE tgrelid = 'messages'::regclass AND NOT tgisinternal",
        )
        .fetch_all(&mut *tx)
        .await
        .and_then(|rows| rows.iter().map(|r| r.try_get(0)).collect())
        .map_err(query_err("read the triggers of messages"))?;
        if !triggers.is_empty() {
            return Err(PartitionError::Triggers { names: triggers.join(", ") });
        }
        let indexes: Vec<(String, String)> = sqlx::query(
            "SELECT i.relname::text, pg_get_indexdef(i.oid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid \
             WHERE x.indrelid = 'messages'::regclass AND NOT x.indisprimary ORDER BY i.relname",
        )
        .fetch_all(&mut *tx)
        .await
        .and_then(|rows| rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect())
        .map_err(query_err("read the indexes of messages"))?;
        let columns: Vec<String> = sqlx::query(
            "SELECT quote_ident(column_name::text) FROM information_schema.columns \
             WHERE table_schema = current_schema() AND table_name = 'messages' AND is_generated = 'NEVER' \
             ORDER BY ordinal_position",
        )
        .fetch_all(&mut *tx)
        .await
        .and_then(|rows| rows.iter().map(|r| r.try_get(0)).collect())
        .map_err(query_err("read the columns of messages"))?;
        // The foreign keys of other tables that point at messages, made again on the new table.
        let referencing: Vec<(String, String, String)> = sqlx::query(
            "SELECT conrelid::regclass::text, quote_ident(conname::text), pg_get_constraintdef(oid) \
             FROM pg_constraint WHERE confrelid = 'messages'::regclass AND contype = 'f'",
        )
        .fetch_all(&mut *tx)
        .await
        .and_then(|rows| rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))).collect())
        .map_err(query_err("read the foreign keys pointing at messages"))?;
        let own_keys: Vec<String> = sqlx::query(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint \
             WHERE conrelid = 'messages'::regclass AND contype IN ('p', 'f') ORDER BY contype DESC, conname",
        )
        .fetch_all(&mut *tx)
        .await
        .and_then(|rows| rows.iter().map(|r| r.try_get(0)).collect())
        .map_err(query_err("read the keys of messages"))?;

        let mut steps: Vec<String> = vec!["ALTER TABLE messages RENAME TO messages_unpartitioned".to_owned()];
        for (name, _) in &indexes {
            steps.push(format!("ALTER INDEX \"{name}\" RENAME TO \"{name}_unpartitioned\""));
        }
        steps.push("ALTER INDEX messages_pkey RENAME TO messages_unpartitioned_pkey".to_owned());
        steps.push(
            "CREATE TABLE messages (LIKE messages_unpartitioned INCLUDING DEFAULTS INCLUDING GENERATED \
             INCLUDING CONSTRAINTS) PARTITION BY HASH (account_id)"
                .to_owned(),
        );
        for remainder in 0..asked {
            steps.push(format!(
                "CREATE TABLE messages_p{remainder} PARTITION OF messages FOR VALUES WITH (MODULUS {asked}, REMAINDER {remainder})"
            ));
        }
        for key in &own_keys {
            steps.push(format!("ALTER TABLE messages ADD {key}"));
        }
        // The definitions name the table `messages`: now the new one.
        steps.extend(indexes.iter().map(|(_, def)| def.clone()));
        let list = columns.join(", ");
        steps.push(format!("INSERT INTO messages ({list}) SELECT {list} FROM messages_unpartitioned"));
        for (table, name, def) in &referencing {
            steps.push(format!("ALTER TABLE {table} DROP CONSTRAINT {name}"));
            // Read before the rename: the definition names `messages`, now the new table.
            steps.push(format!("ALTER TABLE {table} ADD CONSTRAINT {name} {def}"));
        }
        steps.push("DROP TABLE messages_unpartitioned".to_owned());
        for step in steps {
            // Built from the catalog's own definitions and fixed names; no value of a user's.
            sqlx::query(sqlx::AssertSqlSafe(step.as_str()))
                .execute(&mut *tx)
                .await
                .map_err(query_err(format!("partition messages: {step}")))?;
        }
        tx.commit().await.map_err(query_err("commit the partitioning of messages"))?;
        tracing::info!(partitions = asked, "messages is now hash-partitioned by account");
        Ok(MessagesLayout::Partitioned(asked))
    }
}
