-- The durable step log. Times are integer milliseconds since the Unix epoch (UTC): SQLite's own
-- date text does not compare with RFC 3339 text, integers always do.

CREATE TABLE sagas (
    id               TEXT PRIMARY KEY NOT NULL,      -- UUIDv7: sorts by creation time
    name             TEXT NOT NULL,
    version          INTEGER NOT NULL,
    definition_hash  TEXT NOT NULL,
    definition_key   TEXT NOT NULL,                  -- name@version#hash, matched against the registry
    status           TEXT NOT NULL,
    needs_attention  INTEGER NOT NULL DEFAULT 0,
    blocked          INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    pivot_reached    INTEGER NOT NULL DEFAULT 0,     -- the point of no return has started
    input            TEXT NOT NULL,                  -- JSON
    output           TEXT,                           -- JSON
    error            TEXT,
    next_run_at      INTEGER,                        -- NULL once terminal
    lease_owner      TEXT,
    lease_epoch      INTEGER NOT NULL DEFAULT 0,     -- fencing token, bumped by every claim
    lease_expires_at INTEGER,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);

-- Runnable sagas, by due time (partial: terminal sagas drop out of it).
CREATE INDEX sagas_due ON sagas (next_run_at) WHERE next_run_at IS NOT NULL;
CREATE INDEX sagas_status ON sagas (status, id);
CREATE INDEX sagas_name ON sagas (name, id);
CREATE INDEX sagas_attention ON sagas (id) WHERE needs_attention = 1;
CREATE INDEX sagas_lease_owner ON sagas (lease_owner) WHERE lease_owner IS NOT NULL;

CREATE TABLE steps (
    saga_id            TEXT NOT NULL REFERENCES sagas (id),
    idx                INTEGER NOT NULL,
    name               TEXT NOT NULL,
    kind               TEXT NOT NULL,
    status             TEXT NOT NULL,
    attempts           INTEGER NOT NULL DEFAULT 0,
    last_error         TEXT,
    outcome_unknown    INTEGER NOT NULL DEFAULT 0,
    output             TEXT,                          -- JSON
    started_at         INTEGER,
    ended_at           INTEGER,
    comp_status        TEXT NOT NULL,
    comp_attempts      INTEGER NOT NULL DEFAULT 0,
    comp_last_error    TEXT,
    comp_outcome_unknown INTEGER NOT NULL DEFAULT 0,
    comp_started_at    INTEGER,
    comp_ended_at      INTEGER,
    PRIMARY KEY (saga_id, idx)
) WITHOUT ROWID;

-- Every attempt of every action and compensation, not only the last error.
CREATE TABLE attempts (
    saga_id     TEXT NOT NULL REFERENCES sagas (id),
    step_idx    INTEGER NOT NULL,
    phase       TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    worker      TEXT NOT NULL,
    lease_epoch INTEGER NOT NULL,
    started_at  INTEGER NOT NULL,
    ended_at    INTEGER,
    outcome     TEXT,
    error       TEXT,
    PRIMARY KEY (saga_id, step_idx, phase, attempt)
) WITHOUT ROWID;

-- The event history of every saga, written in the same transaction as the change that caused
-- it: this table is also the transactional outbox.
CREATE TABLE events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    saga_id TEXT NOT NULL REFERENCES sagas (id),
    at      INTEGER NOT NULL,
    type    TEXT NOT NULL,
    step    TEXT,
    data    TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX events_saga ON events (saga_id, id);

-- Orchestrator processes, with their last heartbeat.
CREATE TABLE workers (
    id           TEXT PRIMARY KEY NOT NULL,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    stopped_at   INTEGER
);
