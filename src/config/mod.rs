//! Typed, layered configuration: built-in defaults (`aptix.example.toml`, which documents every
//! key), then a file (`--config PATH` or `APTIX_CONFIG`), then `APTIX__SECTION__KEY` environment
//! variables. Validated once at start-up; secrets are redacted whenever printed.

mod approvals;
mod assemble_policy;
mod budget;
mod check;
mod contexts;
mod keys;
mod limits;
mod mcp;
mod numbers;
mod secret;
mod server_tools;
mod tenants;
mod version;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use approvals::{ApprovalRule, Pattern};
pub use assemble_policy::{AssemblePolicy, PromptCacheKey};
pub use budget::{Budget, Usd};
pub use check::{is_collection_name, COLLECTION_RULE};
pub use contexts::{AgentContext, ConversationContext, FollowUp, FunctionTool};
pub use keys::{file_signature, file_signature_valid, file_url, MessageKeys, MIN_KEY_BYTES};
pub use limits::Limits;
pub use mcp::McpServer;
pub use secret::{percent_decode, redact_url, ConnectionUrl, Secret};
pub use server_tools::{FileSettings, ServerTool, ServerTools};
pub use tenants::{OverLimit, Publisher, Tenant, TenantLimits};
pub use version::{content_version, ContextVersions};

use crate::contracts::ContextId;

/// Bytes of stored session state a round trip carries from assemble to persist at most
/// (`assemble::StoredState`); the stage-message budget checked at start counts them.
pub const MAX_CARRIED_STATE_BYTES: usize = 64 << 10;

/// The built-in defaults: the commented example file shipped at the repository root.
pub const DEFAULTS_TOML: &str = include_str!("../../aptix.example.toml");

/// Why the configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A source could not be read or parsed, or a key has the wrong type.
    #[error("configuration could not be loaded: {0}")]
    Load(#[from] config::ConfigError),
    /// A key has a value that is not allowed.
    #[error("configuration key `{key}` is invalid: {message}")]
    Invalid {
        /// Dotted key, e.g. `conversation_contexts.ddr.tool_choice`.
        key: String,
        /// What is wrong with it.
        message: String,
    },
}

impl ConfigError {
    fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid { key: key.into(), message: message.into() }
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// RabbitMQ connection and topology.
    pub amqp: AmqpSettings,
    /// PostgreSQL connection.
    pub database: DatabaseSettings,
    /// The OpenAI-compatible Responses endpoint.
    pub llm: LlmSettings,
    /// Where indexed chunks live.
    pub vector: VectorSettings,
    /// Request size and count limits.
    pub limits: Limits,
    /// Logging.
    pub telemetry: TelemetrySettings,
    /// Stage workers: prefetch, retries, reply queues.
    pub pipeline: PipelineSettings,
    /// The ConversationContext used when a request names none.
    pub default_conversation_context: String,
    /// Reasoning profiles by id.
    pub conversation_contexts: BTreeMap<String, ConversationContext>,
    /// The AgentContext used when a request names none.
    pub default_agent_context: String,
    /// Backend selections by id.
    pub agent_contexts: BTreeMap<String, AgentContext>,
    /// Request assembly: active-file limit, provider retention, rehydration budgets.
    #[serde(default)]
    pub assemble: AssemblePolicy,
    /// Tenants by name (docs/tenancy.md); none: single-tenant.
    #[serde(default)]
    pub tenants: BTreeMap<String, Tenant>,
    /// Limits of every tenant that does not set its own.
    #[serde(default)]
    pub tenant_limits: TenantLimits,
    /// Files produced by server tools.
    #[serde(default)]
    pub files: FileSettings,
    /// The web console (`aptix console`).
    #[serde(default)]
    pub console: ConsoleSettings,
}

/// The web console's settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleSettings {
    /// Where it listens (loopback by default).
    pub listen: String,
    /// Signs in as `admin` (HTTP Basic): every page, and replay and discard (typed again into
    /// each action's form).
    pub admin_token: Option<Secret>,
    /// Signs in as `viewer`: every page, no action.
    pub viewer_token: Option<Secret>,
    /// Signs in as the tenant named by the key: only that tenant's sessions and turns.
    pub tenant_tokens: BTreeMap<String, Secret>,
    /// A header a trusted reverse proxy sets on every request, naming the signed-in scope: `*`
    /// (every page, no action) or `tenant:<name>`. Empty: not used. Only safe when the console
    /// is reachable through that proxy alone.
    pub trusted_scope_header: String,
}

impl Default for ConsoleSettings {
    fn default() -> Self {
        ConsoleSettings {
            listen: "127.0.0.1:8090".to_owned(),
            admin_token: None,
            viewer_token: None,
            tenant_tokens: BTreeMap::new(),
            trusted_scope_header: String::new(),
        }
    }
}

/// RabbitMQ settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpSettings {
    /// Broker URL, or the URLs of a cluster's nodes separated by commas: connections go to
    /// one of them and move on to the next when it fails.
    pub url: ConnectionUrl,
    /// Prefix of every queue and exchange name, so deployments and tests never collide.
    pub prefix: String,
    /// The broker's `max_message_size`, bytes: a message over it is never sent (the broker
    /// would close the channel) and its turn fails instead.
    pub max_message_bytes: usize,
    /// Ingress partitions, a power of two: 1 is one ordered queue (no plugin needed); more
    /// spread sessions over that many queues by consistent hash of the SessionId.
    pub ingress_partitions: u16,
    /// Partitions of each stage queue after the ingress, a power of two: 1 is one queue per
    /// stage; more spread each stage's messages at random over that many queues (a
    /// consistent-hash exchange, random keys), every one consumed by every worker of the stage.
    pub stage_partitions: u16,
    /// Earlier values of `stage_partitions` whose queues every worker also declares and
    /// consumes while the setting changes, so that what workers of the old value left there is
    /// drained (docs/deploy.md, "Partitioned stage queues"); empty otherwise.
    #[serde(default, deserialize_with = "numbers::one_or_many")]
    pub draining_stage_partitions: Vec<u16>,
    /// The kind of every queue except session reply queues.
    pub queue_type: QueueType,
    /// RabbitMQ's management API (`http://user:password@host:15672`), read by `aptix status`
    /// and the console for rates and the workers consuming each queue; empty: not used.
    #[serde(default)]
    pub management_url: ConnectionUrl,
}

/// Which RabbitMQ queue type carries the pipeline's own queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueType {
    /// Durable classic queues: one node, no replication.
    #[default]
    Classic,
    /// Quorum queues: replicated (Raft) over a cluster's nodes.
    Quorum,
}

/// PostgreSQL settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// Connection URL.
    pub url: ConnectionUrl,
    /// Pool size per process.
    pub max_connections: u32,
}

/// LLM endpoint settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmSettings {
    /// Base URL up to and including `/v1`.
    pub base_url: ConnectionUrl,
    /// API key; when unset, `OPENAI_API_KEY` is used.
    #[serde(default)]
    pub api_key: Option<Secret>,
    /// Longest wait for a TCP (and TLS) connection, milliseconds.
    pub connect_timeout_ms: u64,
    /// Longest one attempt may take, from sending to the last byte (streams included), milliseconds.
    pub request_timeout_ms: u64,
    /// Longest silence between two chunks of a streamed response, milliseconds.
    pub stream_idle_timeout_ms: u64,
    /// Retries after the first attempt for connection errors, timeouts, 408, 409, 429 and 5xx.
    pub max_retries: u32,
    /// First backoff delay, milliseconds; it doubles per retry, with jitter.
    pub retry_initial_delay_ms: u64,
    /// Cap on one backoff delay, milliseconds.
    pub retry_max_delay_ms: u64,
    /// Longest server-requested `Retry-After` honoured, milliseconds; a longer one ends the retries.
    pub retry_after_max_ms: u64,
    /// Longest one call may take, every attempt and wait included, milliseconds: under
    /// RabbitMQ's `consumer_timeout` (30 min by default), past which the broker takes back every
    /// delivery the invoke worker holds.
    #[serde(default = "default_call_budget_ms")]
    pub call_budget_ms: u64,
}

fn default_call_budget_ms() -> u64 {
    20 * 60 * 1000
}

/// Vector store settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectorSettings {
    /// Qdrant server gRPC URL; when unset, the embedded on-disk store is used.
    #[serde(default)]
    pub url: Option<ConnectionUrl>,
    /// Qdrant API key.
    #[serde(default)]
    pub api_key: Option<Secret>,
    /// Directory of the embedded store.
    pub data_dir: PathBuf,
    /// Server backend: per-request timeout, seconds.
    #[serde(default = "default_vector_timeout")]
    pub timeout_secs: u64,
    /// Server backend: connect timeout, seconds.
    #[serde(default = "default_vector_connect_timeout")]
    pub connect_timeout_secs: u64,
    /// OpenAI-compatible embeddings base URL (up to `/v1`); when set, chunks also get dense
    /// vectors and retrieval fuses BM25 and dense results.
    #[serde(default)]
    pub embeddings_url: Option<ConnectionUrl>,
    /// API key for the embeddings endpoint; when unset, `llm.api_key` is used.
    #[serde(default)]
    pub embeddings_api_key: Option<Secret>,
    /// Embedding model id.
    #[serde(default = "default_embeddings_model")]
    pub embeddings_model: String,
    /// Dimension of the embedding vectors (sent as `dimensions`).
    #[serde(default = "default_embeddings_dimension")]
    pub embeddings_dimension: usize,
}

fn default_vector_timeout() -> u64 {
    10
}

fn default_vector_connect_timeout() -> u64 {
    5
}

fn default_embeddings_model() -> String {
    "text-embedding-3-small".to_owned()
}

fn default_embeddings_dimension() -> usize {
    1536
}

/// Stage worker settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSettings {
    /// Unacked messages per stage consumer, which is also how many it handles at once.
    pub prefetch: StagePrefetch,
    /// Attempts (first included) before a transient failure fails the turn; at least 1.
    pub max_attempts: StageAttempts,
    /// Redeliveries after consumer crashes before a message is treated as poison.
    pub max_redeliveries: u32,
    /// Longest wait for a publisher confirm, milliseconds.
    pub confirm_timeout_ms: u64,
    /// Apply database migrations when a worker starts.
    pub migrate_on_start: bool,
    /// Tokio worker threads of a pipeline process; 0 picks half the cores, at least one
    /// ([`crate::worker::worker_threads`]).
    pub worker_threads: usize,
    /// The key that signs stage messages (HMAC-SHA256; at least 16 bytes). Unset, with no
    /// `message_key_file` either: the key the migrations keep in PostgreSQL
    /// (`pipeline_secret`), shared by every worker of the database.
    #[serde(default)]
    pub message_key: Option<Secret>,
    /// The key before a rotation: stage messages it signed still verify.
    #[serde(default)]
    pub message_key_previous: Option<Secret>,
    /// A file holding the keys instead, one a line, the signing key first (a mounted secret).
    #[serde(default)]
    pub message_key_file: Option<std::path::PathBuf>,
    /// Stream deltas of each step kept in PostgreSQL for `turn.resume` (client protocol §9a);
    /// later ones are published but not kept; 0 keeps none. At most 999,998.
    pub stream_events_per_step: u32,
    /// `turn.resume`s a session may make per minute (client protocol §9a); more are refused
    /// with `limit.resumes_per_minute`. 0: no limit.
    pub resumes_per_minute: u32,
}

impl Settings {
    /// The address that serves files: `files.listen`, else `telemetry.metrics_listen`.
    pub fn files_listen(&self) -> &str {
        match self.files.listen.as_str() {
            "" => &self.telemetry.metrics_listen,
            own => own,
        }
    }

    /// Where clients reach a worker's file listener, without a trailing `/`: `files.base_url`,
    /// else `http://` and [`Settings::files_listen`], a wildcard host (`0.0.0.0`, `[::]`) read
    /// as loopback (the workers warn at start that such a URL only serves this host).
    pub fn files_base_url(&self) -> String {
        if let Some(base) = &self.files.base_url {
            return base.trim_end_matches('/').to_owned();
        }
        let listen = self.files_listen();
        let (host, port) = listen.rsplit_once(':').unwrap_or((listen, "9464"));
        let host = if self.files_listen_is_wildcard() {
            if host.starts_with('[') {
                "[::1]"
            } else {
                "127.0.0.1"
            }
        } else {
            host
        };
        format!("http://{host}:{port}")
    }

    /// Whether the file URLs are derived from a listener bound to every address: the URL then
    /// names loopback, which only clients on the worker's own host can reach.
    pub fn files_listen_is_wildcard(&self) -> bool {
        let listen = self.files_listen();
        let host = listen.rsplit_once(':').map_or(listen, |(h, _)| h);
        self.files.base_url.is_none() && matches!(host, "0.0.0.0" | "[::]" | "" | "*")
    }
}

impl PipelineSettings {
    /// The configured keys as [`MessageKeys`] (`None`: none configured).
    pub fn keys(&self) -> Option<MessageKeys> {
        self.message_keys().ok().and_then(MessageKeys::new)
    }

    /// The configured stage-message keys, the signing one first (empty: none configured).
    pub fn message_keys(&self) -> Result<Vec<Vec<u8>>, ConfigError> {
        let mut keys: Vec<Vec<u8>> = Vec::new();
        if let Some(path) = &self.message_key_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                ConfigError::invalid(
                    "pipeline.message_key_file",
                    format!("{}: {e}", path.display()),
                )
            })?;
            let lines =
                text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'));
            keys.extend(lines.map(|l| l.as_bytes().to_vec()));
        }
        let named = [&self.message_key, &self.message_key_previous];
        keys.extend(named.into_iter().flatten().map(|k| k.expose().as_bytes().to_vec()));
        if keys.iter().any(|k| k.len() < 16) {
            return Err(ConfigError::invalid(
                "pipeline.message_key",
                "a stage-message key needs at least 16 bytes (32 random ones recommended)",
            ));
        }
        Ok(keys)
    }
}

/// A value per stage, keyed by stage name, with a `default` for stages not listed (a stage
/// added to the pipeline needs no entry). Names are checked against the pipeline when a worker
/// starts ([`PerStage::unknown`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PerStage<T>(pub std::collections::BTreeMap<String, T>);

impl<T: Copy + Default> PerStage<T> {
    /// The value for the stage called `stage`: its own, else `default`, else `T::default()`.
    pub fn get(&self, stage: &str) -> T {
        self.0.get(stage).or_else(|| self.0.get("default")).copied().unwrap_or_default()
    }

    /// Sets the value for `stage`.
    pub fn set(&mut self, stage: &str, value: T) {
        self.0.insert(stage.to_owned(), value);
    }

    /// Keys that name no stage in `stages` (and are not `default`).
    pub fn unknown<'a>(&'a self, stages: &'a [&str]) -> impl Iterator<Item = &'a str> + 'a {
        self.0.keys().map(String::as_str).filter(move |k| *k != "default" && !stages.contains(k))
    }
}

/// Prefetch per stage.
pub type StagePrefetch = PerStage<u16>;
/// Attempts per stage.
pub type StageAttempts = PerStage<u32>;

/// A model's price, for the cost estimate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    /// Model id as sent in `model`.
    pub model: String,
    /// USD per million uncached input tokens.
    pub input_usd_per_mtok: f64,
    /// USD per million cached input tokens.
    pub cached_input_usd_per_mtok: f64,
    /// USD per million output tokens (reasoning included).
    pub output_usd_per_mtok: f64,
}

impl ModelPrice {
    /// The estimated cost of `u` in USD.
    pub fn cost_usd(&self, u: &crate::contracts::Usage) -> f64 {
        let uncached = u.input_tokens.saturating_sub(u.cached_input_tokens);
        (uncached as f64 * self.input_usd_per_mtok
            + u.cached_input_tokens as f64 * self.cached_input_usd_per_mtok
            + u.output_tokens as f64 * self.output_usd_per_mtok)
            / 1e6
    }
}

/// Log output settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    /// `pretty` for people, `json` for log shippers.
    pub format: crate::telemetry::LogFormat,
    /// Address of `/metrics`, `/healthz` and `/readyz` for worker processes; empty disables.
    pub metrics_listen: String,
    /// OTLP/HTTP traces endpoint (`http://collector:4318/v1/traces`); empty disables export.
    #[serde(default)]
    pub otlp_endpoint: ConnectionUrl,
    /// Prices for the LLM cost estimate.
    #[serde(default)]
    pub prices: Vec<ModelPrice>,
}

impl Settings {
    /// Loads defaults, then `path` (or `APTIX_CONFIG`), then the environment, and validates.
    pub fn load(path: Option<&Path>) -> Result<Settings, ConfigError> {
        let env_path = std::env::var_os("APTIX_CONFIG").map(PathBuf::from);
        let file = path.map(Path::to_path_buf).or(env_path);
        let mut builder = config::Config::builder()
            .add_source(config::File::from_str(DEFAULTS_TOML, config::FileFormat::Toml));
        // The operator's own sources, without the defaults: what they name.
        let mut own = config::Config::builder();
        if let Some(file) = file {
            builder = builder.add_source(config::File::from(file.clone()).required(true));
            own = own.add_source(config::File::from(file).required(true));
        }
        let environment = || {
            // Values stay text: a number or a bool is read from it where a setting is one, and
            // a secret of digits keeps its leading zeros and every digit (parsed first, the
            // `config` crate would hand `0012…` back as `12…`). The one list an operator sets
            // from the environment during a rollout (APTIX__AMQP__DRAINING_STAGE_PARTITIONS=2,4)
            // splits its text itself (`numbers::one_or_many`).
            config::Environment::with_prefix("APTIX").separator("__").try_parsing(false)
        };
        let built = builder.add_source(environment()).build()?;
        let own = own.add_source(environment()).build()?;
        let mut settings: Settings = built.try_deserialize()?;
        settings.drop_unnamed_defaults(&own);
        if settings.llm.api_key.is_none() {
            settings.llm.api_key =
                std::env::var("OPENAI_API_KEY").ok().filter(|k| !k.is_empty()).map(Secret::new);
        }
        settings.validate()?;
        Ok(settings)
    }

    /// The ConversationContext for a request: the named one, or the default.
    pub fn conversation_context(&self, id: Option<&ContextId>) -> Option<&ConversationContext> {
        let key = id.map_or(self.default_conversation_context.as_str(), ContextId::as_str);
        self.conversation_contexts.get(key)
    }

    /// The AgentContext for a request: the named one, or the default.
    pub fn agent_context(&self, id: Option<&ContextId>) -> Option<&AgentContext> {
        let key = id.map_or(self.default_agent_context.as_str(), ContextId::as_str);
        self.agent_contexts.get(key)
    }
}
