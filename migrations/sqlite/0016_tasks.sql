-- Completion by callback (task tokens). A token names one attempt of one step and is signed
-- with the log's task key, so it is checked without a row of its own and never stored. `tasks`
-- keeps what a participant reported for an attempt (the first report wins; a repeat of it is
-- answered the same), until the step's driver takes it.
CREATE TABLE tasks (
    saga_id     TEXT NOT NULL,
    step_idx    INTEGER NOT NULL,
    phase       TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    outcome     TEXT NOT NULL,                    -- 'completed' or 'failed'
    result      TEXT NOT NULL,                    -- JSON: the output, or {"error", "retryable"}
    reported_at INTEGER NOT NULL,
    PRIMARY KEY (saga_id, step_idx, phase, attempt)
) WITHOUT ROWID;

-- Secrets of the log, made once by the first process that needs one (the task key).
CREATE TABLE secrets (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
