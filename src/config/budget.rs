//! Money budgets (issue 45, docs/tenancy.md §7a): a ceiling in US dollars per UTC day and per UTC
//! month, for a tenant (`[tenant_limits]`, `tenants.<name>.limits`) and for a ConversationContext.
//! Amounts are kept in micro-dollars, so sums in PostgreSQL are exact; a call's worst case is
//! priced from the configured price table (`[[telemetry.prices]]`) and the context's
//! `max_output_tokens`, both of which a budget therefore requires.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{ConfigError, ModelPrice, Settings};

/// Largest amount a configuration may name: a trillion dollars, far below `i64` micro-dollars.
const MAX_USD: f64 = 1e12;

/// An amount of US dollars, in micro-dollars.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Usd(u64);

impl Usd {
    /// Zero: no budget.
    pub const ZERO: Usd = Usd(0);

    /// The amount of `micros` micro-dollars.
    pub fn from_micros(micros: u64) -> Self {
        Usd(micros)
    }

    /// Micro-dollars.
    pub fn micros(self) -> u64 {
        self.0
    }

    /// Micro-dollars as PostgreSQL's `bigint` (amounts are capped far below its range).
    pub fn micros_i64(self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }

    /// Dollars, for people and gauges.
    pub fn dollars(self) -> f64 {
        self.0 as f64 / 1e6
    }

    /// Whether this is zero (a budget of zero is no budget).
    pub fn is_zero(&self) -> bool {
        self.0 == 0
    }
}

impl std::fmt::Display for Usd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "${:.6}", self.dollars())
    }
}

impl Serialize for Usd {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.dollars())
    }
}

impl<'de> Deserialize<'de> for Usd {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let dollars = f64::deserialize(d)?;
        if !dollars.is_finite() || !(0.0..=MAX_USD).contains(&dollars) {
            return Err(serde::de::Error::custom(format!(
                "{dollars} is not an amount of dollars from 0 to {MAX_USD}"
            )));
        }
        Ok(Usd((dollars * 1e6).round() as u64))
    }
}

/// Ceilings per UTC day and per UTC month; zero is none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Budget {
    /// Spend per UTC day at most.
    pub per_day: Usd,
    /// Spend per UTC month at most.
    pub per_month: Usd,
}

impl Budget {
    /// Whether either ceiling is set.
    pub fn is_set(&self) -> bool {
        !(self.per_day.is_zero() && self.per_month.is_zero())
    }
}

impl ModelPrice {
    /// What `input` uncached input tokens and `output` output tokens cost at most.
    pub fn worst_case(&self, input: u64, output: u64) -> Usd {
        let micros =
            input as f64 * self.input_usd_per_mtok + output as f64 * self.output_usd_per_mtok;
        Usd(micros.ceil() as u64)
    }

    /// What `u` costs: cached input at its own price, reasoning as output (as providers bill).
    pub fn cost(&self, u: &crate::contracts::Usage) -> Usd {
        Usd((self.cost_usd(u) * 1e6).ceil() as u64)
    }
}

impl Settings {
    /// The price of `model`, when the price table has it.
    pub fn price_of(&self, model: &str) -> Option<&ModelPrice> {
        self.telemetry.prices.iter().find(|p| p.model == model)
    }

    /// The budget of ConversationContext `id` (none for an unknown id).
    pub fn context_budget(&self, id: &str) -> Budget {
        self.conversation_contexts.get(id).map_or_else(Budget::default, |c| c.budget())
    }

    /// Whether any budget is configured: only then are calls reserved and settled.
    pub fn budgets_configured(&self) -> bool {
        self.tenant_limits.budget().is_set()
            || self.tenants.values().any(|t| t.limits.over(self.tenant_limits).budget().is_set())
            || self.conversation_contexts.values().any(|c| c.budget().is_set())
    }

    /// Every context a budget applies to has a cap on output tokens and a priced model: without
    /// both, a call's worst case is unknown and the ceiling could be passed.
    pub(super) fn validate_budgets(&self) -> Result<(), ConfigError> {
        if self.tenants.is_empty() && self.tenant_limits.budget().is_set() {
            let key = if self.tenant_limits.usd_per_day.is_zero() {
                "usd_per_month"
            } else {
                "usd_per_day"
            };
            return Err(ConfigError::invalid(
                format!("tenant_limits.{key}"),
                "no tenant is configured, so no tenant's budget applies: set the budget on a ConversationContext instead",
            ));
        }
        let tenant_budget = |ctx: &str| {
            self.tenants.values().any(|t| {
                t.may_use_conversation(ctx) && t.limits.over(self.tenant_limits).budget().is_set()
            })
        };
        for (id, c) in &self.conversation_contexts {
            if !(c.budget().is_set() || tenant_budget(id)) {
                continue;
            }
            let key = |field: &str| format!("conversation_contexts.{id}.{field}");
            if c.max_output_tokens.is_none() {
                return Err(ConfigError::invalid(
                    key("max_output_tokens"),
                    "a budget applies to this context: set a cap on output tokens, which prices a call's worst case",
                ));
            }
            if self.price_of(&c.model).is_none() {
                return Err(ConfigError::invalid(
                    key("model"),
                    format!(
                        "a budget applies to this context: add `{}` to [[telemetry.prices]]",
                        c.model
                    ),
                ));
            }
        }
        Ok(())
    }
}
