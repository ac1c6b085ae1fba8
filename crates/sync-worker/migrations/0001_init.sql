-- The same DDL runs on SQLite and Postgres: TEXT, BIGINT and composite keys
-- only (no SERIAL, no AUTOINCREMENT, no BLOB/BYTEA). Every table and index
-- leads with the account id, so messages can be partitioned by account later.

CREATE TABLE users (
    id TEXT PRIMARY KEY,
    email TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL
);

CREATE TABLE accounts (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    host TEXT NOT NULL,
    port BIGINT NOT NULL,
    security TEXT NOT NULL,
    username TEXT NOT NULL,
    -- base64(nonce || ChaCha20-Poly1305 ciphertext), the account id as associated data
    password_enc TEXT NOT NULL,
    -- the highest lease fencing token that has written for this account
    fence_token BIGINT NOT NULL DEFAULT 0,
    fence_owner TEXT,
    last_sync_at BIGINT,
    last_error TEXT,
    created_at BIGINT NOT NULL,
    UNIQUE (host, port, username)
);

CREATE INDEX accounts_by_user ON accounts (user_id);

-- Per-folder sync state. last_uid: every message up to it is stored (for
-- this uidvalidity); highestmodseq: every change up to it is stored.
CREATE TABLE folders (
    account_id TEXT NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    role TEXT,
    uidvalidity BIGINT,
    uidnext BIGINT,
    highestmodseq BIGINT,
    last_uid BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, name)
);

CREATE TABLE messages (
    account_id TEXT NOT NULL,
    folder TEXT NOT NULL,
    uidvalidity BIGINT NOT NULL,
    uid BIGINT NOT NULL,
    internal_date BIGINT,
    size BIGINT,
    -- space-separated IMAP flags, sorted
    flags TEXT NOT NULL,
    message_id TEXT,
    subject TEXT,
    from_addr TEXT,
    to_addrs TEXT,
    header TEXT,
    preview TEXT,
    PRIMARY KEY (account_id, folder, uidvalidity, uid),
    FOREIGN KEY (account_id, folder) REFERENCES folders (account_id, name) ON DELETE CASCADE
);

CREATE INDEX messages_by_date ON messages (account_id, internal_date);
