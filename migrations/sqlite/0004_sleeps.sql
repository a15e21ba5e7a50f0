-- Durable sleeps: a step of kind `sleep` records its wake time when it starts, so that a
-- restart neither restarts nor loses it. Steps that call leave it NULL. Adding a nullable
-- column rewrites no row.
ALTER TABLE steps ADD COLUMN wake_at INTEGER;
