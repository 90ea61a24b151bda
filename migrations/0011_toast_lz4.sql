-- The large JSON values every turn writes (the session's state, the request, the provider's
-- answer, the record's payloads and chunks, the outbox's messages) are compressed with lz4
-- instead of the default pglz when PostgreSQL moves them to TOAST: measured in
-- docs/benchmarks.md ("Profile of a turn"). Rows already stored keep their compression.
ALTER TABLE sessions ALTER COLUMN state SET COMPRESSION lz4;
ALTER TABLE turns ALTER COLUMN request SET COMPRESSION lz4;
ALTER TABLE turns ALTER COLUMN last_reply SET COMPRESSION lz4;
ALTER TABLE turns ALTER COLUMN continuation SET COMPRESSION lz4;
ALTER TABLE response_records ALTER COLUMN request_payload SET COMPRESSION lz4;
ALTER TABLE response_records ALTER COLUMN response_payload SET COMPRESSION lz4;
ALTER TABLE response_records ALTER COLUMN retrieved_chunks SET COMPRESSION lz4;
ALTER TABLE response_records ALTER COLUMN active_files SET COMPRESSION lz4;
ALTER TABLE response_records ALTER COLUMN reply SET COMPRESSION lz4;
ALTER TABLE llm_results ALTER COLUMN result SET COMPRESSION lz4;
ALTER TABLE outbox ALTER COLUMN payload SET COMPRESSION lz4;
