-- The options a reprocessing run (`aptix reprocess --run`, each arm of `aptix eval`) was started
-- with. Its records so far were made with them, and a run that mixed two models or contexts
-- would report neither: resuming it with other options is refused. A run begun before this
-- table is claimed by its first resume.
CREATE TABLE reprocess_runs (
    run                     text PRIMARY KEY,
    model                   text,
    conversation_context_id text,
    started_at              timestamptz NOT NULL DEFAULT now()
);
