-- The four largest JSON values a turn writes are kept as `json` (their text, checked on input)
-- instead of `jsonb`: the session's state (read and written on every turn), the saved provider
-- answer, and a record's request and response payloads. `jsonb` parsed each into a binary tree
-- on every write (its key sort included) and wrote the state back out as text on every read,
-- about a seventh of PostgreSQL's CPU per turn at the ceiling; nothing queries inside these
-- values on a turn's path, and the pipeline reads them as text (docs/benchmarks.md, lever
-- table: "the four largest JSON values parsed into `jsonb` on every write"). Operators still read them in SQL: `->`, `->>` and `#>` work on
-- `json`, and `aptix_deref_at` takes both types.
--
-- This rewrites `sessions`, `llm_results` and `response_records` under an exclusive lock, for a
-- time proportional to their size, and the previous build's persist cannot write a step against
-- it: docs/reliability.md ("Migration 0028") says how to upgrade.

-- A rewrite of a large table outlasts the 15 s statement timeout every connection of the
-- pipeline sets (`Store::connect`), `aptix migrate`'s too: lifted for this migration only.
SET LOCAL statement_timeout = 0;

-- For statements of workers of the previous build, planned again once this commits: they pass
-- these columns to `aptix_deref_at` (tool definitions by reference, migration 0015).
CREATE FUNCTION aptix_deref_at(payload json, path text[]) RETURNS jsonb
LANGUAGE sql STABLE STRICT AS $$ SELECT aptix_deref_at(payload::jsonb, path) $$;

-- A type change resets a column's compression to the default (pglz), which costs several times
-- lz4's CPU on every write: each column keeps lz4 (migration 0011), the rewritten rows too.
ALTER TABLE sessions ALTER COLUMN state DROP DEFAULT,
    ALTER COLUMN state TYPE json USING state::json,
    ALTER COLUMN state SET DEFAULT '{}'::json,
    ALTER COLUMN state SET COMPRESSION lz4;
ALTER TABLE llm_results ALTER COLUMN result TYPE json USING result::json,
    ALTER COLUMN result SET COMPRESSION lz4;
ALTER TABLE response_records ALTER COLUMN request_payload TYPE json USING request_payload::json,
    ALTER COLUMN request_payload SET COMPRESSION lz4,
    ALTER COLUMN response_payload TYPE json USING response_payload::json,
    ALTER COLUMN response_payload SET COMPRESSION lz4;
