//! The OpenTelemetry GenAI semantic conventions on the span of one LLM call: what was asked
//! (operation, provider, model, limits, server) when it starts; what came back (response id and
//! model, finish reason, tokens by kind) or the error's type when it ends. Attributes that only
//! export reads are set only when export is on.

use opentelemetry::trace::Status;
use opentelemetry::{Array, StringValue, Value as OtelValue};
use serde_json::Value;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::{BodyHead, Endpoint, LlmError, LlmResponse, ResponseStatus};
use crate::contracts::Outcome;

/// The client span of a `/responses` call for `body`, not yet entered.
pub(super) fn span(body: &BodyHead, endpoint: &Endpoint) -> tracing::Span {
    let model = body.model.as_deref().unwrap_or("");
    if !crate::otel::enabled() {
        return tracing::info_span!("llm", model);
    }
    let span = tracing::info_span!(
        "llm",
        otel.name = %format_args!("chat {model}"),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.request.model = model,
    );
    span.set_attribute("gen_ai.provider.name", "openai");
    if let Some(n) = body.max_output_tokens {
        span.set_attribute("gen_ai.request.max_tokens", n);
    }
    for (x, key) in
        [(body.temperature, "gen_ai.request.temperature"), (body.top_p, "gen_ai.request.top_p")]
    {
        if let Some(x) = x {
            span.set_attribute(key, x);
        }
    }
    if let Ok(url) = reqwest::Url::parse(&endpoint.base_url) {
        if let Some(host) = url.host_str() {
            span.set_attribute("server.address", host.to_owned());
        }
        if let Some(port) = url.port_or_known_default() {
            span.set_attribute("server.port", i64::from(port));
        }
    }
    span
}

/// Ends the call's span with what the provider answered, or with the error.
pub(super) fn record(span: &tracing::Span, result: &Result<LlmResponse, LlmError>) {
    if !crate::otel::enabled() {
        return;
    }
    let r = match result {
        Ok(r) => r,
        Err(e) => {
            span.set_attribute("error.type", e.code().as_str());
            span.set_status(Status::error(e.to_string()));
            return;
        }
    };
    span.set_attribute("gen_ai.response.id", r.response_id.clone());
    if let Some(model) = r.raw.get("model").and_then(Value::as_str) {
        span.set_attribute("gen_ai.response.model", model.to_owned());
    }
    let reasons = vec![StringValue::from(finish_reason(r))];
    span.set_attribute("gen_ai.response.finish_reasons", OtelValue::Array(Array::String(reasons)));
    if let Some(u) = &r.usage {
        let tokens = [
            ("gen_ai.usage.input_tokens", u.input_tokens),
            ("gen_ai.usage.output_tokens", u.output_tokens),
            ("gen_ai.usage.cache_read.input_tokens", u.cached_input_tokens),
            ("aptix.llm.reasoning_tokens", u.reasoning_tokens),
        ];
        for (key, n) in tokens {
            span.set_attribute(key, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
    span.set_attribute("aptix.llm.attempts", i64::from(r.attempts));
    if let Some(id) = &r.request_id {
        span.set_attribute("aptix.llm.request_id", id.clone());
    }
    span.set_status(Status::Ok);
}

/// The convention's finish reason: `stop`, `tool_calls`, or the provider's incomplete reason.
fn finish_reason(r: &LlmResponse) -> String {
    match (&r.status, &r.outcome) {
        (ResponseStatus::Incomplete { reason }, _) => reason.clone(),
        (_, Outcome::ClientToolContinuation(_) | Outcome::ToolApprovalRequired(_)) => {
            "tool_calls".to_owned()
        }
        (_, Outcome::Final(_)) => "stop".to_owned(),
    }
}
