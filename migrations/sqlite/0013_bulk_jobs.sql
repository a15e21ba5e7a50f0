-- Durable bulk actions (`POST /v1/bulk`): a job, and the sagas its filter matched when it was
-- created, one row each, so that its count is exact and sagas created later are not touched.
-- A process works a job while it holds the job's lease (`lease_owner` until
-- `lease_expires_at`); `lease_epoch` is bumped by every claim. An item goes from `PENDING` to
-- `DONE` in the transaction of the command that acts on its saga, so a saga is acted on at most
-- once whatever crashes; or to `REFUSED`, with the command's error code and message.
CREATE TABLE bulk_jobs (
    id               TEXT PRIMARY KEY NOT NULL,
    action           TEXT NOT NULL,
    filter           TEXT NOT NULL,
    reason           TEXT NOT NULL,
    actor            TEXT NOT NULL,
    status           TEXT NOT NULL,
    matched          INTEGER NOT NULL,
    done             INTEGER NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_epoch      INTEGER NOT NULL DEFAULT 0,
    lease_expires_at INTEGER,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);
CREATE INDEX bulk_jobs_running ON bulk_jobs (status, id);

CREATE TABLE bulk_items (
    job_id  TEXT NOT NULL,
    saga_id TEXT NOT NULL,
    state   TEXT NOT NULL,
    code    TEXT,
    message TEXT,
    PRIMARY KEY (job_id, saga_id)
);
CREATE INDEX bulk_items_state ON bulk_items (job_id, state, saga_id);
