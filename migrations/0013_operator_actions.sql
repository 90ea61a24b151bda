-- What operators did to the pipeline through Aptix (`aptix dead`, the console): who, when, to
-- which message, and whether it went through. A row is written before the action and finished
-- after it, so an action cut short by a crash still shows as started.
CREATE TABLE operator_actions (
    id             bigserial PRIMARY KEY,
    at             timestamptz NOT NULL DEFAULT now(),
    actor          text NOT NULL,
    action         text NOT NULL CHECK (action IN ('dead.replay', 'dead.discard')),
    message_id     text NOT NULL,
    detail         jsonb NOT NULL DEFAULT '{}'::jsonb,
    outcome        text NOT NULL DEFAULT 'started' CHECK (outcome IN ('started', 'done', 'not_found', 'refused', 'failed')),
    finished_at    timestamptz
);
CREATE INDEX operator_actions_at ON operator_actions (at DESC);
