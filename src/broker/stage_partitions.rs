//! Partitioned stage queues (`amqp.stage_partitions` = N > 1): in front of each stage after the
//! ingress, a consistent-hash exchange `P.<stage>.p<N>` routes every message by a random key to
//! one of N queues `P.<stage>.p<N>.<i>`. One queue is one Erlang process on one node (one Raft
//! leader on a quorum cluster), so one stage's traffic can only spread over a cluster this way.
//!
//! Stage queues, unlike the ingress, keep no order: every worker of a stage consumes every
//! partition (competing consumers) and the stage's single queue `P.<stage>` besides. That queue
//! keeps what is addressed to the stage rather than to a partition: retries back from a delay
//! tier, requeued redeliveries and replayed dead letters. While N changes, workers also declare
//! and consume the partitions of the earlier layouts named in `amqp.draining_stage_partitions`,
//! so that nothing published there by workers of the old setting is stranded (docs/deploy.md).

use super::{OutMessage, StageName, Topology};

/// One partition layout of a stage: `partitions` queues behind one consistent-hash exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageLayout {
    /// How many partitions.
    pub partitions: u16,
    /// The hash exchange in front of them.
    pub exchange: String,
    /// The partition queues, in order.
    pub queues: Vec<String>,
}

impl Topology {
    /// The same names, with `partitions` (a power of two, checked by the configuration)
    /// partitions of each stage queue after the ingress.
    pub fn with_stage_partitions(mut self, partitions: u16) -> Self {
        self.stage_partitions = partitions.max(1);
        self
    }

    /// Partitions of each stage queue after the ingress (1: the single queue alone).
    pub fn stage_partitions(&self) -> u16 {
        self.stage_partitions
    }

    /// The consistent-hash exchange in front of `stage`'s partitions.
    pub fn stage_exchange(&self, stage: StageName) -> String {
        format!("{}.{}.p{}", self.prefix(), stage.as_str(), self.stage_partitions)
    }

    /// Whether messages to `stage` go through its partitions (never the ingress stage's).
    fn is_partitioned(&self, stage: StageName) -> bool {
        self.stage_partitions > 1 && !self.is_ingress(stage)
    }

    /// `stage`'s partition queues in order; none with one partition or for the ingress stage.
    pub fn stage_partition_queues(&self, stage: StageName) -> Vec<String> {
        let n = self.stage_partitions;
        if !self.is_partitioned(stage) {
            return Vec::new();
        }
        let width = (n - 1).to_string().len();
        (0..n).map(|i| format!("{}.{i:0width$}", self.stage_exchange(stage))).collect()
    }

    /// Every queue a worker of `stage` consumes: the ingress layout for the first stage; the
    /// stage's single queue, its partitions and those of the layouts being drained for the
    /// others.
    pub fn consumed_queues(&self, stage: StageName) -> Vec<String> {
        if self.is_ingress(stage) {
            return self.ingress_queues();
        }
        let mut queues = vec![self.stage_queue(stage)];
        queues.extend(self.stage_layouts(stage).into_iter().flat_map(|l| l.queues));
        queues
    }

    /// A message for `stage`: straight to the stage's queue, or through its hash exchange to a
    /// partition chosen at random. Not by SessionId, which a client chooses: a tenant could pick
    /// sessions that all hash to one partition and crowd the few places each worker gives it
    /// (prefetch ÷ N), while stage queues keep no order that a key would serve.
    pub fn stage_message(
        &self,
        stage: StageName,
        kind: &str,
        message_id: String,
        body: Vec<u8>,
    ) -> OutMessage {
        // Asked for every message a stage sends: no partition names are built for it.
        if !self.is_partitioned(stage) {
            return OutMessage::to_queue(self.stage_queue(stage), kind, message_id, body);
        }
        let key = format!("{:016x}", rand::random::<u64>());
        let mut m = OutMessage::to_queue(key, kind, message_id, body);
        m.exchange = self.stage_exchange(stage);
        m
    }

    /// The single queue of the stage after the ingress that a message published to `exchange`
    /// under `routing_key` reaches (its MAC names that queue, whichever partition carries it),
    /// or `None` when it goes to no such stage.
    pub fn inner_stage_destination(&self, exchange: &str, routing_key: &str) -> Option<String> {
        let via_hash = self
            .stages()
            .iter()
            .skip(1)
            .find(|s| self.stage_partitions > 1 && exchange == self.stage_exchange(**s));
        match via_hash {
            Some(stage) => Some(self.stage_queue(*stage)),
            None => self.inner_stage_of_queue(routing_key).map(|s| self.stage_queue(s)),
        }
    }

    /// The same names, also declaring and consuming the stage partitions of the earlier
    /// `layouts` (`amqp.draining_stage_partitions`) until what they hold is drained.
    pub fn draining_stage_partitions(mut self, layouts: &[u16]) -> Self {
        let current = self.stage_partitions;
        let mut earlier: Vec<u16> =
            layouts.iter().copied().filter(|&n| n > 1 && n != current).collect();
        earlier.sort_unstable();
        earlier.dedup();
        self.draining_stage_partitions = earlier.into();
        self
    }

    /// `stage`'s partition layouts, the current one first and then those being drained; none
    /// when the stage has a single queue only (or is the ingress).
    pub fn stage_layouts(&self, stage: StageName) -> Vec<StageLayout> {
        let counts = std::iter::once(self.stage_partitions);
        let counts = counts.chain(self.draining_stage_partitions.iter().copied());
        counts
            .map(|n| self.clone().with_stage_partitions(n))
            .map(|t| StageLayout {
                partitions: t.stage_partitions,
                exchange: t.stage_exchange(stage),
                queues: t.stage_partition_queues(stage),
            })
            .filter(|layout| !layout.queues.is_empty())
            .collect()
    }

    /// The stage after the ingress whose single queue or partition (of any layout) `queue` is.
    pub(super) fn inner_stage_of_queue(&self, queue: &str) -> Option<StageName> {
        let name = queue.strip_prefix(self.prefix())?.strip_prefix('.')?;
        self.stages().iter().skip(1).copied().find(|s| {
            name.strip_prefix(s.as_str()).is_some_and(|rest| rest.is_empty() || is_partition(rest))
        })
    }
}

/// Whether `rest` is a partition suffix: `.p<N>.<i>`, both decimal.
fn is_partition(rest: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    rest.strip_prefix(".p")
        .and_then(|r| r.split_once('.'))
        .is_some_and(|(n, i)| digits(n) && digits(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology(n: u16) -> Topology {
        let stages = ["validate", "retrieve", "invoke"].map(StageName::new);
        Topology::new("t").with_stages(&stages).with_stage_partitions(n)
    }

    #[test]
    fn one_partition_is_the_single_queue() {
        let t = topology(1);
        let retrieve = StageName::new("retrieve");
        assert_eq!(t.consumed_queues(retrieve), ["t.retrieve"]);
        let m = t.stage_message(retrieve, "turn", "id".into(), vec![]);
        assert_eq!((m.exchange.as_str(), m.routing_key.as_str()), ("", "t.retrieve"));
        assert_eq!(t.inner_stage_destination("", "t.retrieve").as_deref(), Some("t.retrieve"));
    }

    #[test]
    fn partitions_route_through_the_hash_exchange_and_name_the_single_queue() {
        let t = topology(16);
        let invoke = StageName::new("invoke");
        let queues = t.consumed_queues(invoke);
        assert_eq!(queues.len(), 17);
        assert_eq!((queues[0].as_str(), queues[1].as_str()), ("t.invoke", "t.invoke.p16.00"));
        assert_eq!(queues[16], "t.invoke.p16.15");
        let m = t.stage_message(invoke, "turn", "id".into(), vec![]);
        let again = t.stage_message(invoke, "turn", "id".into(), vec![]);
        assert_eq!(m.exchange, "t.invoke.p16");
        // A key of its own each time, whatever the session: no client steers the partition.
        assert_ne!(m.routing_key, again.routing_key);
        let dest = t.inner_stage_destination(&m.exchange, &m.routing_key);
        assert_eq!(dest.as_deref(), Some("t.invoke"));
        // A partition of another layout is still the stage's (a replayed dead letter).
        assert!(t.is_inner_stage_queue("t.invoke.p4.3"));
        assert_eq!(t.inner_stage_destination("", "t.invoke.p4.3").as_deref(), Some("t.invoke"));
        // The ingress is never partitioned this way, and look-alikes are not stage queues.
        assert!(t.stage_partition_queues(StageName::new("validate")).is_empty());
        for foreign in ["t.invoke.p4", "t.invoke.p.1", "t.invoke.px.1", "t.invokes", "u.invoke"] {
            assert!(!t.is_inner_stage_queue(foreign), "{foreign}");
        }
        assert_eq!(t.inner_stage_destination("t.requests", "s1"), None);
    }

    #[test]
    fn layouts_being_drained_are_consumed_beside_the_current_one() {
        let t = topology(4).draining_stage_partitions(&[2, 4, 1, 2]);
        let retrieve = StageName::new("retrieve");
        let queues = t.consumed_queues(retrieve);
        assert_eq!(queues.len(), 1 + 4 + 2, "{queues:?}");
        assert_eq!(&queues[5..], ["t.retrieve.p2.0", "t.retrieve.p2.1"]);
        let layouts: Vec<String> =
            t.stage_layouts(retrieve).into_iter().map(|l| l.exchange).collect();
        assert_eq!(layouts, ["t.retrieve.p4", "t.retrieve.p2"]);
        // A message goes to the current layout only.
        let m = t.stage_message(retrieve, "turn", "id".into(), vec![]);
        assert_eq!(m.exchange, "t.retrieve.p4");
    }

    #[test]
    fn a_dead_letter_from_a_partition_is_replayed_to_its_stages_single_queue() {
        let t = topology(4);
        let letter = super::super::DeadLetter {
            id: "m1".into(),
            reason: "delivery_limit".into(),
            stage: None,
            // A partition of a layout that may be gone: nobody may read it any more.
            original_queue: Some("t.invoke.p16.07".into()),
            original_type: Some("turn".into()),
            user: None,
            session_id: Some("s1".into()),
            turn_id: None,
            reply_to: None,
            queue: "t.dead".into(),
            headers: Default::default(),
            body: b"{}".to_vec(),
            body_bytes: 2,
        };
        let replay = t.replay_of(&letter);
        assert_eq!((replay.exchange.as_str(), replay.routing_key.as_str()), ("", "t.invoke"));
    }
}
