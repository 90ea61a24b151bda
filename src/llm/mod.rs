//! The invoke stage's view of the LLM: one `POST /responses` call to an OpenAI-compatible
//! Responses endpoint, with retries, timeouts and streaming, mapped to the AGN-033 outcome.
//!
//! The stage depends on the object-safe [`LlmClient`] trait; [`HttpLlmClient`] is the real
//! implementation (reqwest), and tests may substitute their own. A call takes the `/responses`
//! body built by the assemble stage, the [`Endpoint`] (an AgentContext may override the base URL
//! and key per tenant) and an optional sink for [`StreamDelta`]s; it returns an [`LlmResponse`]
//! (provider id, the raw provider JSON, the mapped [`Outcome`], usage) or an [`LlmError`]
//! classified by what the pipeline should do next.
//!
//! Streaming is chosen by the body itself (`"stream": true`), so the stored request payload is
//! exactly what was sent.

mod body;
mod delta;
mod error;
mod genai;
mod http;
mod map;
mod nodes;
mod retry;
mod sse;
mod stream;

use std::fmt;

use futures_util::future::BoxFuture;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::config::{redact_url, AgentContext, LlmSettings, Secret};
use crate::contracts::{Outcome, Usage};

pub use body::{BodyHead, RequestBody};
pub use delta::{DeltaEvent, StreamDelta};
pub use error::{
    account_problem, LlmError, ProviderError, TimeoutPhase, ACCOUNT_UNUSABLE, CREDENTIALS_REFUSED,
};
pub use http::HttpLlmClient;
pub use map::{map_response, map_usage, INCOMPLETE_WARNING_CODE};

/// Where a call goes: a Responses-compatible base URL (up to and including `/v1`) and its key.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Base URL, e.g. `https://api.openai.com/v1`; a query string (Azure's `api-version`) is kept.
    pub base_url: String,
    /// Bearer key; `None` for endpoints that need none (local servers).
    pub api_key: Option<Secret>,
}

impl Endpoint {
    /// An endpoint from its parts.
    pub fn new(base_url: impl Into<String>, api_key: Option<Secret>) -> Self {
        Endpoint { base_url: base_url.into(), api_key }
    }

    /// The endpoint serving a request: the AgentContext's overrides, else `[llm]`. A context
    /// with its own base URL gets only its own key (none if it has none): another endpoint
    /// never receives the global key. A key file is read here, at each call, so a replaced file
    /// takes effect at once; an unreadable one is an error naming the path, never the key.
    pub fn resolve(
        settings: &LlmSettings,
        agent: Option<&AgentContext>,
    ) -> Result<Self, KeyFileError> {
        let own_url = agent.and_then(|a| a.llm_base_url.as_ref());
        let base_url = own_url.unwrap_or(&settings.base_url).expose().to_owned();
        let own_key = match agent.and_then(|a| a.llm_api_key_file.as_ref()) {
            Some(path) => Some(read_key(path)?),
            None => agent.and_then(|a| a.llm_api_key.clone()),
        };
        let api_key = match own_url {
            Some(_) => own_key,
            None => own_key.or_else(|| settings.api_key.clone()),
        };
        Ok(Endpoint { base_url, api_key })
    }

    /// The URL of `path` under the base URL, keeping the base URL's query string.
    pub fn url(&self, path: &str) -> String {
        let (base, query) = match self.base_url.split_once('?') {
            Some((base, query)) => (base, Some(query)),
            None => (self.base_url.as_str(), None),
        };
        let mut url = format!("{}/{}", base.trim_end_matches('/'), path.trim_start_matches('/'));
        if let Some(query) = query {
            url.push('?');
            url.push_str(query);
        }
        url
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key prints as `Secret(***)`; a key in the URL's query string (`?api-key=`) is hidden.
        f.debug_struct("Endpoint")
            .field("base_url", &redact_url(&self.base_url))
            .field("api_key", &self.api_key)
            .finish()
    }
}

/// One `POST /responses` call.
#[derive(Debug, Clone, Copy)]
pub struct LlmRequest<'a> {
    /// Where to send it.
    pub endpoint: &'a Endpoint,
    /// The `/responses` body as built by the assemble stage; `"stream": true` selects SSE.
    pub body: &'a RequestBody,
    /// Receives stream deltas in order (streaming calls only). A closed receiver is ignored:
    /// the call still completes.
    pub deltas: Option<&'a mpsc::Sender<StreamDelta>>,
    /// A call reserved against a money budget: an attempt the provider may have run and billed
    /// (a timeout, a connection lost) is not retried here, since one reservation covers one
    /// billed attempt; the stage's own retry reserves again.
    pub once: bool,
}

/// How the provider ended the response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseStatus {
    /// `completed`.
    Completed,
    /// `incomplete`, with the provider's reason (e.g. `max_output_tokens`, `content_filter`).
    Incomplete {
        /// `incomplete_details.reason`, or `unknown`.
        reason: String,
    },
}

/// A successful call.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmResponse {
    /// The provider's response id (`resp_…`), the next call's `previous_response_id`.
    pub response_id: String,
    /// `completed` or `incomplete`.
    pub status: ResponseStatus,
    /// The AGN-033 outcome: a final answer (usage and warnings included) or ordered tool calls.
    pub outcome: Outcome,
    /// Token usage, also for tool continuations (whose AGN-033 form has no usage bucket).
    pub usage: Option<Usage>,
    /// The full provider response object, to be stored unchanged.
    pub raw: Value,
    /// Attempts made, 1 when the first succeeded.
    pub attempts: u32,
    /// The provider's `x-request-id`, for support requests.
    pub request_id: Option<String>,
}

/// The LLM as the invoke stage sees it. Object-safe: hold it as `Arc<dyn LlmClient>`.
pub trait LlmClient: Send + Sync + fmt::Debug {
    /// Sends one `/responses` call, retrying what may be retried.
    fn create_response<'a>(
        &'a self,
        request: LlmRequest<'a>,
    ) -> BoxFuture<'a, Result<LlmResponse, LlmError>>;
}

/// A key from a mounted secret file: its content without the trailing newline.
fn read_key(path: &std::path::Path) -> Result<Secret, KeyFileError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| KeyFileError::Unreadable { path: path.to_owned(), source })?;
    let key = text.trim_end_matches(['\n', '\r']);
    if key.is_empty() {
        return Err(KeyFileError::Empty { path: path.to_owned() });
    }
    Ok(Secret::new(key))
}

/// An AgentContext's LLM key file that cannot be used (the error names the path, never a key).
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// It cannot be read.
    #[error("the LLM key file {} is unreadable: {source}", path.display())]
    Unreadable {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It holds no key.
    #[error("the LLM key file {} is empty", path.display())]
    Empty {
        /// The file.
        path: std::path::PathBuf,
    },
}
