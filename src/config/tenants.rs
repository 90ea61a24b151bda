//! Tenants (docs/tenancy.md): who may publish, which contexts each may use, and how much each may
//! consume. A tenant is bound to the RabbitMQ users that publish for it, so its identity comes
//! from the broker-checked `user_id` property, never from a request body. With no tenant
//! configured, Aptix is single-tenant and nothing here applies.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::budget::{Budget, Usd};
use super::{ConfigError, Settings};
use crate::contracts::{ContextId, TenantName};

/// One tenant: its publishers and what they may use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tenant {
    /// RabbitMQ users whose requests are this tenant's (two during a password rotation).
    pub users: Vec<String>,
    /// AgentContexts it may name; the first is its default.
    pub agent_contexts: Vec<String>,
    /// ConversationContexts it may name; the first is its default.
    pub conversation_contexts: Vec<String>,
    /// Its limits; unset ones come from `[tenant_limits]`.
    #[serde(default)]
    pub limits: LimitOverrides,
}

/// What happens to a turn over one of its tenant's turn limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OverLimit {
    /// Refused at once with the limit's error code.
    #[default]
    Refuse,
    /// Held in PostgreSQL, in arrival order, and started when the tenant is under its limits.
    Queue,
}

/// A tenant's limits; 0 means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLimits {
    /// Turns started and not ended (running or awaiting tool results).
    #[serde(default)]
    pub turns_in_flight: u32,
    /// Turns started per minute (bursts up to the same number).
    #[serde(default)]
    pub turns_per_minute: u32,
    /// Sessions created per minute; over it a new session is always refused.
    #[serde(default)]
    pub sessions_per_minute: u32,
    /// LLM tokens (input + output) per minute; turns start while the minute's budget is left.
    #[serde(default)]
    pub tokens_per_minute: u64,
    /// Spend in US dollars per UTC day (docs/tenancy.md §7a).
    #[serde(default, skip_serializing_if = "Usd::is_zero")]
    pub usd_per_day: Usd,
    /// Spend in US dollars per UTC month.
    #[serde(default, skip_serializing_if = "Usd::is_zero")]
    pub usd_per_month: Usd,
    /// What a turn over `turns_in_flight`, `turns_per_minute`, `tokens_per_minute` or a budget
    /// gets.
    #[serde(default)]
    pub over_limit: OverLimit,
}

impl TenantLimits {
    /// Whether none of them limits anything (`over_limit` then never applies).
    pub fn unlimited(&self) -> bool {
        let counts = [self.turns_in_flight, self.turns_per_minute, self.sessions_per_minute];
        counts.iter().all(|n| *n == 0)
            && self.tokens_per_minute == 0
            && self.usd_per_day.is_zero()
            && self.usd_per_month.is_zero()
    }

    /// Its money budget.
    pub fn budget(&self) -> Budget {
        Budget { per_day: self.usd_per_day, per_month: self.usd_per_month }
    }
}

/// A tenant's own values for some limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitOverrides {
    #[serde(default)]
    turns_in_flight: Option<u32>,
    #[serde(default)]
    turns_per_minute: Option<u32>,
    #[serde(default)]
    sessions_per_minute: Option<u32>,
    #[serde(default)]
    tokens_per_minute: Option<u64>,
    #[serde(default)]
    usd_per_day: Option<Usd>,
    #[serde(default)]
    usd_per_month: Option<Usd>,
    #[serde(default)]
    over_limit: Option<OverLimit>,
}

impl LimitOverrides {
    pub(super) fn over(&self, d: TenantLimits) -> TenantLimits {
        TenantLimits {
            turns_in_flight: self.turns_in_flight.unwrap_or(d.turns_in_flight),
            turns_per_minute: self.turns_per_minute.unwrap_or(d.turns_per_minute),
            sessions_per_minute: self.sessions_per_minute.unwrap_or(d.sessions_per_minute),
            tokens_per_minute: self.tokens_per_minute.unwrap_or(d.tokens_per_minute),
            usd_per_day: self.usd_per_day.unwrap_or(d.usd_per_day),
            usd_per_month: self.usd_per_month.unwrap_or(d.usd_per_month),
            over_limit: self.over_limit.unwrap_or(d.over_limit),
        }
    }
}

/// Who published a submission, as far as the configuration is concerned.
#[derive(Debug, Clone, PartialEq)]
pub enum Publisher<'a> {
    /// No tenant is configured: everyone is trusted alike.
    SingleTenant,
    /// A configured tenant.
    Tenant(TenantName, &'a Tenant),
    /// Tenants are configured and this user (or a missing `user_id`) is none of theirs.
    Unknown,
}

impl Tenant {
    /// Whether it may name this AgentContext.
    pub fn may_use_agent(&self, id: &str) -> bool {
        self.agent_contexts.iter().any(|c| c == id)
    }

    /// Whether it may name this ConversationContext.
    pub fn may_use_conversation(&self, id: &str) -> bool {
        self.conversation_contexts.iter().any(|c| c == id)
    }
}

impl Settings {
    /// Whether tenants are configured.
    pub fn multi_tenant(&self) -> bool {
        !self.tenants.is_empty()
    }

    /// The configured tenants' names (checked at start-up, so none is dropped here).
    pub fn tenant_names(&self) -> Vec<TenantName> {
        self.tenants.keys().filter_map(|n| n.parse().ok()).collect()
    }

    /// The tenant of a submission's broker-checked `user_id`.
    pub fn publisher(&self, user_id: Option<&str>) -> Publisher<'_> {
        if self.tenants.is_empty() {
            return Publisher::SingleTenant;
        }
        let Some(user) = user_id else { return Publisher::Unknown };
        for (name, tenant) in &self.tenants {
            if tenant.users.iter().any(|u| u == user) {
                // Names were checked at start-up.
                if let Ok(name) = name.parse() {
                    return Publisher::Tenant(name, tenant);
                }
            }
        }
        Publisher::Unknown
    }

    /// A tenant's effective limits (its own over `[tenant_limits]`); unlimited for none.
    pub fn limits_of(&self, tenant: Option<&TenantName>) -> TenantLimits {
        match tenant.and_then(|t| self.tenants.get(t.as_str())) {
            Some(t) => t.limits.over(self.tenant_limits),
            None => TenantLimits::default(),
        }
    }

    /// The AgentContext a request of `tenant` means by `id` (its default when absent).
    pub fn agent_context_id_for(&self, tenant: Option<&Tenant>, id: Option<&ContextId>) -> String {
        let default =
            tenant.and_then(|t| t.agent_contexts.first()).unwrap_or(&self.default_agent_context);
        id.map_or_else(|| default.clone(), |c| c.as_str().to_owned())
    }

    /// The ConversationContext a request of `tenant` means by `id` (its default when absent).
    pub fn conversation_context_id_for(
        &self,
        tenant: Option<&Tenant>,
        id: Option<&ContextId>,
    ) -> String {
        let default = tenant
            .and_then(|t| t.conversation_contexts.first())
            .unwrap_or(&self.default_conversation_context);
        id.map_or_else(|| default.clone(), |c| c.as_str().to_owned())
    }

    /// Checks the tenants: valid names, known contexts, each user and each agent context (and
    /// so each collection and key) belonging to one tenant only.
    pub(super) fn validate_tenants(&self) -> Result<(), ConfigError> {
        let mut users = BTreeMap::new();
        let mut agents: BTreeMap<&str, &str> = BTreeMap::new();
        let mut collections: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, t) in &self.tenants {
            let key = |field: &str| format!("tenants.{name}.{field}");
            name.parse::<TenantName>()
                .map_err(|m| ConfigError::invalid(format!("tenants.{name}"), m.to_string()))?;
            if t.users.is_empty() || t.users.iter().any(|u| u.is_empty()) {
                return Err(ConfigError::invalid(key("users"), "name at least one RabbitMQ user"));
            }
            for u in &t.users {
                if let Some(other) = users.insert(u.as_str(), name.as_str()) {
                    return Err(ConfigError::invalid(
                        key("users"),
                        format!("user `{u}` already belongs to tenant `{other}`"),
                    ));
                }
            }
            for (field, ids, known) in [
                (
                    "agent_contexts",
                    &t.agent_contexts,
                    self.agent_contexts.keys().collect::<BTreeSet<_>>(),
                ),
                (
                    "conversation_contexts",
                    &t.conversation_contexts,
                    self.conversation_contexts.keys().collect(),
                ),
            ] {
                if ids.is_empty() {
                    return Err(ConfigError::invalid(
                        key(field),
                        "name at least one (the first is the default)",
                    ));
                }
                if let Some(unknown) = ids.iter().find(|id| !known.contains(id)) {
                    return Err(ConfigError::invalid(
                        key(field),
                        format!("`{unknown}` is not defined"),
                    ));
                }
            }
            for id in &t.agent_contexts {
                if let Some(other) = agents.insert(id, name) {
                    if other != name {
                        return Err(ConfigError::invalid(
                            key("agent_contexts"),
                            format!("`{id}` already belongs to tenant `{other}`: an agent context's key and collection serve one tenant"),
                        ));
                    }
                }
                let collection = self.agent_contexts[id].collection.as_str();
                if let Some(other) = collections.insert(collection, name) {
                    if other != name {
                        return Err(ConfigError::invalid(
                            key("agent_contexts"),
                            format!("`{id}` uses collection `{collection}` of tenant `{other}`"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_unlimited_only_when_none_is_set() {
        let none = TenantLimits::default();
        assert!(none.unlimited());
        assert!(TenantLimits { over_limit: OverLimit::Refuse, ..none }.unlimited());
        let one_each = [
            TenantLimits { turns_in_flight: 1, ..none },
            TenantLimits { turns_per_minute: 1, ..none },
            TenantLimits { sessions_per_minute: 1, ..none },
            TenantLimits { tokens_per_minute: 1, ..none },
            TenantLimits { usd_per_day: Usd::from_micros(1), ..none },
            TenantLimits { usd_per_month: Usd::from_micros(1), ..none },
        ];
        for limits in one_each {
            assert!(!limits.unlimited(), "{limits:?}");
        }
    }
}
