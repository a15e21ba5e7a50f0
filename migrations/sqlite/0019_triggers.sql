-- Messages a NATS trigger refused (`serve --nats-trigger`): a body that is not JSON, does not
-- fit its saga's input, or is too large is terminated on the broker (never redelivered) and
-- recorded here, so the refusal stays visible. One row per message and trigger: a message
-- redelivered after a crash between this insert and its termination adds nothing.
CREATE TABLE trigger_refusals (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    trigger_name TEXT NOT NULL,                    -- SUBJECT=SAGA, as given to --nats-trigger
    stream       TEXT NOT NULL,
    stream_seq   INTEGER NOT NULL,
    subject      TEXT NOT NULL,                    -- the message's own subject
    error        TEXT NOT NULL,
    body_excerpt TEXT NOT NULL,                    -- the first bytes of the body, as text
    body_bytes   INTEGER NOT NULL,
    refused_at   INTEGER NOT NULL,
    UNIQUE (trigger_name, stream, stream_seq)
);
CREATE INDEX trigger_refusals_at ON trigger_refusals (refused_at);
