-- Effects of server tools, recorded before they happen (docs/tools.md, "Effects"). A row is
-- written, with the call's arguments, before a server tool runs, and its outcome after: a step
-- that is redelivered or retried finds the rows of the calls it already ran and never runs a
-- completed one again; a row with no outcome is a call cut short (its worker died, or the
-- database did not take the outcome), whose effect is unknown.
CREATE TABLE tool_effects (
    session_id      uuid        NOT NULL,
    turn_id         text        NOT NULL,
    step            integer     NOT NULL,
    call_id         text        NOT NULL,
    tool            text        NOT NULL,
    arguments       jsonb       NOT NULL,
    -- What a server that de-duplicates receives: the same for every attempt of the call.
    idempotency_key text        NOT NULL,
    attempts        integer     NOT NULL DEFAULT 1,
    started_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at        timestamptz,
    -- The call's result as the model got it: `{"ok": text}`, `{"error": text}` or
    -- `{"unknown": text}` (an effect the pipeline could not confirm), with a produced file.
    outcome         jsonb,
    PRIMARY KEY (session_id, turn_id, step, call_id)
);

-- Calls whose outcome is unknown, for the operator (`aptix status`, the console).
CREATE INDEX tool_effects_open ON tool_effects (started_at) WHERE ended_at IS NULL;
