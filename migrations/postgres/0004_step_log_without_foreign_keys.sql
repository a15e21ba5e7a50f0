-- The step log's child rows (steps, attempts, events) no longer carry foreign keys to sagas.
--
-- Every one of them is written together with its saga's row: a new saga's
-- steps and first event with the saga itself, every later row only if its lease passed the
-- fence (the UPDATE of that saga's row) in the same statement, and the rest (operator
-- commands, the blocked and corrupt flags) after locking or updating that saga's row in the
-- same transaction; no saga is ever deleted. The keys could not fail, and checking them
-- cost the one writer's backend an index probe and a row lock (FOR KEY SHARE) per child row,
-- about a sixth of its time at 64 sagas in flight (BENCHMARKS.md).
ALTER TABLE steps DROP CONSTRAINT steps_saga_id_fkey;
ALTER TABLE attempts DROP CONSTRAINT attempts_saga_id_fkey;
ALTER TABLE events DROP CONSTRAINT events_saga_id_fkey;
