-- The W3C trace context a client sent with the start (`traceparent`), or, for a child saga,
-- its parent saga's: the saga's spans join that trace. NULL when none was given; the saga then
-- has a trace of its own, derived from its id.
ALTER TABLE sagas ADD COLUMN traceparent TEXT;
