-- Cancelling a turn (`turn.cancel`): when the cancel was admitted. A queued or waiting turn ends
-- at once; a running one ends at its next stage boundary, and its invoke worker aborts the
-- provider call when it sees this set. Never cleared, so a redelivered message of the turn cannot
-- resurrect it.
ALTER TABLE turns ADD COLUMN cancel_requested_at timestamptz;
