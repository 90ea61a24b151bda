-- Admission's common case in one round trip (docs/benchmarks.md, "Where the overhead goes at
-- 100 turns/s"): a new turn of an existing, idle session of a tenant without limits, with nothing
-- of the session waiting in the outbox, starts at once. Done as a transaction of its own it took
-- four round trips (BEGIN, the session's lock, the turn with its start message, COMMIT), about
-- 0.9 ms at 100 turns/s; called as one statement outside a transaction it takes one.
--
-- A function, not one statement with CTEs: a statement's snapshot is taken when it starts,
-- before it waits for the session's lock, so it would not see a turn or an outbox row committed
-- by the lock's last holder. A VOLATILE function's statements each take a snapshot of their own
-- (READ COMMITTED), so everything after the lock sees what every holder before it committed,
-- exactly as the transaction's later statements do.
--
-- The checks are `Store::admit_user_turn`'s for this case (src/store/admit.rs); any other case
-- (no such session, another tenant's, other contexts, a turn seen before, a turn running, a
-- message waiting) writes nothing and returns NULL, and the caller takes the transaction; a
-- session seen busy, or a turn seen known, before the lock returns NULL without waiting for it.
-- Returns the start message's outbox id.
CREATE FUNCTION aptix_admit_at_once(
    p_session uuid, p_turn text, p_state text, p_fingerprint text, p_request jsonb,
    p_reply_to text, p_tenant text, p_expires_at timestamptz, p_agent text,
    p_conversation text, p_mode_named boolean, p_start jsonb
) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    s       record;
    started bigint;
BEGIN
    -- A busy session, a new one, or a copy of a known turn goes the transaction's way at once,
    -- without waiting here for a lock the transaction would wait for again.
    IF NOT EXISTS (SELECT 1 FROM sessions WHERE sessions.id = p_session
                       AND active_turn_id IS NULL)
       OR EXISTS (SELECT 1 FROM turns WHERE session_id = p_session AND turn_id = p_turn) THEN
        RETURN NULL;
    END IF;
    SELECT active_turn_id, next_seq, tenant, agent_context_id, conversation_context_id INTO s
        FROM sessions WHERE sessions.id = p_session FOR UPDATE;
    IF NOT FOUND
       OR s.active_turn_id IS NOT NULL
       OR s.tenant IS DISTINCT FROM p_tenant
       -- contexts_match: a stored context serves only the same one; none serves any.
       OR NOT (s.agent_context_id IS NULL OR s.agent_context_id IS NOT DISTINCT FROM p_agent)
       OR NOT (p_mode_named OR s.conversation_context_id IS NULL
               OR s.conversation_context_id IS NOT DISTINCT FROM p_conversation)
       OR EXISTS (SELECT 1 FROM turns WHERE session_id = p_session AND turn_id = p_turn)
       OR EXISTS (SELECT 1 FROM outbox WHERE session_id = p_session) THEN
        RETURN NULL;
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
    RETURN started;
END $$;
