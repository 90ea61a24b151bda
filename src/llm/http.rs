//! [`HttpLlmClient`]: the reqwest implementation of [`LlmClient`].
//!
//! One attempt: POST the body, check the HTTP status before reading anything else, then read a
//! JSON body or an SSE stream within the request deadline. Attempts repeat under the
//! retry policy. The API key goes only into the `Authorization` header (marked sensitive), and
//! neither it nor the body is ever logged.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use backon::Retryable as _;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::delta::StreamDelta;
use super::error::{account_problem, LlmError, ProviderError, TimeoutPhase};
use super::retry::{
    classify_status, classify_transport, error_chain, transport_error, AttemptError, RetryCause,
    RetryPolicy,
};
use super::sse::MAX_EVENT_BYTES;
use super::{map_response, stream, Endpoint, LlmClient, LlmRequest, LlmResponse};
use crate::config::{redact_url, LlmSettings};

/// The largest error body read; error bodies are small, and a runaway one must not stall us.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Calls a Responses-compatible endpoint over HTTP(S). Cheap to share: hold one per process.
#[derive(Debug, Clone)]
pub struct HttpLlmClient {
    http: reqwest::Client,
    policy: RetryPolicy,
    request_timeout: Duration,
    /// Longest one call may take, every attempt and wait included.
    call_budget: Duration,
    idle_timeout: Duration,
}

impl HttpLlmClient {
    /// Builds the client with the timeouts and retry policy of `[llm]`.
    pub fn new(settings: &LlmSettings) -> Result<Self, LlmError> {
        let http = crate::http::client()
            .connect_timeout(Duration::from_millis(settings.connect_timeout_ms))
            .user_agent(concat!("aptix/", env!("CARGO_PKG_VERSION")))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| LlmError::Config(error_chain(&e)))?;
        Ok(HttpLlmClient {
            http,
            policy: RetryPolicy::from_settings(settings),
            request_timeout: Duration::from_millis(settings.request_timeout_ms),
            call_budget: Duration::from_millis(settings.call_budget_ms),
            idle_timeout: Duration::from_millis(settings.stream_idle_timeout_ms),
        })
    }

    /// Sends one call with retries, inside a GenAI client span; see
    /// [`LlmClient::create_response`].
    pub async fn create(&self, request: LlmRequest<'_>) -> Result<LlmResponse, LlmError> {
        // One scan of the body for the fields the span and the transport need.
        let head = request.body.head();
        let span = super::genai::span(&head, request.endpoint);
        let streaming = head.stream == Some(true);
        let call = self.call(request, streaming);
        let result = tracing::Instrument::instrument(call, span.clone()).await;
        super::genai::record(&span, &result);
        result
    }

    async fn call(
        &self,
        request: LlmRequest<'_>,
        streaming: bool,
    ) -> Result<LlmResponse, LlmError> {
        if !request.body.is_object() {
            return Err(LlmError::Config("the /responses body must be a JSON object".into()));
        }
        let body = Bytes::copy_from_slice(request.body.as_str().as_bytes());
        let url = request.endpoint.url("responses");
        let attempts = AtomicU32::new(0);
        let once = request.once;
        // No attempt runs past the call's budget, and none starts after it.
        let budget_end = Instant::now() + self.call_budget;
        let result = (|| {
            attempts.fetch_add(1, Ordering::Relaxed);
            let deadline = budget_end.min(Instant::now() + self.request_timeout);
            self.attempt(&url, request.endpoint, body.clone(), streaming, request.deltas, deadline)
        })
        .retry(self.policy.backoff())
        .when(|e| {
            e.is_retryable() && !(once && e.may_have_been_billed()) && Instant::now() < budget_end
        })
        .adjust(|e, backoff| self.policy.adjust(e, backoff))
        .notify(|e, wait| {
            let attempt = attempts.load(Ordering::Relaxed);
            tracing::warn!(attempt, wait_ms = wait.as_millis() as u64, error = ?e, "llm attempt failed, retrying");
        })
        .await;
        let attempts = attempts.load(Ordering::Relaxed);
        match result {
            Ok((raw, request_id)) => {
                let mut response = map_response(raw).inspect_err(|e| {
                    log_provider_error(e.provider_error(), false, attempts, request.endpoint)
                })?;
                response.attempts = attempts;
                response.request_id = request_id;
                tracing::debug!(response_id = %response.response_id, attempts, "llm call completed");
                Ok(response)
            }
            Err(e) => {
                // A retryable status's text is left out of the final error; log it here.
                let stripped = !matches!(e, AttemptError::Fatal(_));
                log_provider_error(e.provider_error(), stripped, attempts, request.endpoint);
                Err(e.into_final(attempts))
            }
        }
    }

    /// One attempt: the provider response object and its `x-request-id`.
    async fn attempt(
        &self,
        url: &str,
        endpoint: &Endpoint,
        body: Bytes,
        streaming: bool,
        deltas: Option<&mpsc::Sender<StreamDelta>>,
        deadline: Instant,
    ) -> Result<(Value, Option<String>), AttemptError> {
        let accept = if streaming { "text/event-stream" } else { "application/json" };
        // The answer may repeat it: what it holds bounds what the answer may (`nodes`).
        let request = body.clone();
        let mut builder = self
            .http
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, accept)
            .body(body);
        if let Some(key) = &endpoint.api_key {
            builder = builder.bearer_auth(key.expose());
        }
        let resp = match tokio::time::timeout_at(deadline, builder.send()).await {
            Err(_) => {
                return Err(AttemptError::retryable(RetryCause::Timeout(TimeoutPhase::Request)))
            }
            Ok(Err(e)) => return Err(classify_transport(&e)),
            Ok(Ok(resp)) => resp,
        };
        let request_id =
            resp.headers().get("x-request-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let status = resp.status();
        crate::metrics::metrics().llm_http_response(status.as_u16());
        if !status.is_success() {
            let headers = resp.headers().clone();
            let body = read_error_body(resp, deadline).await;
            return Err(classify_status(status, &headers, &body));
        }
        let is_sse = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        // A server that ignores `stream: true` and answers JSON is read as JSON.
        let raw = if is_sse {
            let bound = super::nodes::Bound::new(&request);
            stream::read(resp, (deadline, self.idle_timeout), &bound, deltas).await?
        } else {
            let bytes = read_answer(resp, deadline).await?;
            super::nodes::within(&bytes, &super::nodes::Bound::new(&request))?;
            serde_json::from_slice(&bytes).map_err(|e| {
                AttemptError::Fatal(LlmError::InvalidResponse(format!(
                    "the response body is not JSON: {e}"
                )))
            })?
        };
        Ok((raw, request_id))
    }
}

/// Logs the provider's own words about a failed call where clients get less: at ERROR when the
/// account needs an operator (refused key, no quota), at WARN when `stripped` (retries ran out
/// and the client sees only the status and code). The configured key is blotted out in case a
/// provider echoes it.
fn log_provider_error(
    provider: Option<(Option<u16>, &ProviderError)>,
    stripped: bool,
    attempts: u32,
    endpoint: &Endpoint,
) {
    let Some((status, error)) = provider else { return };
    let mut detail = error.to_string();
    if let Some(key) = endpoint.api_key.as_ref().map(|k| k.expose()).filter(|k| !k.is_empty()) {
        detail = detail.replace(key, "***");
    }
    let endpoint = redact_url(&endpoint.base_url);
    if account_problem(status, error).is_some() {
        tracing::error!(
            status,
            attempts,
            %endpoint,
            provider_error = %detail,
            "llm provider refused the configured account; check its api key, quota and billing"
        );
    } else if stripped {
        tracing::warn!(status, attempts, %endpoint, provider_error = %detail, "llm call failed after retries");
    }
}

/// Reads a JSON answer, at most [`MAX_EVENT_BYTES`]: a larger one could not be handed on (the
/// broker's limit), and a runaway one must not fill the worker that holds every tenant's calls.
async fn read_answer(
    mut resp: reqwest::Response,
    deadline: Instant,
) -> Result<Vec<u8>, AttemptError> {
    let mut body = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, resp.chunk()).await {
            Err(_) => {
                return Err(AttemptError::retryable(RetryCause::Timeout(TimeoutPhase::Request)))
            }
            Ok(Err(e)) => {
                return Err(AttemptError::retryable(RetryCause::Transport(transport_error(&e))))
            }
            Ok(Ok(None)) => return Ok(body),
            Ok(Ok(Some(chunk))) if body.len() + chunk.len() > MAX_EVENT_BYTES => {
                return Err(AttemptError::Fatal(LlmError::InvalidResponse(format!(
                    "the answer is larger than {} MiB",
                    MAX_EVENT_BYTES >> 20
                ))))
            }
            Ok(Ok(Some(chunk))) => body.extend_from_slice(&chunk),
        }
    }
}

/// Reads at most [`MAX_ERROR_BODY`] bytes of an error answer; a body that cannot be read is
/// treated as empty, since the status alone classifies it.
async fn read_error_body(mut resp: reqwest::Response, deadline: Instant) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY {
        match tokio::time::timeout_at(deadline, resp.chunk()).await {
            Ok(Ok(Some(chunk))) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body
}

impl LlmClient for HttpLlmClient {
    fn create_response<'a>(
        &'a self,
        request: LlmRequest<'a>,
    ) -> BoxFuture<'a, Result<LlmResponse, LlmError>> {
        Box::pin(self.create(request))
    }
}
