-- The order attempts started in. Their start times are milliseconds, and a compensation, or
-- the next stage's action, can start in the same millisecond as the attempt before it: sorted
-- by time, ties came out by step and phase, not in the order they ran. `seq` is the attempt's
-- place among its saga's attempts, counted by the engine when it writes the attempt ahead;
-- attempts written before this column have none and sort first, by time, as they always did.
ALTER TABLE attempts ADD COLUMN seq BIGINT;
