-- Stored refusals are kept per tenant, at most MAX_STORED_REFUSALS_PER_TENANT each (src/store/
-- refusals.rs): over it, that tenant's oldest go. `tenant` is '' in a single-tenant deployment;
-- rows stored before this migration have none and are not counted. `reply_counts` holds each
-- tenant's count, bumped by the statement that stores, so the quota never counts the table.
ALTER TABLE replies ADD COLUMN tenant text;
CREATE INDEX replies_tenant ON replies (tenant, created_at, message_id) WHERE tenant IS NOT NULL;
CREATE TABLE reply_counts (
    tenant  text PRIMARY KEY,
    n       bigint NOT NULL
);
