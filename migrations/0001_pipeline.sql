-- Sessions, turns (a state machine), immutable response records, and the transactional outbox.

CREATE TABLE sessions (
    id                      uuid PRIMARY KEY,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    agent_context_id        text,
    conversation_context_id text,
    workspace_id            text,
    repo                    text,
    -- The assemble module's SessionState: chain, latched solution context, rehydration history.
    state                   jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- The turn that holds the session (running or awaiting tool results); NULL when idle.
    active_turn_id          text,
    next_seq                bigint NOT NULL DEFAULT 0
);

CREATE TABLE turns (
    session_id         uuid NOT NULL REFERENCES sessions(id),
    turn_id            text NOT NULL,
    seq                bigint NOT NULL,
    state              text NOT NULL CHECK (state IN ('queued', 'running', 'awaiting_tool_results', 'completed', 'failed')),
    fingerprint        text NOT NULL,
    request            jsonb NOT NULL,
    -- Round trips done so far: 0 before the first LLM call, +1 per persisted record.
    step               integer NOT NULL DEFAULT 0,
    pending_tool_calls jsonb,
    -- User warnings of the round trips so far, owed to the turn's final response.
    pending_warnings   jsonb,
    last_reply         jsonb,
    -- Fingerprint of the tool continuation that resumed the turn, to recognise a re-send.
    continuation_fingerprint text,
    continuation       jsonb,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, turn_id)
);
CREATE INDEX turns_queue ON turns (session_id, seq) WHERE state = 'queued';

CREATE TABLE response_records (
    id                   uuid PRIMARY KEY,
    session_id           uuid NOT NULL REFERENCES sessions(id),
    turn_id              text NOT NULL,
    step                 integer NOT NULL,
    kind                 text NOT NULL,
    provider_response_id text,
    chain                jsonb NOT NULL DEFAULT '{}'::jsonb,
    request_payload      jsonb,
    response_payload     jsonb,
    retrieved_chunks     jsonb NOT NULL DEFAULT '[]'::jsonb,
    active_files         jsonb NOT NULL DEFAULT '[]'::jsonb,
    skipped_files        jsonb NOT NULL DEFAULT '[]'::jsonb,
    usage                jsonb,
    errors               jsonb NOT NULL DEFAULT '[]'::jsonb,
    instruction          text,
    workspace_id         text,
    repo                 text,
    language             text,
    rag_scope            jsonb NOT NULL DEFAULT '[]'::jsonb,
    reply                jsonb NOT NULL,
    -- Set on records written by batch reprocessing; the original is never touched.
    reprocess_of         uuid REFERENCES response_records(id),
    reprocess_run        text,
    created_at           timestamptz NOT NULL DEFAULT now()
);
-- One record per (turn, round trip) from the live pipeline; reprocessing adds linked records.
CREATE UNIQUE INDEX response_records_live ON response_records (session_id, turn_id, step) WHERE reprocess_of IS NULL;
CREATE UNIQUE INDEX response_records_reprocess ON response_records (reprocess_of, reprocess_run) WHERE reprocess_of IS NOT NULL;
CREATE INDEX response_records_session ON response_records (session_id, created_at);

-- Records are immutable: the database refuses UPDATE and DELETE (TRUNCATE too).
CREATE FUNCTION response_records_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'response_records are immutable (% refused)', TG_OP USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER response_records_no_update BEFORE UPDATE OR DELETE ON response_records
    FOR EACH ROW EXECUTE FUNCTION response_records_immutable();
CREATE TRIGGER response_records_no_truncate BEFORE TRUNCATE ON response_records
    FOR EACH STATEMENT EXECUTE FUNCTION response_records_immutable();

-- The provider's answer, kept before it is forwarded, so a redelivered invoke never calls twice.
CREATE TABLE llm_results (
    session_id  uuid NOT NULL,
    turn_id     text NOT NULL,
    step        integer NOT NULL,
    result      jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, turn_id, step)
);

-- Messages committed with a state change and published after the commit.
CREATE TABLE outbox (
    id           bigserial PRIMARY KEY,
    session_id   uuid,
    turn_id      text,
    exchange     text NOT NULL,
    routing_key  text NOT NULL,
    message_id   text NOT NULL,
    kind         text NOT NULL,
    -- Declare the session's reply queue first if the publish turns out unroutable.
    declare_session boolean NOT NULL DEFAULT false,
    headers      jsonb NOT NULL DEFAULT '{}'::jsonb,
    body         bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_turn ON outbox (session_id, turn_id);
