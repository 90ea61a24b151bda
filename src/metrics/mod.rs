//! Prometheus metrics and health: per-stage counts, failures by reason, retries, in-flight and
//! latency; LLM calls, tokens by kind and estimated cost. Served with `/healthz` (the process is
//! alive) and `/readyz` (broker connected and database answering) by [`serve`].
//!
//! Label values come from fixed sets only: a model id is a label only when it is configured
//! (see [`Metrics::allow_configured_models`]); any other name, such as one in a forged stage
//! message, is counted as [`OTHER_MODEL`], so no input can add series or write text into
//! `/metrics`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{OnceLock, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

mod health;

pub use health::{serve, serve_on, Ready};

use crate::config::{ModelPrice, Settings};
use crate::contracts::Usage;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    stage: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CostLabel {
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabel {
    scope: &'static str,
    name: String,
    period: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JsonLabel {
    op: &'static str,
    what: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AmqpLabel {
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabel {
    tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DependencyLabel {
    dependency: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabel {
    model: String,
    kind: String,
}

/// The `model` label of a call whose model is not configured.
pub const OTHER_MODEL: &str = "other";

/// Every metric of the process.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    messages: Family<OutcomeLabel, Counter>,
    in_flight: Family<StageLabel, Gauge>,
    duration: Family<StageLabel, Histogram>,
    llm_calls: Family<ModelLabel, Counter>,
    llm_duration: Family<ModelLabel, Histogram>,
    llm_http: Family<StatusLabel, Counter>,
    tokens: Family<TokenLabel, Counter>,
    cost_micro_usd: Family<CostLabel, Counter>,
    json: Family<JsonLabel, Counter>,
    amqp: Family<AmqpLabel, Counter>,
    tools_unknown: Family<ToolLabel, Counter>,
    dependency_up: Family<DependencyLabel, Gauge>,
    budget_ceiling: Family<BudgetLabel, Gauge>,
    budget_spent: Family<BudgetLabel, Gauge>,
    budget_reserved: Family<BudgetLabel, Gauge>,
    broker_connections: AtomicI64,
    known_models: RwLock<HashSet<String>>,
    broker_problem: RwLock<Option<String>>,
}

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("aptix");
        let messages = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "stage_messages",
            "Messages handled per stage by outcome (forwarded, retried, requeued, dead_lettered, unauthenticated (MAC not verified, dead-lettered), returned, publish_failed; validate counts publish_failed per refused try)",
            messages.clone(),
        );
        let in_flight = Family::<StageLabel, Gauge>::default();
        registry.register("stage_in_flight", "Messages being handled now", in_flight.clone());
        let duration = Family::<StageLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 18))
        });
        registry.register("stage_duration_seconds", "Time from delivery to ack", duration.clone());
        let llm_calls = Family::<ModelLabel, Counter>::default();
        registry.register(
            "llm_calls",
            "Responses API calls by model and outcome",
            llm_calls.clone(),
        );
        let llm_duration = Family::<ModelLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.05, 2.0, 14))
        });
        registry.register(
            "llm_call_duration_seconds",
            "Time from the first request to the provider to the end of its answer, retries included",
            llm_duration.clone(),
        );
        let llm_http = Family::<StatusLabel, Counter>::default();
        registry.register(
            "llm_http_responses",
            "HTTP answers from the provider by status code, every retry counted",
            llm_http.clone(),
        );
        let tokens = Family::<TokenLabel, Counter>::default();
        registry.register(
            "llm_tokens",
            "Tokens by model and kind (input, cached_input, output, reasoning)",
            tokens.clone(),
        );
        let cost_micro_usd = Family::<CostLabel, Counter>::default();
        registry.register(
            "llm_estimated_cost_micro_usd",
            "Estimated spend in millionths of a USD, from the configured price table",
            cost_micro_usd.clone(),
        );
        let json = Family::<JsonLabel, Counter>::default();
        registry.register(
            "json_ops",
            "JSON parses and serialisations of requests, stage messages, outbox rows, replies and stored state, by what",
            json.clone(),
        );
        let amqp = Family::<AmqpLabel, Counter>::default();
        registry.register(
            "amqp_methods",
            "AMQP methods this process sent, by method (basic.publish, basic.ack, queue.declare, ...)",
            amqp.clone(),
        );
        let tools_unknown = Family::<ToolLabel, Counter>::default();
        registry.register(
            "tool_outcomes_unknown",
            "Server tool calls whose effect is unknown (cut short and not idempotent, or sent and never answered), by tool (docs/tools.md)",
            tools_unknown.clone(),
        );
        let dependency_up = Family::<DependencyLabel, Gauge>::default();
        registry.register(
            "dependency_up",
            "Whether the broker and the database answer this process (1) or not (0), checked at each scrape",
            dependency_up.clone(),
        );
        let [budget_ceiling, budget_spent, budget_reserved] = [
            (
                "budget_ceiling_micro_usd",
                "A money budget's ceiling for its period (docs/tenancy.md §7a)",
            ),
            (
                "budget_spent_micro_usd",
                "Spent of a money budget this period, reservations of calls in flight included",
            ),
            (
                "budget_reserved_micro_usd",
                "Of the spent, reserved by calls in flight and not yet settled",
            ),
        ]
        .map(|(name, help)| {
            let family = Family::<BudgetLabel, Gauge>::default();
            registry.register(name, help, family.clone());
            family
        });
        Metrics {
            budget_ceiling,
            budget_spent,
            budget_reserved,
            llm_duration,
            llm_http,
            dependency_up,
            json,
            amqp,
            tools_unknown,
            registry,
            messages,
            in_flight,
            duration,
            llm_calls,
            tokens,
            cost_micro_usd,
            broker_connections: AtomicI64::new(0),
            known_models: RwLock::new(HashSet::new()),
            broker_problem: RwLock::new(None),
        }
    }

    /// Sets a money budget's gauges for one period: its ceiling, what is spent (reservations
    /// included) and what calls in flight have reserved, in micro-dollars.
    pub fn budget(
        &self,
        (scope, name, period): (&'static str, &str, &'static str),
        ceiling: i64,
        spent: i64,
        reserved: i64,
    ) {
        let label = BudgetLabel { scope, name: name.to_owned(), period };
        self.budget_ceiling.get_or_create(&label).set(ceiling);
        self.budget_spent.get_or_create(&label).set(spent);
        self.budget_reserved.get_or_create(&label).set(reserved);
    }

    /// Counts one JSON parse or serialisation (`op`) of `what` (docs/benchmarks.md, "Work per turn").
    pub fn json(&self, op: &'static str, what: &'static str) {
        self.json.get_or_create(&JsonLabel { op, what }).inc();
    }

    /// Counts a server tool call of `tool` whose effect is unknown.
    pub fn tool_outcome_unknown(&self, tool: &str) {
        self.tools_unknown.get_or_create(&ToolLabel { tool: tool.to_owned() }).inc();
    }

    /// Counts one AMQP `method` sent (docs/benchmarks.md, "Profile of a turn").
    pub fn amqp(&self, method: &'static str) {
        self.amqp.get_or_create(&AmqpLabel { method }).inc();
    }

    /// How many AMQP `method`s this process sent.
    pub fn amqp_count(&self, method: &'static str) -> u64 {
        self.amqp.get_or_create(&AmqpLabel { method }).get()
    }

    /// How many `op`s of `what` this process did.
    pub fn json_count(&self, op: &'static str, what: &'static str) -> u64 {
        self.json.get_or_create(&JsonLabel { op, what }).get()
    }

    /// Counts a settled message.
    pub fn message(&self, stage: &str, outcome: &str) {
        self.messages
            .get_or_create(&OutcomeLabel { stage: stage.to_owned(), outcome: outcome.to_owned() })
            .inc();
    }

    /// Marks a message in flight until the guard drops, then records its duration.
    pub fn in_flight(&'static self, stage: &'static str) -> InFlight {
        self.in_flight.get_or_create(&StageLabel { stage: stage.to_owned() }).inc();
        InFlight { stage, started: std::time::Instant::now() }
    }

    /// Lets the models of `settings` (its conversation contexts and price table) be label values,
    /// in addition to any allowed before.
    pub fn allow_configured_models(&self, settings: &Settings) {
        let contexts = settings.conversation_contexts.values().map(|c| c.model.clone());
        let priced = settings.telemetry.prices.iter().map(|p| p.model.clone());
        if let Ok(mut known) = self.known_models.write() {
            known.extend(contexts.chain(priced));
        }
    }

    /// `model` if it is configured, else [`OTHER_MODEL`].
    fn model_label(&self, model: &str) -> String {
        let known = self.known_models.read().is_ok_and(|k| k.contains(model));
        if known { model } else { OTHER_MODEL }.to_owned()
    }

    /// Counts one HTTP answer of the provider (a 429 among them, though a retry follows).
    pub fn llm_http_response(&self, status: u16) {
        self.llm_http.get_or_create(&StatusLabel { status }).inc();
    }

    /// Counts an LLM call that took `took` (none: never made) and its tokens and cost; an
    /// unconfigured model counts as `other`.
    pub fn llm_call(
        &self,
        model: &str,
        outcome: &str,
        took: Option<std::time::Duration>,
        usage: Option<&Usage>,
        prices: &[ModelPrice],
    ) {
        let label = self.model_label(model);
        let model = label.as_str();
        let key = ModelLabel { model: model.to_owned(), outcome: outcome.to_owned() };
        if let Some(took) = took {
            self.llm_duration.get_or_create(&key).observe(took.as_secs_f64());
        }
        self.llm_calls.get_or_create(&key).inc();
        let Some(u) = usage else { return };
        let uncached = u.input_tokens.saturating_sub(u.cached_input_tokens);
        for (kind, n) in [
            ("input", uncached),
            ("cached_input", u.cached_input_tokens),
            ("output", u.output_tokens.saturating_sub(u.reasoning_tokens)),
            ("reasoning", u.reasoning_tokens),
        ] {
            self.tokens
                .get_or_create(&TokenLabel { model: model.to_owned(), kind: kind.to_owned() })
                .inc_by(n);
        }
        if let Some(p) = prices.iter().find(|p| p.model == model) {
            let micro_usd = p.cost_usd(u) * 1e6;
            self.cost_micro_usd
                .get_or_create(&CostLabel { model: model.to_owned() })
                .inc_by(micro_usd.round() as u64);
        }
    }

    /// A consumer connected (+1) or lost its connection (-1). A connection that consumes
    /// clears any broker problem noted before.
    pub fn broker_connection(&self, delta: i64) {
        self.broker_connections.fetch_add(delta, Ordering::Relaxed);
        if delta > 0 {
            self.broker_problem(None);
        }
    }

    /// Notes (or clears) why the broker cannot serve this process although it answers (a
    /// plugin it lacks), for `/readyz`.
    pub fn broker_problem(&self, problem: Option<String>) {
        if let Ok(mut note) = self.broker_problem.write() {
            *note = problem;
        }
    }

    fn broker_problem_now(&self) -> Option<String> {
        self.broker_problem.read().ok().and_then(|p| p.clone())
    }

    fn set_up(&self, dependency: &'static str, up: bool) {
        self.dependency_up.get_or_create(&DependencyLabel { dependency }).set(i64::from(up));
    }

    /// The registry in the Prometheus text format (0.0.4), which `/metrics` serves.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        prometheus_text(&out)
    }
}

/// The OpenMetrics text `prometheus_client` writes, as the Prometheus text format: a counter's
/// HELP and TYPE name its samples (`x_total`), not its OpenMetrics family (`x`), and there is no
/// `# EOF`. Served as `text/plain`, the OpenMetrics form left every counter without help text for
/// Prometheus's own checker (`promtool check metrics`).
fn prometheus_text(openmetrics: &str) -> String {
    let counters: HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + counters.len() * 12);
    for line in openmetrics.lines().filter(|l| *l != "# EOF") {
        let meta =
            ["# HELP ", "# TYPE "].into_iter().find_map(|p| Some((p, line.strip_prefix(p)?)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(prefix);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                out.push(' ');
                out.push_str(tail);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Ends an in-flight span of a stage.
#[derive(Debug)]
pub struct InFlight {
    stage: &'static str,
    started: std::time::Instant,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let m = metrics();
        let label = StageLabel { stage: self.stage.to_owned() };
        m.in_flight.get_or_create(&label).dec();
        m.duration.get_or_create(&label).observe(self.started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod text_tests {
    use super::prometheus_text;

    #[test]
    fn counters_are_described_by_their_sample_names() {
        let om =
            "# HELP a_messages Messages.\n# TYPE a_messages counter\na_messages_total{x=\"1\"} 2\n\
                  # HELP a_up Up.\n# TYPE a_up gauge\na_up 1\n# EOF\n";
        let text = prometheus_text(om);
        assert_eq!(
            text,
            "# HELP a_messages_total Messages.\n# TYPE a_messages_total counter\n\
             a_messages_total{x=\"1\"} 2\n# HELP a_up Up.\n# TYPE a_up gauge\na_up 1\n"
        );
    }
}
