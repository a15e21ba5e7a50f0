-- Forks (SPEC §13). A saga forked from another names it (`forked_from`) and, when it took over
-- the effects of the stages before one of them, that stage (`forked_from_stage`); the original
-- then names the saga that took its effects over (`superseded_by`). A step row taken over
-- keeps the idempotency keys of the saga it was recorded by (`keys_saga_id`): its
-- compensation, if ever needed, undoes the original's effect with the original's key.
--
-- Nullable columns without a default: no row is rewritten, and a saga or step that is no
-- fork's reads NULL at no cost.
ALTER TABLE sagas ADD COLUMN forked_from TEXT;
ALTER TABLE sagas ADD COLUMN forked_from_stage TEXT;
ALTER TABLE sagas ADD COLUMN superseded_by TEXT;
ALTER TABLE steps ADD COLUMN keys_saga_id TEXT;
