-- `aptix eval` runs (issue 45): each arm is a reprocess run (`<run>.<arm>`, its records linked to
-- their originals as any reprocess run's); this keeps the run's last report (arms, scorers,
-- means with intervals, paired comparisons, worst regressions) for the console. The report is
-- versioned JSON (`"version": 1`).
CREATE TABLE eval_runs (
    run        text PRIMARY KEY,
    report     jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
