-- Who is calling the provider for a round trip right now. Copies of an invoke message run
-- beside the original: a stage whose broker connection died goes on with the work it holds
-- while the broker delivers its messages again elsewhere, an outbox row is published again by
-- a re-sent submission, an operator replays a dead letter. The saved answer (`llm_results`)
-- stopped a copy that came after the call ended, not one that came during it: both called the
-- provider (charged twice, a streamed turn's deltas sent twice). Now the first to look claims
-- the call for a short lease it renews while the call runs, and a copy waits for the saved
-- answer, or until its holder died or its lease lapsed, and then calls itself.
--
-- A holder that dies (SIGKILL) must not hold its copies for a whole lease: a claim names its
-- holder's process (`holder`), and each process holds a session-level advisory lock on that
-- key on a connection of its own for as long as it runs. PostgreSQL lets go of the lock the
-- moment that connection closes, so a copy takes the call as soon as the holder has also missed
-- a renewal (about 12 s after its last one instead of 30); the whole lease stays for a holder
-- alive but stuck, a host gone without closing its connections, and a claim made while its
-- process held no lock (`holder` NULL).
--
-- UNLOGGED: a lease is not a record. It costs no WAL on the path of every turn, and after a
-- crash of PostgreSQL (or on a promoted standby) the table starts empty, which at worst lets a
-- copy that was waiting call once more, as before this table.
CREATE UNLOGGED TABLE llm_claims (
    session_id uuid NOT NULL,
    turn_id text NOT NULL,
    step integer NOT NULL,
    attempt uuid NOT NULL,
    until timestamptz NOT NULL,
    holder bigint,
    PRIMARY KEY (session_id, turn_id, step)
);

-- Whether the process that holds advisory lock `p_holder` (a bigint key: its high half shows
-- as `classid`, its low half as `objid`, `objsubid` 1) is still connected; NULL is not known.
CREATE FUNCTION aptix_holder_alive(p_holder bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_holder IS NULL OR EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid::bigint = (p_holder >> 32) & 4294967295
          AND l.objid::bigint = p_holder & 4294967295)
$$;

-- Where round trip `p_step` stands before its provider call, claiming the call for
-- `p_attempt` when it is still to be made: the saved answer (if the provider answered), whether
-- a cancel was admitted, whether the turn runs the step, and whether `p_attempt` holds the
-- call now. Each statement reads with its own snapshot: the saved answer is looked for again
-- after the claim, so an answer saved (and its claim released) between the first look and the
-- claim is found, not called for again.
CREATE FUNCTION aptix_claim_call(p_session uuid, p_turn text, p_step integer, p_attempt uuid,
                                 p_lease_secs double precision, p_holder bigint,
                                 OUT saved jsonb, OUT cancelled boolean, OUT running boolean,
                                 OUT claimed boolean)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    SELECT t.cancel_requested_at IS NOT NULL, t.state = 'running' AND t.step = p_step
    INTO cancelled, running
    FROM turns t WHERE t.session_id = p_session AND t.turn_id = p_turn;
    cancelled := coalesce(cancelled, false);
    running := coalesce(running, false);
    claimed := false;
    SELECT aptix_deref_at(r.result, '{job,result,raw,tools}') INTO saved FROM llm_results r
    WHERE r.session_id = p_session AND r.turn_id = p_turn AND r.step = p_step;
    IF saved IS NOT NULL OR NOT running THEN
        RETURN;
    END IF;
    INSERT INTO llm_claims AS c (session_id, turn_id, step, attempt, until, holder)
    VALUES (p_session, p_turn, p_step, p_attempt,
            clock_timestamp() + make_interval(secs => p_lease_secs), p_holder)
    ON CONFLICT (session_id, turn_id, step) DO UPDATE
        SET attempt = excluded.attempt, until = excluded.until, holder = excluded.holder
        WHERE c.attempt = excluded.attempt OR c.until < clock_timestamp()
           -- A live holder renews every third of a lease, so its lease never runs below two
           -- thirds; one that missed a renewal and whose process's lock is gone died. The
           -- lock alone is not trusted: a pooler or a failover can drop it under a live one.
           OR (c.until < clock_timestamp() + make_interval(secs => p_lease_secs * 0.6)
               AND NOT aptix_holder_alive(c.holder))
    RETURNING true INTO claimed;
    claimed := coalesce(claimed, false);
    IF claimed THEN
        SELECT aptix_deref_at(r.result, '{job,result,raw,tools}') INTO saved FROM llm_results r
        WHERE r.session_id = p_session AND r.turn_id = p_turn AND r.step = p_step;
        IF saved IS NOT NULL THEN
            DELETE FROM llm_claims WHERE session_id = p_session AND turn_id = p_turn
                AND step = p_step AND attempt = p_attempt;
            claimed := false;
        END IF;
    END IF;
END
$$;
