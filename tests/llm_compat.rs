//! The client against hand-written answers of the kind compatible servers (and odd days of the
//! real API) produce: comments and unknown events in a stream, argument deltas keyed by item id
//! with an empty final `output`, streams that close cleanly without a terminal event, `error`
//! events, JSON where SSE was asked for, and bodies that are not JSON.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use crate::sim_support;

use std::sync::{Arc, Mutex};

use aptix::config::LlmSettings;
use aptix::contracts::Outcome;
use aptix::llm::{Endpoint, HttpLlmClient, LlmError, LlmRequest, LlmResponse, RequestBody};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use sim_support::settings;

type Script = Arc<Mutex<(&'static str, String)>>;

/// A server answering every `POST /v1/responses` with the scripted content type and body.
async fn server() -> (String, Script) {
    let script: Script = Arc::new(Mutex::new(("text/event-stream", String::new())));
    let app = Router::new()
        .route(
            "/v1/responses",
            post(|State(s): State<Script>| async move {
                let (kind, body) = s.lock().expect("lock").clone();
                ([(header::CONTENT_TYPE, kind)], body).into_response()
            }),
        )
        .with_state(script.clone());
    (serve(app).await, script)
}

/// Serves `app` on a free local port; its base URL (`…/v1`).
async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/v1")
}

fn sse(events: &[Value]) -> String {
    let mut out = String::from(": keepalive\n\n");
    for e in events {
        out.push_str(&format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("x")));
    }
    out
}

async fn call(
    base: &str,
    script: &Script,
    kind: &'static str,
    body: String,
) -> Result<LlmResponse, LlmError> {
    *script.lock().expect("lock") = (kind, body);
    let mut settings = settings(base);
    settings.max_retries = 1;
    create(base, &settings).await
}

/// One streamed call to `base` with `settings`.
async fn create(base: &str, settings: &LlmSettings) -> Result<LlmResponse, LlmError> {
    let client = HttpLlmClient::new(settings).expect("client");
    let endpoint = Endpoint::new(base, None);
    let request = RequestBody::new(&json!({"model":"m","input":"hi","stream":true}));
    client
        .create(LlmRequest { endpoint: &endpoint, body: &request, deltas: None, once: false })
        .await
}

fn created() -> Value {
    json!({"type":"response.created","sequence_number":0,"response":{"id":"resp_c","status":"in_progress","output":[]}})
}

#[tokio::test]
async fn unknown_events_are_ignored_and_calls_are_rebuilt_from_item_deltas() {
    let (base, script) = server().await;
    let events = [
        created(),
        json!({"type":"response.vendor_extension.delta","sequence_number":1,"whatever":true}),
        json!({"type":"response.output_item.added","output_index":0,
               "item":{"type":"function_call","id":"fc_1","call_id":"call_A","name":"lookup","arguments":"","status":"in_progress"}}),
        json!({"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":"{\"q\":"}),
        json!({"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":"1}"}),
        json!({"type":"response.completed","response":{"id":"resp_c","status":"completed","output":[],
               "usage":{"input_tokens":7,"output_tokens":3,"total_tokens":10,
                        "input_tokens_details":{"cached_tokens":5},"output_tokens_details":{"reasoning_tokens":2}}}}),
    ];
    let r = call(&base, &script, "text/event-stream", sse(&events)).await.unwrap();
    let Outcome::ClientToolContinuation(t) = &r.outcome else { panic!("{r:?}") };
    let call = &t.tool_calls()[0];
    assert_eq!(
        (call.tool_call_id.as_str(), call.name.as_str(), call.arguments_json.as_str()),
        ("call_A", "lookup", r#"{"q":1}"#)
    );
    let usage = r.usage.unwrap();
    assert_eq!((usage.cached_input_tokens, usage.reasoning_tokens), (5, 2));
}

/// A provider that names two calls with one `call_id` gives an answer no client could complete
/// (results and approvals name calls by id): it is an invalid answer, not a turn left waiting.
#[tokio::test]
async fn a_streamed_answer_repeating_a_call_id_is_invalid() {
    let (base, script) = server().await;
    let item = |n: u64| {
        json!({"type":"response.output_item.done","output_index":n,
               "item":{"type":"function_call","id":format!("fc_{n}"),"call_id":"call_A","name":"lookup","arguments":"{}"}})
    };
    let done = json!({"type":"response.completed","response":{"id":"resp_c","status":"completed","output":[]}});
    let body = sse(&[created(), item(0), item(1), done]);
    let e = call(&base, &script, "text/event-stream", body).await.unwrap_err();
    assert!(
        matches!(&e, LlmError::InvalidResponse(m) if m.contains("repeating an earlier call's call_id")),
        "{e:?}"
    );
}

/// An answer larger than the broker could carry on (16 MiB), as JSON or as one endless stream
/// line, fails the call as an invalid answer instead of filling the worker that holds every
/// tenant's calls.
#[tokio::test]
async fn an_answer_past_16_mib_is_invalid_not_read_to_its_end() {
    let (base, script) = server().await;
    let big = "x".repeat(17 << 20);
    let json = format!("{{\"id\":\"r\",\"status\":\"completed\",\"output\":[],\"pad\":\"{big}\"}}");
    let endless = format!("{}data: {big}", sse(&[created()]));
    for (kind, body) in [("application/json", json), ("text/event-stream", endless)] {
        let e = call(&base, &script, kind, body).await.unwrap_err();
        assert!(
            matches!(&e, LlmError::InvalidResponse(m) if m.contains("larger than 16 MiB")),
            "{kind}: {e:?}"
        );
    }
}

/// One call, every attempt and wait included, ends at `llm.call_budget_ms`: a server that keeps
/// a stream open with comments (each resets the idle timer) would otherwise hold the delivery
/// for every attempt's whole `request_timeout_ms`, past the broker's ack timeout.
#[tokio::test]
async fn a_call_ends_at_its_budget_whatever_its_attempts_could_take() {
    let drip = || {
        let ticks = futures_util::stream::unfold((), |()| async {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            Some((Ok::<_, std::convert::Infallible>(bytes::Bytes::from_static(b": x\n\n")), ()))
        });
        ([(header::CONTENT_TYPE, "text/event-stream")], axum::body::Body::from_stream(ticks))
    };
    let base =
        serve(Router::new().route("/v1/responses", post(move || async move { drip() }))).await;
    let mut settings = settings(&base);
    (settings.request_timeout_ms, settings.max_retries, settings.call_budget_ms) = (400, 5, 500);
    let e = create(&base, &settings).await.unwrap_err();
    // Six attempts of 400 ms were allowed; the budget leaves room for two.
    assert!(matches!(e, LlmError::Timeout { attempts: 1..=2, .. }), "{e:?}");
}

#[tokio::test]
async fn streams_without_a_terminal_event_are_errors() {
    let (base, script) = server().await;
    let text = json!({"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":"Hel"});
    let e = call(&base, &script, "text/event-stream", sse(&[created(), text])).await.unwrap_err();
    assert!(
        matches!(&e, LlmError::StreamInterrupted { events: 2, cause } if cause.contains("terminal")),
        "{e:?}"
    );
    // No event at all: nothing was delivered, so it is retried, then reported.
    let e = call(&base, &script, "text/event-stream", String::new()).await.unwrap_err();
    assert!(
        matches!(&e, LlmError::Unavailable { attempts: 2, status: None, cause } if cause.contains("terminal")),
        "{e:?}"
    );
}

#[tokio::test]
async fn error_events_json_answers_and_garbage() {
    let (base, script) = server().await;
    let error = json!({"type":"error","sequence_number":1,"code":"server_error","message":"boom","param":null});
    let e = call(&base, &script, "text/event-stream", sse(&[created(), error])).await.unwrap_err();
    assert!(
        matches!(&e, LlmError::Failed { response_id: Some(id), error, .. } if id == "resp_c" && error.message == "boom"),
        "{e:?}"
    );

    let plain = json!({"id":"resp_j","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"ok"}]}]});
    let r = call(&base, &script, "application/json", plain.to_string()).await.unwrap();
    assert!(matches!(&r.outcome, Outcome::Final(f) if f.primary_output_text == "ok"));

    let e = call(&base, &script, "application/json", "<html>".into()).await.unwrap_err();
    assert!(matches!(e, LlmError::InvalidResponse(_)), "{e:?}");
}

/// A provider that answers with a redirect (a hostile one, or a tenant's own `llm_base_url`)
/// cannot send the worker's request, with its key, to another address (an internal service,
/// the cloud's metadata address): the redirect is not followed, and the call fails as an
/// invalid response naming the status.
#[tokio::test]
async fn a_redirect_is_not_followed() {
    let reached = Arc::new(Mutex::new(0_usize));
    let counted = reached.clone();
    let elsewhere = Router::new().fallback(move || {
        *counted.lock().expect("lock") += 1;
        async { "internal" }
    });
    let target = serve(elsewhere).await;
    let app = Router::new().route(
        "/v1/responses",
        post(move || {
            let to = format!("{target}/metadata");
            async move { (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, to)]).into_response() }
        }),
    );
    let base = serve(app).await;
    let e = create(&base, &settings(&base)).await.unwrap_err();
    assert!(
        matches!(&e, LlmError::InvalidResponse(m) if m.contains("unexpected HTTP status 307")),
        "{e:?}"
    );
    assert_eq!(*reached.lock().expect("lock"), 0, "the redirect was followed");
}
