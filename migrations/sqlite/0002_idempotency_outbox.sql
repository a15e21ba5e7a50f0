-- Idempotency keys of `POST /v1/sagas/{name}`, the outbox relay's cursor and the webhook
-- deliveries (issue 3). Times are integer milliseconds since the Unix epoch (UTC).

-- One row per (client, key). The row is inserted in the same transaction as the saga it
-- started, so the primary key decides between concurrent identical requests: exactly one saga.
-- `completed_at` NULL means the request that created it is still running (it waits for the
-- saga with `Prefer: wait`); otherwise `status_code` and `response_body` are replayed.
CREATE TABLE idempotency_keys (
    scope         TEXT NOT NULL,                -- the API client (ClientId)
    key           TEXT NOT NULL,
    fingerprint   TEXT NOT NULL,                -- sha256 of saga name, callback, canonical body
    saga_id       TEXT NOT NULL,
    status_code   INTEGER,
    response_body TEXT,
    created_at    INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL,
    completed_at  INTEGER,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);

-- The callback URL a client registered when it started a saga (`Saga-Callback-Url`), written
-- in the saga's own transaction.
CREATE TABLE saga_callbacks (
    saga_id TEXT PRIMARY KEY NOT NULL REFERENCES sagas (id),
    url     TEXT NOT NULL,
    secret  TEXT                                -- signs this saga's deliveries, if given
);

-- How far each outbox relay has read the events table (the outbox). `tx` is unused on SQLite,
-- whose writers commit in event-id order.
CREATE TABLE relay_cursors (
    name       TEXT PRIMARY KEY NOT NULL,
    tx         INTEGER NOT NULL DEFAULT 0,
    event_id   INTEGER NOT NULL DEFAULT 0,
    updated_at INTEGER NOT NULL
);

-- One row per (event, webhook target): pending (both times NULL), delivered or given up.
CREATE TABLE webhook_deliveries (
    event_id        INTEGER NOT NULL REFERENCES events (id),
    target          TEXT NOT NULL,              -- the URL
    saga_id         TEXT NOT NULL,
    kind            TEXT NOT NULL,              -- 'callback' (the saga's) or 'subscriber' (global)
    attempts        INTEGER NOT NULL DEFAULT 0, -- also the fencing token of a claimed attempt
    next_attempt_at INTEGER NOT NULL,           -- due time; a claim pushes it past the lease
    delivered_at    INTEGER,
    failed_at       INTEGER,                    -- gave up after the last attempt
    last_error      TEXT,
    last_status     INTEGER,
    PRIMARY KEY (event_id, target)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE delivered_at IS NULL AND failed_at IS NULL;
CREATE INDEX webhook_deliveries_saga ON webhook_deliveries (saga_id, target, event_id);
