-- The ConversationContext (the mode) each round trip ran in: a session's mode may change per
-- turn (docs/client-protocol.md §7c). NULL in records written before.
ALTER TABLE response_records ADD COLUMN conversation_context_id text;
