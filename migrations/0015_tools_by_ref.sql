-- The tool definitions of a `/responses` call are the same on every turn of a conversation
-- context, and the provider echoes them back: each turn wrote them three times (the record's
-- request and response payloads, and the saved answer's raw response), about 3 KB of WAL per
-- turn (docs/benchmarks.md, "Sixth pass"). The pipeline now keeps them once in `session_texts`,
-- by the SHA-256 of their JSON text, and the stored JSON holds {"aptix_text_ref": "<sha256>"} in
-- their place (src/store/tool_refs.rs). The provider's `tools` is always an array, so an object
-- there is always a reference. Rows written before hold their arrays inline and read as they
-- are. Reading them in SQL: aptix_deref_at(request_payload, '{tools}'),
-- aptix_deref_at(result, '{job,result,raw,tools}') for a saved answer.

-- `payload` with the reference at `path`, if there is one, replaced by the JSON it refers to:
-- what was written. A reference to a text that is not stored is an error, never a null.
CREATE FUNCTION aptix_deref_at(payload jsonb, path text[]) RETURNS jsonb
LANGUAGE plpgsql STABLE STRICT AS $$
DECLARE
    sha  text := payload #>> (path || '{aptix_text_ref}'::text[]);
    body text;
BEGIN
    IF sha IS NULL OR jsonb_typeof(payload #> path) <> 'object' THEN
        RETURN payload;
    END IF;
    SELECT t.body INTO body FROM session_texts t WHERE t.sha256 = sha;
    IF body IS NULL THEN
        RAISE EXCEPTION 'stored JSON references text %, which is not stored', sha
            USING ERRCODE = 'data_corrupted';
    END IF;
    RETURN jsonb_set(payload, path, body::jsonb);
END $$;
