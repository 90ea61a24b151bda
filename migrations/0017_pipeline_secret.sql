-- Secrets the workers of one database share. `message_key` signs and verifies stage messages
-- (src/broker/mac.rs) unless the configuration names its own (pipeline.message_key): created
-- here from PostgreSQL's strong random source, so a deployment is safe without setting one.
CREATE TABLE pipeline_secret (
    name        text PRIMARY KEY,
    value       text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pipeline_secret (name, value)
VALUES ('message_key', encode(sha256(convert_to(
    gen_random_uuid()::text || gen_random_uuid()::text || gen_random_uuid()::text, 'UTF8')), 'hex'));
