-- Admission's common case in one round trip (docs/benchmarks.md, "Where the overhead goes at
-- 100 turns/s"): a new turn of an idle or a new session of a tenant without limits, with
-- nothing of the session waiting in the outbox, starts at once. Done as a transaction of its own
-- it took four round trips for an existing session (BEGIN, the session's lock, the turn with its
-- start message, COMMIT), about 0.9 ms at 100 turns/s, and six for a new one; called as one
-- statement outside a transaction it takes one.
--
-- A function, not one statement with CTEs: a statement's snapshot is taken when it starts,
-- before it waits for the session's lock, so it would not see a turn or an outbox row committed
-- by the lock's last holder. A VOLATILE function's statements each take a snapshot of their own
-- (READ COMMITTED), so everything after the lock sees what every holder before it committed,
-- exactly as the transaction's later statements do.
--
-- The checks are `Store::admit_user_turn`'s for this case (src/store/admit.rs); any other case
-- (another tenant's session, other contexts, a turn seen before, a turn running, a message
-- waiting) writes nothing and returns no outbox id, and the caller takes the transaction; a
-- session seen busy, or a turn seen known, before the lock returns at once, without waiting for
-- the lock the transaction would wait for again. `started`: the start message's outbox id;
-- `created`: whether this call created the session (it may have, and still return no id).
CREATE FUNCTION aptix_admit_at_once(
    p_session uuid, p_turn text, p_state text, p_fingerprint text, p_request jsonb,
    p_reply_to text, p_tenant text, p_expires_at timestamptz, p_agent text,
    p_conversation text, p_mode_named boolean, p_start jsonb, p_workspace text, p_repo text,
    p_name text, OUT started bigint, OUT created boolean
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    s record;
BEGIN
    created := false;
    SELECT active_turn_id IS NOT NULL AS busy INTO s FROM sessions WHERE sessions.id = p_session;
    IF FOUND AND (s.busy OR EXISTS (SELECT 1 FROM turns
                                    WHERE session_id = p_session AND turn_id = p_turn)) THEN
        RETURN;
    ELSIF NOT FOUND THEN
        -- A message waiting for an id no session has yet (none is written so by this build)
        -- goes the transaction's way, which creates the session only with its turn.
        IF EXISTS (SELECT 1 FROM outbox WHERE session_id = p_session) THEN
            RETURN;
        END IF;
        -- A new session, created as the transaction creates it: its row, locked by the insert
        -- until the commit, holds the turn's own tenant and contexts.
        INSERT INTO sessions (id, tenant, agent_context_id, conversation_context_id,
                workspace_id, repo, name, expires_at)
            VALUES (p_session, p_tenant, p_agent, p_conversation, p_workspace, p_repo, p_name,
                p_expires_at)
            ON CONFLICT (id) DO NOTHING;
        created := FOUND;
    END IF;
    SELECT active_turn_id, next_seq, tenant, agent_context_id, conversation_context_id INTO s
        FROM sessions WHERE sessions.id = p_session FOR UPDATE;
    -- A session this call created passes these but for a message to its id written since the
    -- look above: then it stays, and the caller knows it created it.
    IF NOT FOUND
       OR s.active_turn_id IS NOT NULL
       OR s.tenant IS DISTINCT FROM p_tenant
       -- contexts_match: a stored context serves only the same one; none serves any.
       OR NOT (s.agent_context_id IS NULL OR s.agent_context_id IS NOT DISTINCT FROM p_agent)
       OR NOT (p_mode_named OR s.conversation_context_id IS NULL
               OR s.conversation_context_id IS NOT DISTINCT FROM p_conversation)
       OR EXISTS (SELECT 1 FROM turns WHERE session_id = p_session AND turn_id = p_turn)
       OR EXISTS (SELECT 1 FROM outbox WHERE session_id = p_session) THEN
        RETURN;
    END IF;
    -- The turn's mode becomes the session's (set_mode), its expiry is extended, it is counted.
    UPDATE sessions SET next_seq = next_seq + 1, active_turn_id = p_turn,
        conversation_context_id = COALESCE(p_conversation, conversation_context_id),
        expires_at = GREATEST(expires_at, p_expires_at), updated_at = now()
        WHERE sessions.id = p_session;
    INSERT INTO turns (session_id, turn_id, seq, state, fingerprint, request, reply_to, tenant,
            started_at)
        VALUES (p_session, p_turn, s.next_seq, p_state, p_fingerprint, p_request, p_reply_to,
            p_tenant, CASE WHEN p_state = 'running' THEN clock_timestamp() END);
    INSERT INTO outbox (session_id, turn_id, payload) VALUES (p_session, p_turn, p_start)
        RETURNING outbox.id INTO started;
END $$;
