-- Leave room in each page so that the engine's frequent updates of a saga, its steps and its
-- attempts can be heap-only (HOT): the new row version stays on the same page and no index
-- entry is written, as long as no indexed column changed (status, due time and lease change
-- only at a saga's start, waits and end).
ALTER TABLE sagas SET (fillfactor = 70);
ALTER TABLE steps SET (fillfactor = 70);
ALTER TABLE attempts SET (fillfactor = 80);
