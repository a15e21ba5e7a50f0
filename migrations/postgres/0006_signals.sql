-- Signals: what `POST /v1/sagas/{id}/signals/{name}` delivered, kept until the saga's signal
-- step takes it (a signal may come before the saga reaches its wait). The first signal of a
-- name wins, so the name is part of the key. A signal step records the signal it waits for.
CREATE TABLE signals (
    saga_id         UUID NOT NULL,
    name            TEXT NOT NULL,
    payload         JSONB NOT NULL,
    idempotency_key TEXT,                         -- the sender's, if it gave one
    received_at     BIGINT NOT NULL,
    PRIMARY KEY (saga_id, name)
);

ALTER TABLE steps ADD COLUMN waiting_for TEXT;
