-- The texts a session's state keeps for rehydration (chunks sent before, the latest version of
-- each active file) are stored once, by the SHA-256 of the text, and the state references them:
-- before, the whole state, texts included, was rewritten on every turn (about 26 KB of WAL per
-- turn; docs/benchmarks.md, "Profile of a turn"). Shared by every session that sent the text.
CREATE TABLE session_texts (
    sha256     text PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    body       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE session_texts ALTER COLUMN body SET COMPRESSION lz4;
