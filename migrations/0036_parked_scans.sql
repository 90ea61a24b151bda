-- A tenant's parked replies, counted each time one of its queues refuses a reply (its bound,
-- `MAX_PARKED_PER_TENANT`): without an index the count read the whole table, every tenant's
-- rows, for every refusal. The expression makes "no tenant" (NULL) one key like any other.
CREATE INDEX IF NOT EXISTS undelivered_tenant ON undelivered ((coalesce(tenant, '')), id);

-- The queues that have parked replies, walked on `undelivered_queue` one step per queue however
-- many replies each holds (a loose index scan: `DISTINCT queue` reads every row). The redelivery
-- loop reads it twice a second in every stage process, and its claims start from it.
CREATE FUNCTION aptix_parked_queues() RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE queues (queue) AS (
        (SELECT queue FROM undelivered ORDER BY queue LIMIT 1)
        UNION ALL
        SELECT (SELECT n.queue FROM undelivered n WHERE n.queue > q.queue
                ORDER BY n.queue LIMIT 1)
        FROM queues q WHERE q.queue IS NOT NULL)
    SELECT queue FROM queues WHERE queue IS NOT NULL
$$;
