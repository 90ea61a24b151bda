//! The rules a configuration must meet before anything starts: every key that can be wrong is
//! named in the error.

use super::{ConfigError, QueueType, Settings};
use crate::contracts::ContextId;

impl Settings {
    /// Checks that per-stage tables only name stages of the pipeline `stages` (run when the
    /// pipeline is known, at worker start).
    pub fn check_stage_names(&self, stages: &[&str]) -> Result<(), ConfigError> {
        let p = &self.pipeline;
        let unknown = p.prefetch.unknown(stages).map(|k| ("prefetch", k));
        let mut unknown =
            unknown.chain(p.max_attempts.unknown(stages).map(|k| ("max_attempts", k)));
        if let Some((table, key)) = unknown.next() {
            return Err(ConfigError::invalid(
                format!("pipeline.{table}.{key}"),
                format!("no stage is called `{key}`; the pipeline has {}", stages.join(", ")),
            ));
        }
        Ok(())
    }

    /// Checks every cross-key rule; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for url in self.amqp.url.expose().split(',') {
            if !(url.starts_with("amqp://") || url.starts_with("amqps://")) {
                return Err(ConfigError::invalid(
                    "amqp.url",
                    "each node's URL (comma-separated) must start with amqp:// or amqps://",
                ));
            }
        }
        let prefix_ok = !self.amqp.prefix.is_empty()
            && self
                .amqp
                .prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !prefix_ok {
            return Err(ConfigError::invalid(
                "amqp.prefix",
                "use letters, digits, `.`, `_` or `-`",
            ));
        }
        let p = self.amqp.ingress_partitions;
        if !p.is_power_of_two() || p > 1024 {
            return Err(ConfigError::invalid(
                "amqp.ingress_partitions",
                format!("{p} is not a power of two from 1 to 1024"),
            ));
        }
        let p = self.amqp.stage_partitions;
        if !p.is_power_of_two() || p > 256 {
            return Err(ConfigError::invalid(
                "amqp.stage_partitions",
                format!("{p} is not a power of two from 1 to 256"),
            ));
        }
        for &old in &self.amqp.draining_stage_partitions {
            if !old.is_power_of_two() || !(2..=256).contains(&old) || old == p {
                return Err(ConfigError::invalid(
                    "amqp.draining_stage_partitions",
                    format!("{old} is not an earlier stage_partitions (a power of two from 2 to 256, other than {p})"),
                ));
            }
        }
        if self.amqp.queue_type == QueueType::Quorum && self.pipeline.max_redeliveries > 32 {
            return Err(ConfigError::invalid(
                "pipeline.max_redeliveries",
                "at most 32 with quorum queues (their delivery limit, 64, is the backstop)",
            ));
        }
        if self.pipeline.stream_events_per_step > 999_998 {
            // A step's reply has event sequence 999,999 after its deltas (§9a).
            return Err(ConfigError::invalid(
                "pipeline.stream_events_per_step",
                "at most 999998 (a step's reply comes at 999999)",
            ));
        }
        let db = self.database.url.expose();
        if !(db.starts_with("postgres://") || db.starts_with("postgresql://")) {
            return Err(ConfigError::invalid(
                "database.url",
                "must start with postgres:// or postgresql://",
            ));
        }
        self.pipeline.message_keys()?;
        if self.pipeline.worker_threads > 1024 {
            return Err(ConfigError::invalid("pipeline.worker_threads", "at most 1024 (0: auto)"));
        }
        if self.database.max_connections == 0 {
            return Err(ConfigError::invalid("database.max_connections", "must be at least 1"));
        }
        let llm = self.llm.base_url.expose();
        if !(llm.starts_with("http://") || llm.starts_with("https://")) {
            return Err(ConfigError::invalid(
                "llm.base_url",
                "must start with http:// or https://",
            ));
        }
        for (key, value) in [
            ("llm.connect_timeout_ms", self.llm.connect_timeout_ms),
            ("llm.request_timeout_ms", self.llm.request_timeout_ms),
            ("llm.stream_idle_timeout_ms", self.llm.stream_idle_timeout_ms),
            ("llm.call_budget_ms", self.llm.call_budget_ms),
        ] {
            if value == 0 {
                return Err(ConfigError::invalid(key, "must be at least 1"));
            }
        }
        // Not below the heartbeat: a broker that blocks publishers (a memory or disk alarm)
        // must not make every publish time out and every message be redelivered.
        if self.pipeline.confirm_timeout_ms < 5_000 {
            return Err(ConfigError::invalid(
                "pipeline.confirm_timeout_ms",
                "must be at least 5000 (the heartbeat, 5 s)",
            ));
        }
        let metrics = &self.telemetry.metrics_listen;
        if !metrics.is_empty() && metrics.parse::<std::net::SocketAddr>().is_err() {
            // Checked here, not only when the listener binds: a worker without its probes would
            // run on while its orchestrator restarts it.
            return Err(ConfigError::invalid(
                "telemetry.metrics_listen",
                format!("`{metrics}` is not an IP address and port (`0.0.0.0:9464`), nor empty"),
            ));
        }
        if self.files.retention_hours == 0 {
            return Err(ConfigError::invalid(
                "files.retention_hours",
                "must be at least 1: a file kept 0 hours is gone before its link reaches anyone",
            ));
        }
        self.validate_pipeline()?;
        self.limits.check().map_err(|(key, message)| ConfigError::invalid(key, message))?;
        self.validate_contexts()?;
        self.validate_tenants()?;
        self.validate_budgets()
    }

    fn validate_pipeline(&self) -> Result<(), ConfigError> {
        for (stage, &n) in &self.pipeline.prefetch.0 {
            if n == 0 {
                // Refused rather than read as 1: to AMQP a prefetch of 0 means no limit.
                return Err(ConfigError::invalid(
                    format!("pipeline.prefetch.{stage}"),
                    "must be at least 1 (messages a consumer holds and handles at once)",
                ));
            }
        }
        for (stage, &n) in &self.pipeline.max_attempts.0 {
            if n == 0 {
                let key = format!("pipeline.max_attempts.{stage}");
                return Err(ConfigError::invalid(
                    key,
                    "must be at least 1: a message that can never succeed must end",
                ));
            }
        }
        // The invoke and persist messages carry the request about twice (the request and the
        // assembled body built from it) plus retrieved context and the session state.
        let overhead = (2 << 20) + super::MAX_CARRIED_STATE_BYTES;
        let needed = self.limits.max_request_bytes.saturating_mul(2).saturating_add(overhead);
        if needed > self.amqp.max_message_bytes {
            return Err(ConfigError::invalid(
                "limits.max_request_bytes",
                format!(
                    "a request this large makes stage messages of about {needed} bytes, over amqp.max_message_bytes ({}); lower it to at most {}",
                    self.amqp.max_message_bytes,
                    self.amqp.max_message_bytes.saturating_sub(overhead) / 2
                ),
            ));
        }
        Ok(())
    }

    fn validate_contexts(&self) -> Result<(), ConfigError> {
        for id in self.conversation_contexts.keys().chain(self.agent_contexts.keys()) {
            id.parse::<ContextId>().map_err(|m| ConfigError::invalid(id.clone(), m.to_string()))?;
        }
        for (id, ctx) in &self.conversation_contexts {
            ctx.check(&format!("conversation_contexts.{id}"))?;
        }
        for (id, ctx) in &self.agent_contexts {
            // The embedded store keeps a collection in a directory of that name: a name that
            // is a path (`../x`, `./acme`, `acme/`) would reach outside the data directory, or
            // another tenant's collection under a name that differs as a string only.
            if !is_collection_name(&ctx.collection) {
                return Err(ConfigError::invalid(
                    format!("agent_contexts.{id}.collection"),
                    COLLECTION_RULE,
                ));
            }
        }
        if !self.conversation_contexts.contains_key(&self.default_conversation_context) {
            return Err(ConfigError::invalid(
                "default_conversation_context",
                format!(
                    "`{}` is not defined under [conversation_contexts]",
                    self.default_conversation_context
                ),
            ));
        }
        if !self.agent_contexts.contains_key(&self.default_agent_context) {
            return Err(ConfigError::invalid(
                "default_agent_context",
                format!("`{}` is not defined under [agent_contexts]", self.default_agent_context),
            ));
        }
        Ok(())
    }
}

/// What a collection's name must be ([`is_collection_name`]).
pub const COLLECTION_RULE: &str =
    "must be 1-255 characters of A-Z, a-z, 0-9, '.', '_' or '-', not starting with '.'";

/// Whether `name` may name a collection: the embedded store keeps one in a directory of that
/// name, so a name that is a path (`../x`, `./acme`, `acme/`) would reach outside the data
/// directory, or another tenant's collection under a name that differs as a string only.
pub fn is_collection_name(name: &str) -> bool {
    let plain = name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    !name.is_empty() && name.len() <= 255 && !name.starts_with('.') && plain
}
