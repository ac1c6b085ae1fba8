//! A record of which fencing token wrote each row, kept by the database
//! itself, for tests that try to break fencing (Postgres).
//!
//! [`FenceAudit::install`] adds a trigger on `messages` (every inserted,
//! updated or deleted row) and on `accounts` (every change of
//! `fence_token`: a claim, or an owner's first write) that appends to a
//! `fence_audit` table: the row, the account's token *as stored at that
//! moment* and the transaction id. A write transaction sets the token to its
//! own as its first statement, so for a message row the stored token is the
//! token it was written under. The audit rows of a transaction that rolls
//! back vanish with it: the record is of what was committed. `seq` comes from
//! a sequence, which is not transactional, so it orders the trigger firings
//! as they happened.
//!
//! The tests then assert on this record, never on logs:
//! [`FenceAudit::stale_writes`] lists every message row written under a token
//! older than one already recorded for its account.

use super::{HarnessError, Postgres, Result};

const INSTALL: &str = r#"
CREATE TABLE fence_audit (
    seq BIGSERIAL PRIMARY KEY,
    tbl TEXT NOT NULL,
    op TEXT NOT NULL,
    account_id TEXT NOT NULL,
    folder TEXT,
    uid BIGINT,
    stored_token BIGINT,
    txid BIGINT NOT NULL DEFAULT txid_current()
);
CREATE FUNCTION fence_audit_messages() RETURNS trigger AS $$
DECLARE
    r messages%ROWTYPE;
    t BIGINT;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    SELECT fence_token INTO t FROM accounts WHERE id = r.account_id;
    INSERT INTO fence_audit (tbl, op, account_id, folder, uid, stored_token)
        VALUES ('messages', TG_OP, r.account_id, r.folder, r.uid, t);
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER fence_audit_messages AFTER INSERT OR UPDATE OR DELETE ON messages
    FOR EACH ROW EXECUTE FUNCTION fence_audit_messages();
CREATE FUNCTION fence_audit_accounts() RETURNS trigger AS $$
BEGIN
    INSERT INTO fence_audit (tbl, op, account_id, stored_token)
        VALUES ('accounts', TG_OP, NEW.id, NEW.fence_token);
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER fence_audit_accounts AFTER UPDATE OF fence_token ON accounts
    FOR EACH ROW WHEN (OLD.fence_token IS DISTINCT FROM NEW.fence_token)
    EXECUTE FUNCTION fence_audit_accounts();
"#;

/// One audited firing: a message row written, or an account's token changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    /// Firing order.
    pub seq: i64,
    /// `messages` or `accounts`.
    pub table: String,
    /// `INSERT`, `UPDATE` or `DELETE`.
    pub op: String,
    /// The account.
    pub account: String,
    /// The message's folder (messages only).
    pub folder: Option<String>,
    /// The message's UID (messages only).
    pub uid: Option<i64>,
    /// The account's token as stored at that moment.
    pub token: i64,
    /// The writing transaction.
    pub txid: i64,
}

/// The audit trigger of one test database (see the [module docs](self)).
#[derive(Debug)]
pub struct FenceAudit<'a> {
    db: &'a Postgres,
}

impl<'a> FenceAudit<'a> {
    /// Installs the audit table and triggers in `db` (after the storage's
    /// migrations ran: open a `Storage` on it first).
    pub fn install(db: &'a Postgres) -> Result<Self> {
        db.execute(INSTALL)?;
        Ok(Self { db })
    }

    /// The audit of `db`, installed earlier (by [`FenceAudit::install`]).
    pub fn of(db: &'a Postgres) -> Self {
        Self { db }
    }

    /// Every audited firing, in order.
    pub fn rows(&self) -> Result<Vec<AuditRow>> {
        let rows = self.db.query(
            "SELECT seq, tbl, op, account_id, folder, uid, COALESCE(stored_token, -1), txid \
             FROM fence_audit ORDER BY seq",
        )?;
        rows.into_iter().map(|r| parse(&r)).collect()
    }

    /// The tokens recorded for `account`, in the order they took effect.
    pub fn claims(&self, account: &str) -> Result<Vec<i64>> {
        Ok(self
            .rows()?
            .into_iter()
            .filter(|r| r.table == "accounts" && r.account == account)
            .map(|r| r.token)
            .collect())
    }

    /// Message rows written under `token` for `account`.
    pub fn writes_under(&self, account: &str, token: i64) -> Result<usize> {
        Ok(self.rows()?.iter().filter(|r| r.table == "messages" && r.account == account && r.token == token).count())
    }

    /// Every message row written under a token older than one already
    /// recorded for its account: each would be a write of a replaced owner.
    pub fn stale_writes(&self) -> Result<Vec<String>> {
        let rows = self.rows()?;
        let mut highest: std::collections::HashMap<&str, (i64, i64)> = std::collections::HashMap::new();
        let mut stale = Vec::new();
        for r in &rows {
            match r.table.as_str() {
                "accounts" => {
                    let h = highest.entry(&r.account).or_insert((r.token, r.seq));
                    if r.token > h.0 {
                        *h = (r.token, r.seq);
                    }
                }
                _ => {
                    if let Some((t, at)) = highest.get(r.account.as_str()).filter(|(t, _)| *t > r.token) {
                        stale.push(format!(
                            "{} {}/{:?} uid {:?} written under token {} (txid {}, seq {}) after token {t} was recorded (seq {at})",
                            r.op, r.account, r.folder, r.uid, r.token, r.txid, r.seq
                        ));
                    }
                }
            }
        }
        Ok(stale)
    }
}

fn parse(r: &[String]) -> Result<AuditRow> {
    let bad = || HarnessError::Unexpected { what: "read a fence_audit row".into(), answer: format!("{r:?}") };
    let int = |i: usize| r.get(i).ok_or_else(bad)?.parse::<i64>().map_err(|_| bad());
    let opt = |i: usize| r.get(i).filter(|s| !s.is_empty()).cloned();
    if r.len() != 8 {
        return Err(bad());
    }
    Ok(AuditRow {
        seq: int(0)?,
        table: r[1].clone(),
        op: r[2].clone(),
        account: r[3].clone(),
        folder: opt(4),
        uid: opt(5).map(|s| s.parse().map_err(|_| bad())).transpose()?,
        token: int(6)?,
        txid: int(7)?,
    })
}
