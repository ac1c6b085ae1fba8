-- Webhooks: a user's receivers of mail events, and the deliveries owed to
-- them (an outbox).
--
-- A delivery row is written in the same fenced transaction as the mail
-- change it announces, so an event is never lost between the commit and the
-- queue: a stale owner's rolled-back write announces nothing. Deliveries are
-- grouped into batches, one per commit; each batch is one run of the unit
-- queue (run id = run_id, one unit per delivery), which hands each delivery
-- to one worker at a time, reclaims it from a dead worker and counts its
-- retries. The rows here say what was delivered; the queue says who is on it.

CREATE TABLE webhooks (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    url TEXT NOT NULL,
    -- Event names, space-separated (`message.new message.deleted`).
    events TEXT NOT NULL,
    -- The signing secret, sealed with SECRET_KEY (as IMAP passwords are).
    secret TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    -- Set when a delivery used up its retries: no POST goes out until the
    -- user resumes it; events meanwhile are held.
    paused_at BIGINT,
    paused_reason TEXT,
    last_success_at BIGINT,
    last_failure_at BIGINT,
    last_error TEXT
);

CREATE INDEX webhooks_by_user ON webhooks (user_id);

CREATE TABLE webhook_batches (
    run_id TEXT PRIMARY KEY,
    created_at BIGINT NOT NULL,
    -- 0 while a delivery of it may still be attempted.
    done BIGINT NOT NULL DEFAULT 0
);

CREATE INDEX webhook_batches_open ON webhook_batches (done, created_at);

CREATE TABLE webhook_deliveries (
    -- The unit id in the batch's run.
    id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES webhook_batches (run_id) ON DELETE CASCADE,
    webhook_id TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    -- The event's id, the same in every webhook's delivery of it: a
    -- receiver drops duplicates by it.
    event_id TEXT NOT NULL,
    event TEXT NOT NULL,
    -- The JSON body, exactly as signed and sent.
    body TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    -- pending, delivered, failed (retries used up), held (its webhook is paused)
    state TEXT NOT NULL DEFAULT 'pending',
    attempts BIGINT NOT NULL DEFAULT 0,
    last_status BIGINT,
    last_error TEXT,
    finished_at BIGINT
);

CREATE INDEX webhook_deliveries_by_run ON webhook_deliveries (run_id);
CREATE INDEX webhook_deliveries_by_webhook ON webhook_deliveries (webhook_id, created_at);
