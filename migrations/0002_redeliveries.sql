-- Ingress messages delivered to a validate consumer that died before settling them. Validate
-- handles such a message in place (re-publishing it would move it behind later turns of its
-- session), so its deliveries are counted here: one that keeps killing workers is dead-lettered.
CREATE TABLE redeliveries (
    message_key text PRIMARY KEY,
    deliveries integer NOT NULL,
    last_seen timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX redeliveries_last_seen ON redeliveries (last_seen);
