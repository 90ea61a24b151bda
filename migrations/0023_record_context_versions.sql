-- Which versions of its contexts produced a record (issue 45): {"ConversationContext": {"Id",
-- "Version"}, "AgentContext": {"Id", "Version"}}, a version being a digest of the context's
-- content (config::content_version). NULL in records written before, and in records of turns
-- that ended before a model call (cancelled or failed while queued, steered follow-ups).
ALTER TABLE response_records ADD COLUMN context_versions jsonb;
