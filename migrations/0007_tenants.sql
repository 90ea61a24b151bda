-- Tenancy (docs/tenancy.md). A session belongs to the tenant that created it; NULL: a
-- single-tenant deployment's session (or one created before tenants were configured).
ALTER TABLE sessions ADD COLUMN tenant text;
CREATE INDEX sessions_tenant_created ON sessions (tenant, created_at) WHERE tenant IS NOT NULL;
-- Each turn carries its session's tenant, so limits count without a join and replies route to
-- the tenant's reply queues; `started_at` is when it first ran (limits count starts per minute).
ALTER TABLE turns ADD COLUMN tenant text;
ALTER TABLE turns ADD COLUMN started_at timestamptz;
CREATE INDEX turns_tenant_open ON turns (tenant, state)
    WHERE tenant IS NOT NULL AND state IN ('queued', 'running', 'awaiting_tool_results');
CREATE INDEX turns_tenant_created ON turns (tenant, created_at) WHERE tenant IS NOT NULL;
CREATE INDEX turns_tenant_started ON turns (tenant, started_at) WHERE tenant IS NOT NULL;

-- One row per tenant, locked by every limit decision, so all workers decide as one.
CREATE TABLE tenant_locks (
    tenant text PRIMARY KEY
);

-- LLM tokens each round trip used, for the tokens-per-minute window; rows older than the
-- window are pruned as new ones arrive.
CREATE TABLE tenant_tokens (
    tenant text NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    tokens bigint NOT NULL
);
CREATE INDEX tenant_tokens_window ON tenant_tokens (tenant, at);
