-- The durable step log on PostgreSQL. Same shape as the SQLite schema; times are integer
-- milliseconds since the Unix epoch (UTC). Lease times always come from saga_now_ms(), the
-- database clock, so that skewed worker clocks cannot break a lease.

CREATE FUNCTION saga_now_ms() RETURNS BIGINT
    LANGUAGE sql VOLATILE
    AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT $$;

CREATE TABLE sagas (
    id               UUID PRIMARY KEY,               -- UUIDv7: sorts by creation time
    name             TEXT NOT NULL,
    version          BIGINT NOT NULL,
    definition_hash  TEXT NOT NULL,
    definition_key   TEXT NOT NULL,                  -- name@version#hash
    status           TEXT NOT NULL,
    needs_attention  BOOLEAN NOT NULL DEFAULT FALSE,
    blocked          BOOLEAN NOT NULL DEFAULT FALSE,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    pivot_reached    BOOLEAN NOT NULL DEFAULT FALSE,
    input            JSONB NOT NULL,
    output           JSONB,
    error            TEXT,
    next_run_at      BIGINT,                          -- NULL once terminal
    lease_owner      TEXT,
    lease_epoch      BIGINT NOT NULL DEFAULT 0,       -- fencing token, bumped by every claim
    lease_expires_at BIGINT,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);

CREATE INDEX sagas_due ON sagas (next_run_at) WHERE next_run_at IS NOT NULL;
CREATE INDEX sagas_status ON sagas (status, id);
CREATE INDEX sagas_name ON sagas (name, id);
CREATE INDEX sagas_attention ON sagas (id) WHERE needs_attention;
CREATE INDEX sagas_lease_owner ON sagas (lease_owner) WHERE lease_owner IS NOT NULL;

CREATE TABLE steps (
    saga_id              UUID NOT NULL REFERENCES sagas (id),
    idx                  BIGINT NOT NULL,
    name                 TEXT NOT NULL,
    kind                 TEXT NOT NULL,
    status               TEXT NOT NULL,
    attempts             BIGINT NOT NULL DEFAULT 0,
    last_error           TEXT,
    outcome_unknown      BOOLEAN NOT NULL DEFAULT FALSE,
    output               JSONB,
    started_at           BIGINT,
    ended_at             BIGINT,
    comp_status          TEXT NOT NULL,
    comp_attempts        BIGINT NOT NULL DEFAULT 0,
    comp_last_error      TEXT,
    comp_outcome_unknown BOOLEAN NOT NULL DEFAULT FALSE,
    comp_started_at      BIGINT,
    comp_ended_at        BIGINT,
    PRIMARY KEY (saga_id, idx)
);

CREATE TABLE attempts (
    saga_id     UUID NOT NULL REFERENCES sagas (id),
    step_idx    BIGINT NOT NULL,
    phase       TEXT NOT NULL,
    attempt     BIGINT NOT NULL,
    worker      TEXT NOT NULL,
    lease_epoch BIGINT NOT NULL,
    started_at  BIGINT NOT NULL,
    ended_at    BIGINT,
    outcome     TEXT,
    error       TEXT,
    PRIMARY KEY (saga_id, step_idx, phase, attempt)
);

CREATE TABLE events (
    id      BIGSERIAL PRIMARY KEY,
    saga_id UUID NOT NULL REFERENCES sagas (id),
    at      BIGINT NOT NULL,
    type    TEXT NOT NULL,
    step    TEXT,
    data    JSONB NOT NULL DEFAULT '{}'
);
CREATE INDEX events_saga ON events (saga_id, id);

CREATE TABLE workers (
    id           TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          BIGINT NOT NULL,
    definitions  TEXT[] NOT NULL DEFAULT '{}',        -- what this worker can run
    started_at   BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL,
    stopped_at   BIGINT
);
