-- A reprocess run's records by run (its comparison, eval's rows, the claim's look for records):
-- the unique index leads with `reprocess_of`, so these read every record of the table. Partial,
-- so live records cost it nothing. Built in the migration's transaction, which blocks writes to
-- `response_records` while the table is read once (not CONCURRENTLY: the build would wait for
-- the other workers' sessions queued on the migration lock, a deadlock PostgreSQL ends by
-- aborting the build); migrations run without the pool's statement timeout (`Store::migrate`).
CREATE INDEX IF NOT EXISTS response_records_run
    ON response_records (reprocess_run) WHERE reprocess_of IS NOT NULL;
