//! Searching stored mail with each database's own full-text index: FTS5 on
//! SQLite (an external-content table over `messages`, kept by triggers),
//! a generated `tsvector` column with a GIN index on Postgres. Subject,
//! sender, recipients and the preview are indexed.
//!
//! The index is made when a database is opened (it is the one schema part
//! the two databases cannot share, so it is not a migration): only when it
//! is missing, so a worker's start takes no table lock once it exists.
//!
//! A query is split into words (letters and digits); each must occur, as a
//! word or the start of one, so both databases find the same messages.
//! Results come newest first (INTERNALDATE, then folder and UID), paged by
//! a [`SearchCursor`].

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine as _;
use sqlx::Row;

use super::views::{SummaryColumns, SUMMARY_COLUMNS};
use super::{query_err, DbKind, Storage, StorageError};
use crate::storage::MessageSummary;

/// Most words a query may have.
pub const MAX_TERMS: usize = 16;

/// Matches (in the whole index) above which a SQLite search walks the
/// account newest first instead of sorting its matches: sorting a few
/// thousand rows costs about what walking to a page does.
const BROAD: i64 = 2_000;

/// Where a page of search results ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchCursor {
    /// The last result's INTERNALDATE (ms; 0 when unknown).
    pub date: i64,
    /// Its folder.
    pub folder: String,
    /// Its UID.
    pub uid: u32,
}

impl SearchCursor {
    /// The opaque `cursor` the API shows.
    pub fn encode(&self) -> String {
        B64URL.encode(format!("s:{}:{}:{}", self.date, self.uid, self.folder))
    }

    /// Reads a cursor made by [`SearchCursor::encode`]; `None` when it is not one.
    pub fn decode(s: &str) -> Option<Self> {
        let raw = String::from_utf8(B64URL.decode(s).ok()?).ok()?;
        let mut parts = raw.strip_prefix("s:")?.splitn(3, ':');
        Some(Self {
            date: parts.next()?.parse().ok()?,
            uid: parts.next()?.parse().ok()?,
            folder: parts.next()?.to_string(),
        })
    }
}

/// The words of a query, lowercased: runs of letters and digits, at most
/// [`MAX_TERMS`], each cut to 64 characters.
pub fn search_terms(q: &str) -> Vec<String> {
    q.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.chars().take(64).collect::<String>().to_lowercase())
        .take(MAX_TERMS)
        .collect()
}

const SQLITE_INDEX: [&str; 5] = [
    "CREATE VIRTUAL TABLE messages_fts USING fts5(subject, from_addr, to_addrs, preview, \
     content = 'messages', content_rowid = 'rowid', tokenize = 'unicode61 remove_diacritics 2')",
    // `messages` has no INTEGER PRIMARY KEY, so its rowids are kept as long
    // as nothing VACUUMs it (nothing here does).
    "CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN \
     INSERT INTO messages_fts (rowid, subject, from_addr, to_addrs, preview) \
     VALUES (new.rowid, new.subject, new.from_addr, new.to_addrs, new.preview); END",
    "CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN \
     INSERT INTO messages_fts (messages_fts, rowid, subject, from_addr, to_addrs, preview) \
     VALUES ('delete', old.rowid, old.subject, old.from_addr, old.to_addrs, old.preview); END",
    "CREATE TRIGGER messages_fts_update AFTER UPDATE OF subject, from_addr, to_addrs, preview ON messages BEGIN \
     INSERT INTO messages_fts (messages_fts, rowid, subject, from_addr, to_addrs, preview) \
     VALUES ('delete', old.rowid, old.subject, old.from_addr, old.to_addrs, old.preview); \
     INSERT INTO messages_fts (rowid, subject, from_addr, to_addrs, preview) \
     VALUES (new.rowid, new.subject, new.from_addr, new.to_addrs, new.preview); END",
    // Mail stored before the index existed.
    "INSERT INTO messages_fts (messages_fts) VALUES ('rebuild')",
];

const POSTGRES_INDEX: [&str; 2] = [
    // Addresses are split at `@` and `.` as SQLite's tokenizer splits them
    // (Postgres's parser would keep `carol@example.org` one token).
    "ALTER TABLE messages ADD COLUMN IF NOT EXISTS search tsvector GENERATED ALWAYS AS (to_tsvector('simple', \
     translate(coalesce(subject, '') || ' ' || coalesce(from_addr, '') || ' ' || coalesce(to_addrs, '') || ' ' || \
     coalesce(preview, ''), '@.', '  '))) STORED",
    "CREATE INDEX IF NOT EXISTS messages_search ON messages USING GIN (search)",
];

impl Storage {
    /// Makes the full-text index when it is missing.
    pub(super) async fn ensure_search_index(&self) -> Result<(), StorageError> {
        let (probe, steps): (&str, &[&str]) = match self.kind {
            DbKind::Sqlite => ("SELECT COUNT(*) FROM sqlite_master WHERE name = 'messages_fts'", &SQLITE_INDEX),
            DbKind::Postgres => (
                "SELECT COUNT(*) FROM pg_indexes WHERE schemaname = current_schema() AND indexname = 'messages_search'",
                &POSTGRES_INDEX,
            ),
        };
        let present: i64 = sqlx::query(sqlx::AssertSqlSafe(probe))
            .fetch_one(&self.pool)
            .await
            .and_then(|r| r.try_get(0))
            .map_err(query_err("look for the search index"))?;
        if present > 0 {
            return Ok(());
        }
        let mut tx = self.pool.begin().await.map_err(query_err("begin making the search index"))?;
        for step in steps {
            // Constant DDL, no value.
            sqlx::query(sqlx::AssertSqlSafe(*step))
                .execute(&mut *tx)
                .await
                .map_err(query_err("make the search index"))?;
        }
        tx.commit().await.map_err(query_err("commit the search index"))?;
        tracing::info!(database = ?self.kind, "made the full-text search index");
        Ok(())
    }

    /// The messages of `account` (in `folder`, or in all its folders) whose
    /// subject, sender, recipients or preview hold every one of `terms`
    /// (from [`search_terms`]), newest first, after `after`: at most `limit`.
    pub async fn search_messages(
        &self,
        account: &str,
        folder: Option<&str>,
        terms: &[String],
        after: Option<&SearchCursor>,
        limit: u32,
    ) -> Result<Vec<(MessageSummary, SearchCursor)>, StorageError> {
        self.search_with(account, folder, terms, after, limit, None).await
    }

    /// [`Storage::search_messages`] by the plan for a query that matches
    /// most mail (SQLite), whatever it matches: tests hold both plans to
    /// the same answers.
    #[cfg(any(test, feature = "test-support"))]
    pub async fn search_messages_walking(
        &self,
        account: &str,
        folder: Option<&str>,
        terms: &[String],
        after: Option<&SearchCursor>,
        limit: u32,
    ) -> Result<Vec<(MessageSummary, SearchCursor)>, StorageError> {
        self.search_with(account, folder, terms, after, limit, Some(true)).await
    }

    async fn search_with(
        &self,
        account: &str,
        folder: Option<&str>,
        terms: &[String],
        after: Option<&SearchCursor>,
        limit: u32,
        walk: Option<bool>,
    ) -> Result<Vec<(MessageSummary, SearchCursor)>, StorageError> {
        let (from, matches, query) = match self.kind {
            DbKind::Sqlite => {
                let query = terms.iter().map(|t| format!("\"{t}\"*")).collect::<Vec<_>>().join(" ");
                let walk = match walk {
                    Some(walk) => walk,
                    None => self.matches_more_than(&query, BROAD).await?,
                };
                // The matches are found once either way (a MATCH per
                // message costs a walk of the term's whole doclist each).
                let matches = "m.rowid IN (SELECT rowid FROM messages_fts WHERE messages_fts MATCH $1)";
                if walk {
                    // Most mail matches: walk the account newest first,
                    // stopping at a page, rather than sort every match.
                    ("messages m INDEXED BY messages_newest_first", matches, query)
                } else {
                    // Few matches: look each up and sort them (the planner
                    // would walk the whole account by the index otherwise).
                    ("messages m NOT INDEXED", matches, query)
                }
            }
            DbKind::Postgres => (
                "messages m",
                "m.search @@ to_tsquery('simple', $1)",
                terms.iter().map(|t| format!("{t}:*")).collect::<Vec<_>>().join(" & "),
            ),
        };
        let folder_match = if folder.is_some() { "AND m.folder = $3" } else { "AND $3 = $3" };
        // Every column is `m.`'s (FTS5's share the names).
        let columns: Vec<String> = SUMMARY_COLUMNS.split(", ").map(|c| format!("m.{c}")).collect();
        let columns = columns.join(", ");
        // Only constant SQL and the limit (a `u32`) are spliced in.
        let sql = format!(
            "SELECT {columns}, m.folder, m.uidvalidity FROM {from} \
             JOIN folders f ON f.account_id = m.account_id AND f.name = m.folder AND f.uidvalidity = m.uidvalidity \
             WHERE {matches} AND m.account_id = $2 {folder_match} \
             AND (COALESCE(m.internal_date, 0) < $4 OR (COALESCE(m.internal_date, 0) = $4 \
                  AND (m.folder < $5 OR (m.folder = $5 AND m.uid < $6)))) \
             ORDER BY COALESCE(m.internal_date, 0) DESC, m.folder DESC, m.uid DESC LIMIT {limit}"
        );
        let op = || format!("search the messages of {account}");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(query)
            .bind(account)
            .bind(folder.unwrap_or(""))
            .bind(after.map_or(i64::MAX, |c| c.date))
            .bind(after.map_or("", |c| c.folder.as_str()))
            .bind(after.map_or(i64::MAX, |c| i64::from(c.uid)))
            .fetch_all(&self.pool)
            .await
            .map_err(query_err(op()))?;
        rows.iter()
            .map(|row| {
                let folder: String = row.try_get(8).map_err(query_err(op()))?;
                let uidvalidity: i64 = row.try_get(9).map_err(query_err(op()))?;
                let uidvalidity =
                    u32::try_from(uidvalidity).map_err(|_| super::corrupt(account, "uidvalidity", uidvalidity))?;
                let summary = SummaryColumns::of_row(account, &folder, row)?.summary(account, &folder, uidvalidity)?;
                let cursor = SearchCursor { date: summary.date.unwrap_or(0), folder, uid: summary.uid };
                Ok((summary, cursor))
            })
            .collect()
    }
}

impl Storage {
    /// Whether the FTS5 query `query` matches more than `n` messages (of
    /// every account): it reads at most `n + 1` of its matches.
    async fn matches_more_than(&self, query: &str, n: i64) -> Result<bool, StorageError> {
        let count: i64 =
            sqlx::query("SELECT COUNT(*) FROM (SELECT rowid FROM messages_fts WHERE messages_fts MATCH $1 LIMIT $2)")
                .bind(query)
                .bind(n + 1)
                .fetch_one(&self.pool)
                .await
                .and_then(|r| r.try_get(0))
                .map_err(query_err("count search matches"))?;
        Ok(count > n)
    }

    /// The stored messages `uids` of `account`/`folder` under `uidvalidity`
    /// (what an IMAP body search found), with their cursors; UIDs not
    /// stored are left out.
    pub async fn summaries_of(
        &self,
        account: &str,
        folder: &str,
        uidvalidity: u32,
        uids: &[u32],
    ) -> Result<Vec<(MessageSummary, SearchCursor)>, StorageError> {
        let op = || format!("read found messages of {account}/{folder}");
        let mut out = Vec::new();
        for chunk in uids.chunks(500) {
            let list: Vec<String> = (0..chunk.len()).map(|i| format!("${}", i + 4)).collect();
            // Only generated placeholders are spliced in.
            let sql = format!(
                "SELECT {SUMMARY_COLUMNS} FROM messages WHERE account_id = $1 AND folder = $2 AND uidvalidity = $3 \
                 AND uid IN ({})",
                list.join(", ")
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(account).bind(folder).bind(i64::from(uidvalidity));
            for uid in chunk {
                q = q.bind(i64::from(*uid));
            }
            for row in q.fetch_all(&self.pool).await.map_err(query_err(op()))? {
                let summary = SummaryColumns::of_row(account, folder, &row)?.summary(account, folder, uidvalidity)?;
                let cursor =
                    SearchCursor { date: summary.date.unwrap_or(0), folder: folder.to_string(), uid: summary.uid };
                out.push((summary, cursor));
            }
        }
        Ok(out)
    }
}

impl SearchCursor {
    /// Whether a result at `self` comes after one at `other` (newest first:
    /// older date, then folder and UID downward), as the SQL orders them.
    pub fn is_after(&self, other: &SearchCursor) -> bool {
        (self.date, &self.folder, self.uid) < (other.date, &other.folder, other.uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_become_words_both_databases_match_alike() {
        assert_eq!(
            search_terms("Invoice #42 from carol@example.org"),
            ["invoice", "42", "from", "carol", "example", "org"]
        );
        assert_eq!(search_terms("Grüße, KÖLN"), ["grüße", "köln"]);
        assert!(search_terms("\" * ( ) : -").is_empty());
        assert_eq!(search_terms(&"w ".repeat(40)).len(), MAX_TERMS);
    }

    #[test]
    fn cursors_round_trip_and_list_cursors_are_not_search_cursors() {
        let c = SearchCursor { date: 1_796_000_000_000, folder: "A:b/Ü".into(), uid: 7 };
        assert_eq!(SearchCursor::decode(&c.encode()), Some(c));
        assert_eq!(SearchCursor::decode(&B64URL.encode("7:99")), None);
        assert_eq!(SearchCursor::decode("!!"), None);
    }
}
