-- Refused IMAP logins, counted per account in a row: whoever owns the
-- account (after a restart or a takeover too) waits out the same backoff,
-- and past the limit nobody tries again until the password is updated.
-- login_retry_at is the earliest next attempt (ms since the epoch), also
-- set briefly by the owner's attempt itself so that its two loops (the
-- periodic poll and the INBOX watch) do not both try.
ALTER TABLE accounts ADD COLUMN login_failures BIGINT NOT NULL DEFAULT 0;
ALTER TABLE accounts ADD COLUMN login_retry_at BIGINT;
