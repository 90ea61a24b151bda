//! Why an LLM call failed, classified by what the pipeline should do next, and the provider's
//! `{"error":{message,type,param,code}}` body.
//!
//! An error's `Display` is what a client is told. When the provider's answer is about the
//! operator's account (a refused key, no quota) its text may name the account, the key's prefix
//! or the organisation, so clients get a fixed sentence instead and the provider's words go to
//! the operator's log (see [`account_problem`]).

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::contracts::ErrorCode;

/// Which timeout fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeoutPhase {
    /// The TCP/TLS connection was not established in time (`llm.connect_timeout_ms`).
    Connect,
    /// One attempt exceeded `llm.request_timeout_ms`, or reached the end of the call's budget
    /// (`llm.call_budget_ms`), whichever came first.
    Request,
    /// A stream stayed silent longer than `llm.stream_idle_timeout_ms`.
    StreamIdle,
}

impl fmt::Display for TimeoutPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TimeoutPhase::Connect => "connect",
            TimeoutPhase::Request => "request",
            TimeoutPhase::StreamIdle => "stream idle",
        })
    }
}

/// The provider's error object. Every field is optional because compatible servers differ.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderError {
    /// Human-readable message.
    #[serde(default)]
    pub message: String,
    /// `type`, e.g. `invalid_request_error`, `insufficient_quota`, `tokens`.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    /// The offending parameter, e.g. `input[0].content[0].type`.
    #[serde(default)]
    pub param: Option<String>,
    /// Machine code, e.g. `invalid_value`, `rate_limit_exceeded`, `previous_response_not_found`.
    #[serde(default)]
    pub code: Option<String>,
}

impl ProviderError {
    /// Reads an error body: `{"error":{…}}`, a flat `{code,message,param}` (stream `error`
    /// events), or anything else as the message.
    pub fn from_body(body: &[u8]) -> Self {
        match serde_json::from_slice::<Value>(body) {
            Ok(v) => Self::from_value(&v),
            Err(_) => ProviderError {
                message: String::from_utf8_lossy(body).chars().take(500).collect(),
                ..Default::default()
            },
        }
    }

    /// Reads an error object from parsed JSON (see [`ProviderError::from_body`]).
    pub fn from_value(v: &Value) -> Self {
        let inner = v.get("error").filter(|e| e.is_object()).unwrap_or(v);
        let text = |k: &str| inner.get(k).and_then(Value::as_str).map(str::to_owned);
        let code = inner.get("code").and_then(|c| match c {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        });
        ProviderError {
            message: text("message").unwrap_or_default(),
            kind: text("type"),
            param: text("param"),
            code,
        }
    }

    /// Whether `code` or `type` equals `value`.
    pub fn is(&self, value: &str) -> bool {
        self.code.as_deref() == Some(value) || self.kind.as_deref() == Some(value)
    }
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(code) = self.code.as_deref().or(self.kind.as_deref()) {
            write!(f, "{code}: ")?;
        }
        f.write_str(if self.message.is_empty() { "(no message)" } else { &self.message })?;
        if let Some(param) = &self.param {
            write!(f, " (param `{param}`)")?;
        }
        Ok(())
    }
}

/// What a client is told when the provider refused the configured credentials.
pub const CREDENTIALS_REFUSED: &str =
    "the LLM provider refused the request's credentials; an operator must check the configured API key";

/// What a client is told when the provider's account cannot serve requests.
pub const ACCOUNT_UNUSABLE: &str =
    "the LLM provider's account cannot serve requests (quota or billing); an operator must check it";

/// The fixed client sentence when a provider answer (with its HTTP status, if any) is about the
/// operator's account rather than the request: 401, 403, 402, or an account error code.
pub fn account_problem(status: Option<u16>, error: &ProviderError) -> Option<&'static str> {
    const CREDENTIALS: [&str; 8] = [
        "invalid_api_key",
        "invalid_organization",
        "invalid_project",
        "account_deactivated",
        "unauthorized",
        "authentication_error",
        "permission_denied",
        "permission_error",
    ];
    const ACCOUNT: [&str; 4] = [
        "insufficient_quota",
        "billing_hard_limit_reached",
        "billing_not_active",
        "access_terminated",
    ];
    if matches!(status, Some(401 | 403)) || CREDENTIALS.iter().any(|c| error.is(c)) {
        Some(CREDENTIALS_REFUSED)
    } else if status == Some(402) || ACCOUNT.iter().any(|c| error.is(c)) {
        Some(ACCOUNT_UNUSABLE)
    } else {
        None
    }
}

/// Most characters of the provider's own words a client is given (the log has them whole): an
/// error reply and its record must not carry what a provider chose to send at length.
const CLIENT_TEXT_CHARS: usize = 1_000;

/// The provider's error as a client may see it.
fn client_text(status: Option<u16>, error: &ProviderError) -> Cow<'static, str> {
    match account_problem(status, error) {
        Some(sentence) => Cow::Borrowed(sentence),
        None => {
            let text = error.to_string();
            match text.char_indices().nth(CLIENT_TEXT_CHARS) {
                Some((cut, _)) => Cow::Owned(format!("{}…", &text[..cut])),
                None => Cow::Owned(text),
            }
        }
    }
}

/// Why a call failed. [`LlmError::code`] gives the client-facing error code; `Display` is safe
/// to show a client (no account details), the fields keep the provider's own words.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// Retryable failures (connection errors, 408/409/429/5xx) lasted through every retry, or the
    /// server asked to wait longer than `llm.retry_after_max_ms`.
    #[error("llm endpoint unavailable after {attempts} attempt(s): {cause}")]
    Unavailable {
        /// Attempts made.
        attempts: u32,
        /// HTTP status of the last attempt, if it got one.
        status: Option<u16>,
        /// The last failure. For an HTTP answer: its status and the provider's error code, not
        /// its text, which may name the account (that text goes to the log).
        cause: String,
    },
    /// Timeouts lasted through every retry, or a stream went silent after delivering events.
    #[error("llm call timed out ({phase}) after {attempts} attempt(s)")]
    Timeout {
        /// Attempts made.
        attempts: u32,
        /// Which timeout fired last.
        phase: TimeoutPhase,
    },
    /// A stream broke after delivering events. The client does not resend it (its tokens were
    /// already forwarded); the stage may call again ([`LlmError::is_transient`]), and the step
    /// then streams again from `Seq` 0 (docs/client-protocol.md §9).
    #[error("llm stream interrupted after {events} event(s): {cause}")]
    StreamInterrupted {
        /// Events received before the break.
        events: u64,
        /// What broke it.
        cause: String,
    },
    /// The provider rejected the request with a non-retryable status (400, 401, 403, 404, 422,
    /// or 429 `insufficient_quota`).
    #[error("llm endpoint rejected the request (HTTP {status}): {}", client_text(Some(*status), error))]
    Rejected {
        /// HTTP status.
        status: u16,
        /// The provider's error body.
        error: Box<ProviderError>,
    },
    /// `previous_response_not_found`: the chain is gone; start a new one and rehydrate
    /// (DESIGN.md §5.6).
    #[error("previous response not found: {message}")]
    PreviousResponseNotFound {
        /// The provider's message (it names the id).
        message: String,
    },
    /// The model refused to answer.
    #[error("the model refused: {refusal}")]
    Refused {
        /// The provider's response id.
        response_id: String,
        /// The refusal text.
        refusal: String,
        /// The full provider response, for the turn record.
        raw: Box<Value>,
    },
    /// The provider reported the response as `failed`, or sent a stream `error` event.
    #[error("llm response failed: {}", client_text(None, error))]
    Failed {
        /// The provider's response id, when known.
        response_id: Option<String>,
        /// The provider's error (`code`, `message`).
        error: Box<ProviderError>,
        /// The full provider response, when there is one.
        raw: Option<Box<Value>>,
    },
    /// The answer could not be understood (bad JSON, unexpected status, no usable output).
    #[error("llm response could not be understood: {0}")]
    InvalidResponse(String),
    /// The client could not be built or the request could not be formed (a configuration error).
    #[error("llm client misconfigured: {0}")]
    Config(String),
}

impl LlmError {
    /// The client-facing error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            LlmError::Unavailable { .. } | LlmError::StreamInterrupted { .. } => {
                ErrorCode::LlmUnavailable
            }
            LlmError::Timeout { .. } => ErrorCode::LlmTimeout,
            // The pipeline rehydrates instead of failing; if it ever surfaces, it is a rejection.
            LlmError::Rejected { .. } | LlmError::PreviousResponseNotFound { .. } => {
                ErrorCode::LlmRejected
            }
            LlmError::Refused { .. } => ErrorCode::LlmRefused,
            LlmError::Failed { .. } => ErrorCode::LlmFailed,
            LlmError::InvalidResponse(_) => ErrorCode::LlmInvalidResponse,
            LlmError::Config(_) => ErrorCode::Internal,
        }
    }

    /// Whether the whole call may be worth repeating later (e.g. from a dead-letter queue): the
    /// provider was unreachable or overloaded rather than unwilling.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            LlmError::Unavailable { .. }
                | LlmError::Timeout { .. }
                | LlmError::StreamInterrupted { .. }
        )
    }

    /// The provider's error object and HTTP status, for the operator's log.
    pub fn provider_error(&self) -> Option<(Option<u16>, &ProviderError)> {
        match self {
            LlmError::Rejected { status, error } => Some((Some(*status), error)),
            LlmError::Failed { error, .. } => Some((None, error)),
            _ => None,
        }
    }

    /// The provider response JSON carried by the error, if any (refusals and failures).
    pub fn raw_response(&self) -> Option<&Value> {
        match self {
            LlmError::Refused { raw, .. } => Some(raw),
            LlmError::Failed { raw, .. } => raw.as_deref(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_providers_long_words_reach_a_client_cut() {
        let error = ProviderError { message: "é".repeat(100_000), ..Default::default() };
        let e = LlmError::Rejected { status: 400, error: Box::new(error) };
        let shown = e.to_string();
        assert!(shown.chars().count() < CLIENT_TEXT_CHARS + 100, "{} chars", shown.len());
        assert!(shown.ends_with('…'));
    }

    #[test]
    fn reads_nested_flat_and_garbage_error_bodies() {
        let nested = br#"{"error":{"message":"m","type":"invalid_request_error","param":"input","code":"invalid_value"}}"#;
        let e = ProviderError::from_body(nested);
        assert_eq!((e.code.as_deref(), e.param.as_deref()), (Some("invalid_value"), Some("input")));
        assert!(e.is("invalid_request_error"));
        let flat =
            ProviderError::from_body(br#"{"type":"error","code":"server_error","message":"x"}"#);
        assert_eq!(flat.code.as_deref(), Some("server_error"));
        let junk = ProviderError::from_body(b"<html>bad gateway</html>");
        assert_eq!(junk.message, "<html>bad gateway</html>");
        assert_eq!(e.to_string(), "invalid_value: m (param `input`)");
    }

    #[test]
    fn account_problems_display_a_fixed_sentence() {
        let quota = ProviderError::from_body(
            br#"{"code":"insufficient_quota","message":"org-secret is out"}"#,
        );
        let failed = LlmError::Failed { response_id: None, error: Box::new(quota), raw: None };
        assert_eq!(failed.to_string(), format!("llm response failed: {ACCOUNT_UNUSABLE}"));
        let key = ProviderError::from_body(br#"{"error":{"message":"key sk-abc...xyz is wrong"}}"#);
        let rejected = LlmError::Rejected { status: 403, error: Box::new(key) };
        assert!(!rejected.to_string().contains("sk-abc"), "{rejected}");
        assert!(rejected.to_string().ends_with(CREDENTIALS_REFUSED));
        let bad = ProviderError::from_body(br#"{"error":{"message":"m","code":"invalid_value"}}"#);
        assert_eq!(account_problem(Some(400), &bad), None, "request errors keep their words");
    }
}
