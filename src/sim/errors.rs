//! OpenAI-shaped error answers: `{"error":{"message","type","param","code"}}` with the status
//! and headers the real API uses, so clients meet the same bodies they would in production.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answer.
#[derive(Debug, Clone)]
pub(crate) struct ApiFailure {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// `retry-after-ms` and `Retry-After` (seconds) headers, for 429s.
    pub retry_after: (Option<u64>, Option<u64>),
}

impl ApiFailure {
    /// A 400 `invalid_request_error`.
    pub fn invalid(
        message: impl Into<String>,
        param: Option<&str>,
        code: Option<&'static str>,
    ) -> Self {
        ApiFailure {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_owned),
            code,
            retry_after: (None, None),
        }
    }

    /// `Invalid value: 'x'. Supported values are: …` at `param`.
    pub fn invalid_value(param: &str, value: &str, supported: &str) -> Self {
        let message = format!("Invalid value: '{value}'. Supported values are: {supported}.");
        Self::invalid(message, Some(param), Some("invalid_value"))
    }

    /// `Invalid type for 'param': expected …, but got … instead.`
    pub fn invalid_type(param: &str, expected: &str, got: &serde_json::Value) -> Self {
        let message = format!(
            "Invalid type for '{param}': expected {expected}, but got {} instead.",
            type_name(got)
        );
        Self::invalid(message, Some(param), Some("invalid_type"))
    }

    /// `Missing required parameter: 'param'.`
    pub fn missing(param: &str) -> Self {
        Self::invalid(
            format!("Missing required parameter: '{param}'."),
            Some(param),
            Some("missing_required_parameter"),
        )
    }

    /// The body is not JSON.
    pub fn unparsable() -> Self {
        Self::invalid(
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your \
             HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)",
            None,
            None,
        )
    }

    /// The real `previous_response_not_found` answer.
    pub fn previous_response_not_found(id: &str) -> Self {
        Self::invalid(
            format!("Previous response with id '{id}' not found."),
            Some("previous_response_id"),
            Some("previous_response_not_found"),
        )
    }

    /// 401 for a missing or wrong key.
    pub fn unauthorized(provided: bool) -> Self {
        let message = if provided {
            "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys."
        } else {
            "You didn't provide an API key. You need to provide your API key in an Authorization header using \
             Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        };
        ApiFailure {
            status: StatusCode::UNAUTHORIZED,
            code: provided.then_some("invalid_api_key"),
            ..Self::invalid(message, None, None)
        }
    }

    /// A canned answer for an injected status.
    pub fn for_status(status: StatusCode) -> Self {
        let (kind, code, message) = match status.as_u16() {
            400 => ("invalid_request_error", None, "Simulated bad request."),
            401 => {
                ("invalid_request_error", Some("invalid_api_key"), "Incorrect API key provided.")
            }
            403 => (
                "invalid_request_error",
                Some("unsupported_country_region_territory"),
                "Country, region, or territory not supported.",
            ),
            404 => (
                "invalid_request_error",
                Some("model_not_found"),
                "The model does not exist or you do not have access to it.",
            ),
            429 => (
                "requests",
                Some("rate_limit_exceeded"),
                "Rate limit reached for requests. Please try again in 1s.",
            ),
            s if s >= 500 => (
                "server_error",
                None,
                "The server had an error while processing your request. Sorry about that!",
            ),
            _ => ("invalid_request_error", None, "Simulated error."),
        };
        ApiFailure { status, kind, code, ..Self::invalid(message, None, None) }
    }

    /// 429 `insufficient_quota` (the one 429 that must not be retried).
    pub fn insufficient_quota() -> Self {
        ApiFailure {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: "insufficient_quota",
            code: Some("insufficient_quota"),
            ..Self::invalid(
                "You exceeded your current quota, please check your plan and billing details.",
                None,
                None,
            )
        }
    }

    /// 429 `rate_limit_exceeded` with the given `retry-after-ms` / `Retry-After` headers.
    pub fn rate_limited(retry_after_ms: Option<u64>, retry_after_secs: Option<u64>) -> Self {
        let wait = retry_after_ms
            .map_or_else(|| format!("{}s", retry_after_secs.unwrap_or(1)), |ms| format!("{ms}ms"));
        let message = format!(
            "Rate limit reached for gpt-sim on tokens per min (TPM): Limit 30000, Used 29937, Requested 385. \
             Please try again in {wait}."
        );
        ApiFailure {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: "tokens",
            code: Some("rate_limit_exceeded"),
            retry_after: (retry_after_ms, retry_after_secs),
            ..Self::invalid(message, None, None)
        }
    }
}

fn type_name(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        let body = json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}});
        let mut resp = (self.status, axum::Json(body)).into_response();
        let headers = resp.headers_mut();
        if let Some(ms) = self.retry_after.0 {
            headers.insert("retry-after-ms", HeaderValue::from(ms));
        }
        if let Some(secs) = self.retry_after.1 {
            headers.insert("retry-after", HeaderValue::from(secs));
        }
        resp
    }
}
