-- Schedules (SPEC §17): recurring starts of a saga, on a cron expression in a time zone or at a
-- fixed interval. `next_fire_at` is the next tick still to fire; a process fires a schedule
-- only while it holds the row's short lease (`lease_owner`, `lease_expires_at`), and a tick's
-- saga is a keyed start, so a tick fired twice still starts one saga.
CREATE TABLE schedules (
    id                TEXT PRIMARY KEY,
    saga              TEXT NOT NULL,
    cron              TEXT,
    every_ms          INTEGER,
    timezone          TEXT NOT NULL,
    input             TEXT NOT NULL,
    overlap           TEXT NOT NULL,
    catchup_window_ms INTEGER NOT NULL,
    paused            INTEGER NOT NULL DEFAULT 0,
    next_fire_at      INTEGER NOT NULL,
    buffered_at       INTEGER,
    last_saga_id      TEXT,
    lease_owner       TEXT,
    lease_expires_at  INTEGER,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL
) WITHOUT ROWID;

CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE NOT paused;

-- What happened to each tick (started, skipped, buffered, cancelled the previous run, missed,
-- failed), the last 100 per schedule.
CREATE TABLE schedule_runs (
    schedule_id  TEXT NOT NULL,
    scheduled_at INTEGER NOT NULL,
    outcome      TEXT NOT NULL,
    saga_id      TEXT,
    triggered    INTEGER NOT NULL DEFAULT 0,
    detail       TEXT,
    recorded_at  INTEGER NOT NULL,
    PRIMARY KEY (schedule_id, scheduled_at)
) WITHOUT ROWID;
