-- What a turn will at least use of its tenant's `tokens_per_minute`: its request's size over four
-- (a token per four bytes), kept with the turn when it is admitted. Each turn in flight now
-- reserves the most of this and the tenant's reservation (docs/tenancy.md §7); before, only the
-- asking turn's own estimate counted, so with `over_limit = "queue"` held turns with large
-- requests all started on reservations of 1,000 tokens. The size is the request's as PostgreSQL
-- holds it before compression (`pg_column_size` of the new row's value: no serialising), close
-- to its JSON text's. Turns admitted before this have none, and reserve the tenant's
-- reservation only, as before.
ALTER TABLE turns ADD COLUMN token_estimate bigint;

CREATE FUNCTION aptix_token_estimate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.token_estimate := pg_column_size(NEW.request) / 4;
    RETURN NEW;
END $$;

CREATE TRIGGER turns_token_estimate BEFORE INSERT ON turns
    FOR EACH ROW EXECUTE FUNCTION aptix_token_estimate();
