-- The step log says what it means. A branch of a parallel group names its group's row
-- (`stage_index`) and its own name (`branch`) in columns of its own; its row is still named
-- `group/branch`, the name its idempotency keys, attempts and events carry. Each wait has its
-- own column: a sleep's wake time stays in `wake_at`, a signal wait's timeout moves to
-- `timeout_at`, and a branch's next try to `retry_at`.
--
-- Adding nullable columns rewrites no row; the one UPDATE below touches only branch rows and
-- signal rows that wait with a timeout, and finds a branch's group by the primary key's
-- `saga_id` prefix. Stage names have no `/`, so a name with one is a branch's, split at the
-- first `/`.
ALTER TABLE steps ADD COLUMN stage_index INTEGER;
ALTER TABLE steps ADD COLUMN branch TEXT;
ALTER TABLE steps ADD COLUMN timeout_at INTEGER;
ALTER TABLE steps ADD COLUMN retry_at INTEGER;

UPDATE steps SET
    stage_index = CASE WHEN instr(name, '/') > 0 THEN (
        SELECT g.idx FROM steps AS g
        WHERE g.saga_id = steps.saga_id AND g.kind = 'parallel'
          AND g.name = substr(steps.name, 1, instr(steps.name, '/') - 1)) END,
    branch = CASE WHEN instr(name, '/') > 0 THEN substr(name, instr(name, '/') + 1) END,
    retry_at = CASE WHEN instr(name, '/') > 0 THEN wake_at END,
    timeout_at = CASE WHEN kind = 'signal' THEN wake_at END,
    wake_at = CASE WHEN kind = 'sleep' THEN wake_at END
WHERE instr(name, '/') > 0 OR (kind = 'signal' AND wake_at IS NOT NULL);
