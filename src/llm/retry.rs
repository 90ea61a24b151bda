//! Retry policy: which failures of one attempt are retried, how long to wait (exponential
//! backoff with jitter via `backon`, replaced by the server's `retry-after-ms` / `Retry-After`),
//! and what a failure becomes once retries end.
//!
//! Retried: connection errors, timeouts, 408, 409, 429 and 5xx (the OpenAI SDKs' set), and any
//! status whose `x-should-retry: true` asks for it. Never retried: other 4xx,
//! `insufficient_quota`, 429 "Request too large" (it can never fit), `x-should-retry: false`, and
//! a stream that has already delivered an event.

use std::time::Duration;

use backon::ExponentialBuilder;
use reqwest::header::HeaderMap;
use reqwest::StatusCode;

use super::error::{account_problem, LlmError, ProviderError, TimeoutPhase};
use crate::config::{redact_url, LlmSettings};

/// Backoff settings, from `[llm]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryPolicy {
    max_retries: u32,
    initial_delay: Duration,
    max_delay: Duration,
    retry_after_max: Duration,
}

impl RetryPolicy {
    pub(crate) fn from_settings(s: &LlmSettings) -> Self {
        RetryPolicy {
            max_retries: s.max_retries,
            initial_delay: Duration::from_millis(s.retry_initial_delay_ms),
            max_delay: Duration::from_millis(s.retry_max_delay_ms.max(s.retry_initial_delay_ms)),
            retry_after_max: Duration::from_millis(s.retry_after_max_ms),
        }
    }

    pub(crate) fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.initial_delay)
            .with_max_delay(self.max_delay)
            .with_factor(2.0)
            .with_max_times(self.max_retries as usize)
            .with_jitter()
    }

    /// The wait before the next attempt: `None` once retries are used up, or when the server
    /// asks for more than `retry_after_max`; the server's delay otherwise replaces the backoff.
    pub(crate) fn adjust(&self, err: &AttemptError, backoff: Option<Duration>) -> Option<Duration> {
        let backoff = backoff?;
        match err {
            AttemptError::Retryable { retry_after: Some(wait), .. } => {
                (*wait <= self.retry_after_max).then_some(*wait)
            }
            _ => Some(backoff),
        }
    }
}

/// What went wrong in a retryable way.
#[derive(Debug)]
pub(crate) enum RetryCause {
    /// A retryable HTTP status.
    Status { status: u16, error: ProviderError },
    /// The connection failed or broke.
    Transport(String),
    /// A timeout fired.
    Timeout(TimeoutPhase),
}

/// The failure of one attempt.
#[derive(Debug)]
pub(crate) enum AttemptError {
    /// May be retried.
    Retryable { cause: RetryCause, retry_after: Option<Duration> },
    /// A stream broke after delivering `events` events: reported, never retried.
    Interrupted { events: u64, cause: RetryCause },
    /// Final as it is.
    Fatal(LlmError),
}

impl AttemptError {
    pub(crate) fn retryable(cause: RetryCause) -> Self {
        AttemptError::Retryable { cause, retry_after: None }
    }

    pub(crate) fn is_retryable(&self) -> bool {
        matches!(self, AttemptError::Retryable { .. })
    }

    /// Whether the provider may have run, and billed, the failed attempt: it timed out after
    /// the connection was made, or the connection failed (possibly after the request was sent).
    /// A status (429, 5xx) is an answer that ran nothing.
    pub(crate) fn may_have_been_billed(&self) -> bool {
        match self {
            AttemptError::Retryable { cause: RetryCause::Timeout(phase), .. } => {
                *phase != TimeoutPhase::Connect
            }
            AttemptError::Retryable { cause: RetryCause::Transport(_), .. } => true,
            _ => false,
        }
    }

    /// The provider's error object and HTTP status, for the operator's log: the answer that
    /// ended the call, whose text [`AttemptError::into_final`] keeps from clients.
    pub(crate) fn provider_error(&self) -> Option<(Option<u16>, &ProviderError)> {
        match self {
            AttemptError::Retryable { cause: RetryCause::Status { status, error }, .. }
            | AttemptError::Interrupted { cause: RetryCause::Status { status, error }, .. } => {
                Some((Some(*status), error))
            }
            AttemptError::Fatal(e) => e.provider_error(),
            _ => None,
        }
    }

    /// The error the caller sees after `attempts` attempts.
    pub(crate) fn into_final(self, attempts: u32) -> LlmError {
        match self {
            AttemptError::Retryable { cause: RetryCause::Timeout(phase), .. }
            | AttemptError::Interrupted { cause: RetryCause::Timeout(phase), .. } => {
                LlmError::Timeout { attempts, phase }
            }
            AttemptError::Retryable {
                cause: RetryCause::Status { status, error },
                retry_after,
            } => {
                let wait = retry_after
                    .map(|d| format!(" (server asked to wait {} ms)", d.as_millis()))
                    .unwrap_or_default();
                LlmError::Unavailable {
                    attempts,
                    status: Some(status),
                    cause: status_cause(status, &error) + &wait,
                }
            }
            AttemptError::Retryable { cause: RetryCause::Transport(cause), .. } => {
                LlmError::Unavailable { attempts, status: None, cause }
            }
            AttemptError::Interrupted { events, cause: RetryCause::Transport(cause) } => {
                LlmError::StreamInterrupted { events, cause }
            }
            AttemptError::Interrupted { events, cause: RetryCause::Status { status, error } } => {
                LlmError::StreamInterrupted { events, cause: status_cause(status, &error) }
            }
            AttemptError::Fatal(e) => e,
        }
    }
}

/// An HTTP failure as a client may read it: the status and the provider's machine code (e.g.
/// `HTTP 429 (rate_limit_exceeded)`), or the fixed sentence for an account problem. The provider's
/// text stays out: a rate-limit message names the organisation and its limits.
fn status_cause(status: u16, error: &ProviderError) -> String {
    if let Some(sentence) = account_problem(Some(status), error) {
        return format!("HTTP {status}: {sentence}");
    }
    match error.code.as_deref().or(error.kind.as_deref()) {
        Some(code) => format!("HTTP {status} ({code})"),
        None => format!("HTTP {status}"),
    }
}

/// Classifies a non-success HTTP answer from its status, headers and body.
pub(crate) fn classify_status(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
) -> AttemptError {
    let code = status.as_u16();
    if !(status.is_client_error() || status.is_server_error()) {
        return AttemptError::Fatal(LlmError::InvalidResponse(format!(
            "unexpected HTTP status {code}"
        )));
    }
    let error = ProviderError::from_body(body);
    if error.is("previous_response_not_found") {
        return AttemptError::Fatal(LlmError::PreviousResponseNotFound { message: error.message });
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let never = error.is("insufficient_quota")
        || (code == 429 && error.message.starts_with("Request too large"));
    let retryable = !never
        && match header("x-should-retry") {
            Some("true") => true,
            Some("false") => false,
            _ => matches!(code, 408 | 409 | 429) || status.is_server_error(),
        };
    if retryable {
        AttemptError::Retryable {
            cause: RetryCause::Status { status: code, error },
            retry_after: retry_after(headers),
        }
    } else {
        AttemptError::Fatal(LlmError::Rejected { status: code, error: Box::new(error) })
    }
}

/// Classifies a transport error from reqwest. Our own timers cover the request and stream
/// timeouts, so a reqwest timeout is the connect timeout.
pub(crate) fn classify_transport(e: &reqwest::Error) -> AttemptError {
    if e.is_timeout() {
        return AttemptError::retryable(RetryCause::Timeout(TimeoutPhase::Connect));
    }
    AttemptError::retryable(RetryCause::Transport(transport_error(e)))
}

/// A reqwest error on one line, with secrets in its URL (`?api-key=`) hidden.
pub(crate) fn transport_error(e: &reqwest::Error) -> String {
    let text = error_chain(e);
    match e.url() {
        Some(url) => text.replace(url.as_str(), &redact_url(url.as_str())),
        None => text,
    }
}

/// An error and its sources on one line.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The server's requested delay: `retry-after-ms` first, then `Retry-After` as seconds or an
/// HTTP date.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let secs = |v: &str| {
        v.parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0).map(Duration::from_secs_f64)
    };
    if let Some(d) = header("retry-after-ms").and_then(secs) {
        return Some(d / 1000);
    }
    let value = header("retry-after")?;
    secs(value).or_else(|| {
        let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
        let wait = at.signed_duration_since(chrono::Utc::now());
        Some(wait.to_std().unwrap_or(Duration::ZERO))
    })
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn retry_after_headers() {
        assert_eq!(
            retry_after(&headers(&[("retry-after-ms", "250"), ("retry-after", "3")])),
            Some(Duration::from_millis(250))
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "2")])), Some(Duration::from_secs(2)));
        assert_eq!(
            retry_after(&headers(&[("retry-after", "0.5")])),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            retry_after(&headers(&[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")])),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")])), None);
    }

    #[test]
    fn status_classes() {
        let empty = HeaderMap::new();
        let body = |code: &str| {
            format!(r#"{{"error":{{"message":"m","type":"t","param":null,"code":"{code}"}}}}"#)
        };
        for s in [408, 409, 429, 500, 502, 503] {
            assert!(
                classify_status(StatusCode::from_u16(s).unwrap(), &empty, b"{}").is_retryable(),
                "{s}"
            );
        }
        for s in [400, 401, 403, 404, 422] {
            assert!(
                !classify_status(StatusCode::from_u16(s).unwrap(), &empty, b"{}").is_retryable(),
                "{s}"
            );
        }
        let quota = classify_status(
            StatusCode::TOO_MANY_REQUESTS,
            &empty,
            body("insufficient_quota").as_bytes(),
        );
        assert!(matches!(quota, AttemptError::Fatal(LlmError::Rejected { status: 429, .. })));
        let gone = classify_status(
            StatusCode::BAD_REQUEST,
            &empty,
            body("previous_response_not_found").as_bytes(),
        );
        assert!(matches!(gone, AttemptError::Fatal(LlmError::PreviousResponseNotFound { .. })));
        let no = classify_status(
            StatusCode::SERVICE_UNAVAILABLE,
            &headers(&[("x-should-retry", "false")]),
            b"",
        );
        assert!(!no.is_retryable());
    }

    #[test]
    fn adjust_prefers_server_delay_within_cap() {
        let p = RetryPolicy {
            max_retries: 2,
            initial_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(100),
            retry_after_max: Duration::from_secs(1),
        };
        let e = |ms| AttemptError::Retryable {
            cause: RetryCause::Transport("x".into()),
            retry_after: Some(Duration::from_millis(ms)),
        };
        assert_eq!(
            p.adjust(&e(300), Some(Duration::from_millis(10))),
            Some(Duration::from_millis(300))
        );
        assert_eq!(p.adjust(&e(5000), Some(Duration::from_millis(10))), None);
        assert_eq!(p.adjust(&e(300), None), None);
    }
}
