-- Outbox rows hold a typed, versioned payload (`Outgoing`, tagged with its kind) instead of a
-- ready-made AMQP message: the store no longer knows the broker. Rows written before keep their
-- columns and are still published as they were; the old columns become optional for new rows.
ALTER TABLE outbox ADD COLUMN payload jsonb;
ALTER TABLE outbox ALTER COLUMN exchange DROP NOT NULL;
ALTER TABLE outbox ALTER COLUMN routing_key DROP NOT NULL;
ALTER TABLE outbox ALTER COLUMN message_id DROP NOT NULL;
ALTER TABLE outbox ALTER COLUMN kind DROP NOT NULL;
ALTER TABLE outbox ALTER COLUMN body DROP NOT NULL;
