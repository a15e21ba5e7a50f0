-- Pausing (SPEC §13). A pause asked while a worker drives the saga is kept in
-- `pause_requested` (the request's `{"actor", "reason"}` as JSON, NULL when none) until that
-- worker gives the saga back `PAUSED`; a paused saga keeps in `paused_from` the status a
-- resume gives it back. A resume gives a step whose retries ran out a fresh budget: the
-- attempts made before it (`budget_attempts`) and when it began (`budget_started_at`).
--
-- Nullable columns and a constant default rewrite no row.
ALTER TABLE sagas ADD COLUMN pause_requested TEXT;
ALTER TABLE sagas ADD COLUMN paused_from TEXT;
ALTER TABLE steps ADD COLUMN budget_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN budget_started_at INTEGER;
