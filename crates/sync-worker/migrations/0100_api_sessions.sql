-- The API's users and sessions. A user added by the operator
-- (`sync-worker user add`) has no password and cannot log in over the API.
-- A session is stored only as the SHA-256 of its token (hex): a copy of this
-- table does not let anyone in.

ALTER TABLE users ADD COLUMN password_hash TEXT;

CREATE TABLE sessions (
    token_hash TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);

CREATE INDEX sessions_by_user ON sessions (user_id);
