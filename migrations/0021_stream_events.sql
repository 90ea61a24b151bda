-- Stream deltas as they were published, so a client can resume a turn's stream from a cursor
-- (docs/client-protocol.md §9a). A session keeps those of its latest streamed turn only, at most
-- `pipeline.stream_events_per_turn` of them; its step replies are in response_records.
CREATE TABLE stream_events (
    session_id uuid NOT NULL,
    turn_id    text NOT NULL,
    event_seq  bigint NOT NULL,
    body       bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, turn_id, event_seq)
);
