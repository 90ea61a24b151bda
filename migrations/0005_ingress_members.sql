-- Validate workers sharing the ingress partitions (amqp.ingress_partitions > 1) announce
-- themselves here every second; each computes the same even share of partitions from the live
-- members. Only balance depends on it: which worker consumes a partition is decided by the
-- broker (one active consumer per partition queue), so a stale row can never cause two.
CREATE TABLE ingress_members (
    prefix text NOT NULL,
    member text NOT NULL,
    beat_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (prefix, member)
);
