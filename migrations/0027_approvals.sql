-- Approval gates (docs/tools.md, "Approvals"): a round trip whose answer calls server tools that
-- need the client's approval leaves its turn `awaiting_approval` until the client answers or
-- `approval_expires_at` passes (then the calls are denied and the turn runs on).
ALTER TABLE turns ADD COLUMN approval_expires_at timestamptz;
ALTER TABLE turns DROP CONSTRAINT turns_state_check;
-- Added unchecked, then checked: the check scans `turns` without blocking its writers.
ALTER TABLE turns ADD CONSTRAINT turns_state_check
    CHECK (state IN ('queued', 'running', 'awaiting_tool_results', 'awaiting_approval', 'steered',
                     'completed', 'failed')) NOT VALID;
ALTER TABLE turns VALIDATE CONSTRAINT turns_state_check;
CREATE INDEX turns_approval_expiry ON turns (approval_expires_at)
    WHERE state = 'awaiting_approval';
-- A turn awaiting approval is in flight for its tenant's limits, like one awaiting tool results.
DROP INDEX turns_tenant_open;
CREATE INDEX turns_tenant_open ON turns (tenant, state)
    WHERE tenant IS NOT NULL
      AND state IN ('queued', 'running', 'awaiting_tool_results', 'awaiting_approval');
