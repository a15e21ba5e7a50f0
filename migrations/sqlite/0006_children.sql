-- Child sagas and scheduled starts. A child saga names the saga and the stage that started it
-- (its id is derived from them, so the parent finds it without a column of its own). A saga
-- started with `Saga-Start-At` keeps the instant it was asked to start at.
ALTER TABLE sagas ADD COLUMN parent_id TEXT;
ALTER TABLE sagas ADD COLUMN parent_stage TEXT;
ALTER TABLE sagas ADD COLUMN scheduled_at INTEGER;
