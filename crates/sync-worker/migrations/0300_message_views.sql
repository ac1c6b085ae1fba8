-- Whole messages as the API showed them (JSON: headers, bodies, the
-- attachment list), read on demand from IMAP and kept up to a per-account
-- size, least recently used (used_at) going first. A message's row going
-- (expunged, its folder reset or deleted, the account removed) takes its
-- cached view with it.
CREATE TABLE message_views (
    account_id TEXT NOT NULL,
    folder TEXT NOT NULL,
    uidvalidity BIGINT NOT NULL,
    uid BIGINT NOT NULL,
    body TEXT NOT NULL,
    size BIGINT NOT NULL,
    used_at BIGINT NOT NULL,
    PRIMARY KEY (account_id, folder, uidvalidity, uid),
    FOREIGN KEY (account_id, folder, uidvalidity, uid)
        REFERENCES messages (account_id, folder, uidvalidity, uid) ON DELETE CASCADE
);

CREATE INDEX message_views_by_use ON message_views (account_id, used_at);
