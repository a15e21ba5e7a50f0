-- The events table without AUTOINCREMENT. Its ids stay what they were, and a new event still
-- takes the largest id so far plus one, because no event is ever deleted; the relay's cursors
-- stay valid. AUTOINCREMENT read and rewrote the `sqlite_sequence` row inside every INSERT
-- statement, once per event written: about 4 % of the single writer's instructions
-- (BENCHMARKS.md).
--
-- SQLite cannot change a table's key in place, so the table is rebuilt as its documentation
-- prescribes (a new table, the rows copied, the old one dropped, the new one renamed), inside
-- this migration's transaction. The connections of the store do not enforce foreign keys (see
-- `SqliteStore::open_with`), so dropping the old table touches no other one; the REFERENCES of
-- `webhook_deliveries` names the table, not its storage, and holds for the new one.
CREATE TABLE events_rebuilt (
    id      INTEGER PRIMARY KEY,
    saga_id TEXT NOT NULL REFERENCES sagas (id),
    at      INTEGER NOT NULL,
    type    TEXT NOT NULL,
    step    TEXT,
    data    TEXT NOT NULL DEFAULT '{}'
);
INSERT INTO events_rebuilt (id, saga_id, at, type, step, data)
    SELECT id, saga_id, at, type, step, data FROM events ORDER BY id;
DROP TABLE events;
ALTER TABLE events_rebuilt RENAME TO events;
CREATE INDEX events_saga ON events (saga_id, id);
