-- Schedules (SPEC §17): recurring starts of a saga, on a cron expression in a time zone or at a
-- fixed interval. `next_fire_at` is the next tick still to fire; a process fires a schedule
-- only while it holds the row's short lease (`lease_owner`, `lease_expires_at`), and a tick's
-- saga is a keyed start, so a tick fired twice still starts one saga.
CREATE TABLE schedules (
    id                TEXT PRIMARY KEY,
    saga              TEXT NOT NULL,
    cron              TEXT,
    every_ms          BIGINT,
    timezone          TEXT NOT NULL,
    input             JSONB NOT NULL,
    overlap           TEXT NOT NULL,
    catchup_window_ms BIGINT NOT NULL,
    paused            BOOLEAN NOT NULL DEFAULT FALSE,
    next_fire_at      BIGINT NOT NULL,
    buffered_at       BIGINT,
    last_saga_id      UUID,
    lease_owner       TEXT,
    lease_expires_at  BIGINT,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL
);

CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE NOT paused;

-- What happened to each tick (started, skipped, buffered, cancelled the previous run, missed,
-- failed), the last 100 per schedule.
CREATE TABLE schedule_runs (
    schedule_id  TEXT NOT NULL,
    scheduled_at BIGINT NOT NULL,
    outcome      TEXT NOT NULL,
    saga_id      UUID,
    triggered    BOOLEAN NOT NULL DEFAULT FALSE,
    detail       TEXT,
    recorded_at  BIGINT NOT NULL,
    PRIMARY KEY (schedule_id, scheduled_at)
);
