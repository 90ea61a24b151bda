-- Server-executed tools. `server_calls`: the calls of a turn's last answer that the pipeline
-- runs itself, before its next provider call; `server_executions`: every execution of the turn
-- so far, listed in its final response's ToolResults (and its files in Files).
ALTER TABLE turns ADD COLUMN server_calls jsonb;
ALTER TABLE turns ADD COLUMN server_executions jsonb;

-- Files that `write_file` produced, by the SHA-256 of their content (written once, served by
-- GET /files/<sha256> until they expire; a new write of the same content extends them).
CREATE TABLE files (
    sha256     text PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    content    bytea NOT NULL,
    size_bytes bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX files_expires_at ON files (expires_at);
