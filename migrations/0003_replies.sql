-- Replies that answer a submission rather than end a turn's step (refusals: validation errors,
-- conflicts, a busy session, a retry budget spent before admission). Step replies are stored in
-- response_records.reply; with this table every reply a client can receive is in PostgreSQL.
-- No foreign key: a refusal may name a session that was never created.
CREATE TABLE replies (
    message_id  TEXT PRIMARY KEY,
    session_id  UUID NOT NULL,
    turn_id     TEXT,
    outcome     TEXT NOT NULL,
    body        JSONB NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX replies_session ON replies (session_id, created_at);
