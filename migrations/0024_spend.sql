-- Money budgets (issue 45, docs/tenancy.md §7a). One row per LLM call of a turn that a budget
-- applies to: its worst case is reserved before the call and the row settled to the call's cost
-- when its round trip is persisted. An open row (cost_micros NULL) counts at its reservation, so
-- the sums below never under-count a call in flight or one whose worker died.
CREATE TABLE spend (
    id              bigserial PRIMARY KEY,
    tenant          text,
    context         text NOT NULL,
    session_id      uuid NOT NULL,
    turn_id         text NOT NULL,
    step            integer NOT NULL,
    reserved_micros bigint NOT NULL CHECK (reserved_micros >= 0),
    cost_micros     bigint CHECK (cost_micros >= 0),
    at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    settled_at      timestamptz
);
CREATE INDEX spend_tenant ON spend (tenant, at) WHERE tenant IS NOT NULL;
CREATE INDEX spend_context ON spend (context, at);
-- At most one open reservation per round trip: a new attempt of its call first settles the
-- previous attempt's at its reservation (that attempt may have been billed).
CREATE UNIQUE INDEX spend_open ON spend (session_id, turn_id, step) WHERE cost_micros IS NULL;

-- One row per budget scope (`tenant:<name>`, `context:<id>`), locked by each reservation so
-- every invoke worker decides as one.
CREATE TABLE budget_locks (scope text PRIMARY KEY);
