-- Each record keeps the path of its round trip through the stages (versioned JSON:
-- {"v": 1, "hops": [{stage, received_ms, sent_ms, attempt, redelivered}, ...]}), carried in the
-- messages' `x-aptix-hops` header, for the console's timeline. NULL for records written before.
ALTER TABLE response_records ADD COLUMN stage_timings jsonb;
