-- Idempotency keys of `POST /v1/sagas/{name}`, the outbox relay's cursor and the webhook
-- deliveries (issue 3). Times are integer milliseconds since the Unix epoch (UTC).

-- One row per (client, key). The row is inserted in the same transaction as the saga it
-- started (`INSERT … ON CONFLICT DO NOTHING`), so the primary key decides between concurrent
-- identical requests: exactly one saga. `completed_at` NULL means the request that created it
-- is still running (it waits for the saga with `Prefer: wait`).
CREATE TABLE idempotency_keys (
    scope         TEXT NOT NULL,                -- the API client (ClientId)
    key           TEXT NOT NULL,
    fingerprint   TEXT NOT NULL,                -- sha256 of saga name, callback, canonical body
    saga_id       UUID NOT NULL,
    status_code   INTEGER,
    response_body TEXT,
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL,
    completed_at  BIGINT,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);

-- The callback URL a client registered when it started a saga (`Saga-Callback-Url`).
CREATE TABLE saga_callbacks (
    saga_id UUID PRIMARY KEY REFERENCES sagas (id),
    url     TEXT NOT NULL,
    secret  TEXT
);

-- The outbox is the events table. Event ids come from a sequence, so a transaction can commit
-- an event with a smaller id after one with a larger id has become visible: a relay reading
-- "id > cursor" would skip it for good. Each event therefore records its transaction id, and
-- relays read in (tx, id) order only below the oldest transaction still running
-- (`pg_snapshot_xmin`), where the order can no longer change.
ALTER TABLE events ADD COLUMN tx xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX events_outbox ON events (tx, id);

CREATE TABLE relay_cursors (
    name       TEXT PRIMARY KEY,
    tx         BIGINT NOT NULL DEFAULT 0,       -- xid8 of the last event read, as a number
    event_id   BIGINT NOT NULL DEFAULT 0,
    updated_at BIGINT NOT NULL
);

-- One row per (event, webhook target): pending (both times NULL), delivered or given up.
CREATE TABLE webhook_deliveries (
    event_id        BIGINT NOT NULL REFERENCES events (id),
    target          TEXT NOT NULL,
    saga_id         UUID NOT NULL,
    kind            TEXT NOT NULL,              -- 'callback' (the saga's) or 'subscriber' (global)
    attempts        INTEGER NOT NULL DEFAULT 0, -- also the fencing token of a claimed attempt
    next_attempt_at BIGINT NOT NULL,            -- due time; a claim pushes it past the lease
    delivered_at    BIGINT,
    failed_at       BIGINT,
    last_error      TEXT,
    last_status     INTEGER,
    PRIMARY KEY (event_id, target)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE delivered_at IS NULL AND failed_at IS NULL;
CREATE INDEX webhook_deliveries_saga ON webhook_deliveries (saga_id, target, event_id);
