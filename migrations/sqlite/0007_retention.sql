-- Retention deletes a purged saga's idempotency keys by saga id.
CREATE INDEX idempotency_keys_saga ON idempotency_keys (saga_id);
