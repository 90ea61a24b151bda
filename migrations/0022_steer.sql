-- Follow-ups that steer (docs/client-protocol.md §11, "Follow-ups"): a turn admitted with
-- `FollowUp = steer` while its session's turn runs names that turn in `steers`; when a round
-- trip of that turn takes its input in, it is `steered` until that turn ends, then ends as it did.
ALTER TABLE turns ADD COLUMN steers text;
CREATE INDEX turns_steers ON turns (session_id, steers) WHERE steers IS NOT NULL;
ALTER TABLE turns DROP CONSTRAINT turns_state_check;
ALTER TABLE turns ADD CONSTRAINT turns_state_check
    CHECK (state IN ('queued', 'running', 'awaiting_tool_results', 'steered', 'completed', 'failed'));
