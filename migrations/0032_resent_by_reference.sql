-- A duplicate of a finished turn is answered with the turn's stored reply, and `replies` keeps
-- every reply a client can receive. It kept each such copy whole: a tenant publishing duplicates
-- of a turn with a long answer stored that answer once per duplicate (the per-tenant quota
-- counts rows). A reply sent again now keeps no body: `resent` marks it, and `replies_sent`
-- reads it with the turn's reply put back, which the turn's records hold for good (they are
-- never updated or deleted). To go back to a build before this one, put the bodies back first:
--   UPDATE replies SET body = aptix_resent_body(session_id, turn_id), resent = false WHERE resent;
ALTER TABLE replies ALTER COLUMN body DROP NOT NULL,
    ADD COLUMN resent boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT replies_body_or_resent
        CHECK (body IS NOT NULL OR (resent AND turn_id IS NOT NULL));

-- The reply that ended a turn: its latest record's (a reprocessing run's records are not the
-- turn's).
CREATE FUNCTION aptix_turn_reply(session uuid, turn text) RETURNS jsonb
LANGUAGE sql STABLE STRICT AS $$
    SELECT reply FROM response_records
    WHERE session_id = $1 AND turn_id = $2 AND reprocess_of IS NULL
    ORDER BY step DESC LIMIT 1
$$;

-- A finished turn's reply as the pipeline sends it again (`ReplyOut::resent`): turns finished
-- before migration 0030 hold it in `turns.last_reply`; one stored before replies named their
-- turn gets `SessionId` and `TurnId` (an existing key keeps its value). A turn with no reply
-- was answered JSON `null`.
CREATE FUNCTION aptix_resent_body(session uuid, turn text) RETURNS jsonb
LANGUAGE sql STABLE STRICT AS $$
    SELECT CASE WHEN b IS NULL THEN 'null'::jsonb
                WHEN jsonb_typeof(b) = 'object' AND b ? 'Successful'
                THEN jsonb_build_object('SessionId', $1::text, 'TurnId', $2) || b
                ELSE b END
    FROM (SELECT coalesce(
              (SELECT last_reply FROM turns WHERE session_id = $1 AND turn_id = $2),
              aptix_turn_reply($1, $2)) AS b) found
$$;

-- Every reply in `replies` as it was sent (what `aptix session show` reads).
CREATE VIEW replies_sent AS
SELECT message_id, session_id, turn_id, outcome,
       CASE WHEN resent THEN aptix_resent_body(session_id, turn_id) ELSE body END AS body,
       created_at, tenant
FROM replies;
