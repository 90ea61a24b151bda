-- Replies a client's queue refused (a full queue under reject-publish, its node down, a queue
-- of another kind or held exclusively elsewhere). The stage that published one parks it here
-- and moves on; the redelivery loop (src/redeliver.rs) offers it to its queue again, oldest
-- first per queue, until the queue takes it or it is too old to wait (then it goes to
-- `<prefix>.unrouted`). `message` is the reply as the broker module publishes it (versioned).
CREATE TABLE undelivered (
    id           bigserial PRIMARY KEY,
    queue        text NOT NULL,
    session_id   uuid,
    tenant       text,
    message      jsonb NOT NULL,
    reason       text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    next_try_at  timestamptz NOT NULL DEFAULT now(),
    tries        integer NOT NULL DEFAULT 0
);
CREATE INDEX undelivered_queue ON undelivered (queue, id);
CREATE INDEX undelivered_due ON undelivered (next_try_at);
CREATE INDEX undelivered_session ON undelivered (session_id) WHERE session_id IS NOT NULL;
