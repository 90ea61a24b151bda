-- What a turn will at least use of its tenant's `tokens_per_minute`: its request's size over four
-- (a token per four bytes), its images counted 1,000 tokens each instead of their base64 (a
-- megabyte screenshot would count 330,000 and shut the tenant out while the turn runs), kept
-- with the turn when it is admitted (`request_estimate` in src/store/tenants.rs counts the same
-- for the asking turn). Each turn in flight now
-- reserves the most of this and the tenant's reservation (docs/tenancy.md §7); before, only the
-- asking turn's own estimate counted, so with `over_limit = "queue"` held turns with large
-- requests all started on reservations of 1,000 tokens. The size is the request's as PostgreSQL
-- holds it before compression (`pg_column_size` of the new row's value: no serialising), close
-- to its JSON text's. Turns admitted before this have none, and reserve the tenant's
-- reservation only, as before.
ALTER TABLE turns ADD COLUMN token_estimate bigint;

CREATE FUNCTION aptix_token_estimate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.token_estimate := CASE WHEN jsonb_typeof(NEW.request -> 'ClipboardImages') = 'array'
        THEN (pg_column_size(NEW.request) - pg_column_size(NEW.request -> 'ClipboardImages')) / 4
             + 1000 * jsonb_array_length(NEW.request -> 'ClipboardImages')
        ELSE pg_column_size(NEW.request) / 4 END;
    RETURN NEW;
END $$;

CREATE TRIGGER turns_token_estimate BEFORE INSERT ON turns
    FOR EACH ROW EXECUTE FUNCTION aptix_token_estimate();
