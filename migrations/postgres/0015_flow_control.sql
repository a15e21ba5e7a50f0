-- Flow control (SPEC §14). A saga waiting to be admitted (`gate = 1`: its definition has
-- concurrency limits, or it was started with a priority other than 5 and no worker was free)
-- is left out of the due-time index every claim walks, and found through `sagas_gated`
-- instead, in priority order. Admission clears `gate`; from then on a saga of a limited
-- definition (`flow`, the definition's name, with `flow_key`, its per-key value) holds a
-- running slot until it ends, counted on `sagas_flow_running`. `fair_seq` is a waiting saga's
-- turn among its definition's: one past its key's last waiting saga, and never before the
-- turn the definition's queue has reached, so that keys take turns (fairness across keys).
ALTER TABLE sagas
    ADD COLUMN priority SMALLINT NOT NULL DEFAULT 5,
    ADD COLUMN gate SMALLINT NOT NULL DEFAULT 0,
    ADD COLUMN flow TEXT,
    ADD COLUMN flow_key TEXT,
    ADD COLUMN fair_seq BIGINT NOT NULL DEFAULT 0;
DROP INDEX sagas_due;
CREATE INDEX sagas_due ON sagas (next_run_at) WHERE next_run_at IS NOT NULL AND gate = 0;
-- No index here names a column the engine's own writes set (status, due time, lease), so a
-- saga's every write maintains none of them (and PostgreSQL can keep updating it in place);
-- the claim with limits clears `flow` of the sagas that ended, so that counting the running
-- ones never walks the finished ones.
CREATE INDEX sagas_gated ON sagas (flow, fair_seq) WHERE gate = 1;
CREATE INDEX sagas_gated_key ON sagas (flow, flow_key, fair_seq) WHERE gate = 1;
CREATE INDEX sagas_flow_running ON sagas (flow, flow_key) WHERE flow IS NOT NULL AND gate = 0;

-- The limits, as declared by the definitions and changed by operators. A concurrency limit
-- has `limit_value`; a rate limiter `rate_count` per `rate_period_ms`, `burst`, and its
-- bucket as a theoretical arrival time (`tat_us`, microseconds since the epoch: the generic
-- cell rate algorithm, which reserves each call its own moment).
CREATE TABLE flow_limits (
    name                 TEXT PRIMARY KEY,
    kind                 TEXT NOT NULL,
    saga                 TEXT,
    key_field            TEXT,
    limit_value          BIGINT,
    rate_count           BIGINT,
    rate_period_ms       BIGINT,
    burst                BIGINT,
    declared_limit       BIGINT,
    declared_rate_count  BIGINT,
    declared_rate_period_ms BIGINT,
    declared_burst       BIGINT,
    tat_us               BIGINT NOT NULL DEFAULT 0,
    updated_at           BIGINT,
    updated_by           TEXT
);

-- Every operator change of a limit: who, why, from what to what.
CREATE TABLE limit_changes (
    id     BIGSERIAL PRIMARY KEY,
    name   TEXT NOT NULL,
    at     BIGINT NOT NULL,
    actor  TEXT,
    reason TEXT,
    old    JSONB NOT NULL,
    new    JSONB NOT NULL
);
