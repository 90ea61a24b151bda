-- Persist's common case in one round trip (docs/benchmarks.md, "Where the overhead goes at
-- 100 turns/s"): a round trip that ends without anything to start, settle, charge or take in
-- is written by one call outside a transaction. As a transaction of its own it took four round
-- trips (BEGIN, the session's lock with its name and expiry, the step statement, COMMIT).
--
-- A function for the reason `aptix_admit_at_once` is one (0029): a statement's snapshot is taken
-- before it waits for the session's lock, and the step statement reads the session's queued
-- and steered turns, which the lock's last holder may have just written. Here each statement
-- takes its snapshot after the lock.
--
-- The parameters are the step statement's own, in its order (`src/store/records.rs`
-- `write_step`: the record's `$1`-`$25`, `RecordParams`; the step's `$26`-`$37`, `StepParams`),
-- so the statement below reads as that one does; then `$38`, the turn's tenant, and `$39`,
-- whether the reply names the session (a step reply does: its name and expiry, read under the
-- lock, are put in its payload here and returned for the message published after the commit).
--
-- Anything but the common case writes nothing and returns `done` false, and the caller takes
-- the transaction (`Store::finish_step`), which handles it: a session of another tenant than
-- the turn's, a turn not running this step (a repeat, a refused or cancelled step), a turn
-- that took follow-ups in (they end with it), or a turn ending while another waits queued (it
-- starts in the same transaction). The caller leaves out what only the transaction does:
-- budgets to settle, follow-ups to take in, a tenant's gate, a turn that runs on.
CREATE FUNCTION aptix_finish_at_once(
    uuid, uuid, text, integer, text, text, jsonb, json, json, jsonb, jsonb, jsonb, jsonb, jsonb,
    text, text, text, text, jsonb, jsonb, text[], text[], jsonb, text, jsonb,
    text, integer, jsonb, jsonb, jsonb, boolean, jsonb, json, boolean, jsonb, boolean,
    timestamptz,
    text, boolean,
    OUT done boolean, OUT reply_id bigint, OUT session_name text,
    OUT session_expires timestamptz
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    s record;
BEGIN
    done := false;
    SELECT tenant, name, expires_at INTO s FROM sessions WHERE id = $2 FOR UPDATE;
    IF NOT FOUND OR s.tenant IS DISTINCT FROM $38 THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM turns WHERE session_id = $2 AND turn_id = $3
                   AND state = 'running' AND step = $4
                   AND (cancel_requested_at IS NULL OR $36))
       OR EXISTS (SELECT 1 FROM turns WHERE session_id = $2 AND steers = $3
                  AND state = 'steered')
       OR ($34 AND EXISTS (SELECT 1 FROM turns WHERE session_id = $2 AND state = 'queued')) THEN
        RETURN;
    END IF;
    session_name := s.name;
    session_expires := s.expires_at;
    -- `write_step`'s statement; the session passes to no queued turn (none waits: checked).
    WITH moved AS (
        UPDATE turns SET state = $26, step = $27, pending_tool_calls = $28,
            last_reply = NULL, pending_warnings = $29, server_calls = $30,
            server_executions = COALESCE($32, server_executions),
            continuation = CASE WHEN $31 THEN NULL ELSE continuation END,
            approval_expires_at = $37, updated_at = now()
        WHERE session_id = $2 AND turn_id = $3 AND state = 'running' AND step = $4
            AND (cancel_requested_at IS NULL OR $36)
        RETURNING 1),
    texts AS (
        INSERT INTO session_texts (sha256, body)
        SELECT * FROM unnest($21, $22) WHERE EXISTS (SELECT 1 FROM moved)
        ON CONFLICT (sha256) DO NOTHING),
    recorded AS (
        INSERT INTO response_records (id, session_id, turn_id, step, kind,
            provider_response_id, chain, request_payload, response_payload,
            retrieved_chunks, active_files, skipped_files, usage, errors,
            instruction, workspace_id, repo, language, rag_scope, reply,
            stage_timings, conversation_context_id, context_versions)
        SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
            $19, $20, $23, $24, $25
        WHERE EXISTS (SELECT 1 FROM moved)),
    handed AS (
        UPDATE sessions SET updated_at = now(), state = COALESCE($33, state),
            active_turn_id = CASE WHEN $34 THEN NULL ELSE active_turn_id END
        WHERE id = $2 AND ($34 OR $33 IS NOT NULL) AND EXISTS (SELECT 1 FROM moved)),
    replied AS (
        INSERT INTO outbox (session_id, turn_id, payload)
        SELECT $2, $3, CASE WHEN $39
                THEN ($35 - 'session_name' - 'session_expires')
                    || jsonb_strip_nulls(jsonb_build_object(
                        'session_name', s.name, 'session_expires', s.expires_at))
                ELSE $35 END
        WHERE $35 IS NOT NULL AND EXISTS (SELECT 1 FROM moved)
        RETURNING id)
    SELECT true, (SELECT id FROM replied) INTO done, reply_id FROM moved;
    -- Checked under the lock just before, so not expected; if it happens nothing was written
    -- (every write needs `moved`), and the transaction tells why.
    done := COALESCE(done, false);
END $$;
