-- Search attributes: values a saga's definition computes from its input at start, written in
-- the start's transaction, so that sagas can be found by them. The index serves a list by one
-- attribute's value newest first (ids are UUIDv7), a page at a time after a cursor.
CREATE TABLE saga_attrs (
    saga_id TEXT NOT NULL,
    attr    TEXT NOT NULL,
    value   TEXT NOT NULL,
    PRIMARY KEY (saga_id, attr)
) WITHOUT ROWID;

CREATE INDEX saga_attrs_value ON saga_attrs (attr, value, saga_id);
