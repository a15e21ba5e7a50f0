-- The log's identity: a UUID made once per database, the first time a relay asks for it. A
-- broker target publishes each event as `<log id>:<event id>`, so two deployments, or a
-- database made anew, publishing to one stream never deduplicate each other's events.
CREATE TABLE log_identity (
    singleton  INTEGER PRIMARY KEY NOT NULL CHECK (singleton = 1),
    log_id     TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
