//! HTTP routes: `POST /v1/responses`, `GET /v1/responses/{id}`, and the control routes
//! `POST /_sim/control`, `GET /_sim/requests`, `GET /_sim/stats` for a simulator in another
//! process.
//!
//! A create request is logged, authenticated, given its injected fault (if any), delayed by the
//! configured latency, parsed, validated, answered by the script, stored (unless `store:false`),
//! and sent as JSON or as an SSE stream.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use futures_util::stream::{self, StreamExt as _};
use serde_json::Value;

use super::cache::Lookup;
use super::errors::ApiFailure;
use super::faults::Fault;
use super::state::{SimState, Stored};
use super::{request_rules, response, script, sse, Control};

type Shared = Arc<SimState>;

pub(crate) fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/responses", post(create))
        .route("/v1/responses/{id}", get(retrieve))
        .route("/_sim/control", post(control))
        .route("/_sim/requests", get(requests))
        .route("/_sim/stats", get(stats))
        // Requests at Aptix's own maximum (4 MiB of request, sent about twice) must get through;
        // axum's default is 2 MB.
        .layer(axum::extract::DefaultBodyLimit::max(64 * 1024 * 1024))
        .with_state(state)
}

fn fail(st: &SimState, failure: ApiFailure) -> Response {
    st.errors.fetch_add(1, Ordering::Relaxed);
    failure.into_response()
}

fn authorize(st: &SimState, headers: &HeaderMap) -> Result<(), ApiFailure> {
    let Some(key) = &st.api_key else { return Ok(()) };
    let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    match given.and_then(|v| v.strip_prefix("Bearer ")) {
        Some(k) if k == key => Ok(()),
        Some(_) => Err(ApiFailure::unauthorized(true)),
        None => Err(ApiFailure::unauthorized(false)),
    }
}

async fn create(State(st): State<Shared>, headers: HeaderMap, raw: Bytes) -> Response {
    st.log_request(raw.clone());
    if let Err(e) = authorize(&st, &headers) {
        return fail(&st, e);
    }
    let fault = st.faults.pick();
    if fault.is_some() {
        st.faults_injected.fetch_add(1, Ordering::Relaxed);
    }
    st.latency.answer_delay().await;
    let cut = match fault {
        None => None,
        Some(Fault::RateLimit { retry_after_ms, retry_after_secs }) => {
            return fail(&st, ApiFailure::rate_limited(retry_after_ms, retry_after_secs))
        }
        Some(Fault::InsufficientQuota) => return fail(&st, ApiFailure::insufficient_quota()),
        Some(Fault::ServerError) => {
            return fail(&st, ApiFailure::for_status(StatusCode::INTERNAL_SERVER_ERROR))
        }
        Some(Fault::Status { status }) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return fail(&st, ApiFailure::for_status(status));
        }
        Some(Fault::Hang) => return hang(&st).await,
        Some(Fault::Disconnect) => return broken(Vec::new(), false, &st),
        Some(cut @ (Fault::StreamCut { .. } | Fault::StreamStall { .. })) => Some(cut),
    };
    let Ok(body) = serde_json::from_slice::<Value>(&raw) else {
        return fail(&st, ApiFailure::unparsable());
    };
    if let Err(e) = request_rules::body(&body) {
        return fail(&st, e);
    }
    let prev = match body.get("previous_response_id").and_then(Value::as_str) {
        Some(id) => match st.get(id) {
            Some(prev) => Some(prev),
            None => return fail(&st, ApiFailure::previous_response_not_found(id)),
        },
        None => None,
    };
    if let Err(e) = request_rules::tool_outputs(&body, prev.as_deref()) {
        return fail(&st, e);
    }
    let mut reply = script::reply(&body, raw.len(), prev.as_deref(), &|prefix| st.id(prefix));
    let (opening, opening_tokens) = match prev.as_deref() {
        Some(p) => (p.opening, p.opening_tokens),
        None => opening_of(&body),
    };
    let previous = body.get("previous_response_id").and_then(Value::as_str);
    let (cached, machine) = st.cache.lookup(&Lookup {
        opening,
        opening_tokens,
        previous: previous.zip(prev.as_deref()).map(|(id, p)| (id, p.prompt_tokens)),
        key: body.get("prompt_cache_key").and_then(Value::as_str),
    });
    reply.tokens.cached = cached.min(reply.tokens.input);
    st.count_tokens(reply.tokens.input, reply.tokens.cached);
    let id = st.id("resp");
    let created_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let store = body.get("store").and_then(Value::as_bool).unwrap_or(true);
    let object = response::build(&body, &id, created_at, &reply, store);
    let json = Bytes::from(object.to_string());
    st.responses.fetch_add(1, Ordering::Relaxed);
    if store {
        let pending_calls = match reply.status {
            script::Status::Completed => reply
                .items
                .iter()
                .filter_map(|i| match i {
                    script::Item::Call { call_id, .. } => Some(call_id.clone()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        let stored = Stored {
            json: json.clone(),
            pending_calls,
            depth: reply.depth,
            context_tokens: reply.tokens.input + reply.tokens.output,
            system_messages: reply.system_messages,
            prompt_tokens: reply.tokens.input,
            opening,
            opening_tokens,
        };
        st.cache.hold(machine, &id);
        st.put(id, stored);
    }
    let streaming = body.get("stream").and_then(Value::as_bool) == Some(true);
    match (streaming, cut) {
        (false, None) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        (false, Some(Fault::StreamCut { .. })) => {
            broken(vec![json.slice(..json.len() / 2)], false, &st)
        }
        (false, Some(_)) => hang(&st).await,
        (true, cut) => {
            // Serialized from a `Value` just above, so always UTF-8.
            let text = std::str::from_utf8(&json).unwrap_or_default();
            let mut frames = sse::events(&reply, &object, text, st.delta_chars);
            match cut {
                Some(Fault::StreamCut { after_events }) => {
                    frames.truncate(after_events);
                    broken(frames, true, &st)
                }
                Some(Fault::StreamStall { after_events }) => {
                    frames.truncate(after_events);
                    stalled(frames, &st)
                }
                _ => event_stream(frames, st),
            }
        }
    }
}

/// A new chain's opening (its first input item, where the boot prompt is): what the provider
/// routes by, and its tokens.
fn opening_of(body: &Value) -> (u64, u64) {
    let first = body.pointer("/input/0").map(Value::to_string).unwrap_or_default();
    let tools = body.get("tools").map(Value::to_string).unwrap_or_default();
    // Tools precede the input in the prompt the model sees, so they are part of the opening.
    let tokens = ((tools.len() + first.len()) as u64).div_ceil(4);
    (super::cache::hash(&(tools, first)), tokens)
}

fn sse_response(body: Body) -> Response {
    ([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], body)
        .into_response()
}

/// A normal stream, paced by the per-event latency.
fn event_stream(frames: Vec<Bytes>, st: Shared) -> Response {
    let pace = st.latency.per_event();
    if pace.is_zero() {
        return sse_response(Body::from(frames.concat()));
    }
    let left = Unsent { state: st, finished: false };
    let paced = stream::unfold((frames.into_iter(), left), move |(mut frames, left)| async move {
        let Some(frame) = frames.next() else {
            left.finish();
            return None;
        };
        tokio::time::sleep(pace).await;
        Some((Ok::<_, std::io::Error>(frame), (frames, left)))
    });
    sse_response(Body::from_stream(paced))
}

/// Counts a paced stream dropped before its last frame: its client closed the connection.
struct Unsent {
    state: Shared,
    finished: bool,
}

impl Unsent {
    fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        if !self.finished {
            self.state.streams_abandoned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Sends `frames`, then breaks the connection.
fn broken(frames: Vec<Bytes>, sse: bool, st: &SimState) -> Response {
    let pace = st.latency.per_event();
    let sent = stream::iter(frames).then(move |frame| async move {
        tokio::time::sleep(pace).await;
        Ok::<_, std::io::Error>(frame)
    });
    let cut = stream::once(async {
        // Let the frames already sent reach the wire: an error discards unflushed output.
        tokio::time::sleep(Duration::from_millis(20)).await;
        Err(std::io::Error::other("simulated connection drop"))
    });
    let body = Body::from_stream(sent.chain(cut));
    if sse {
        sse_response(body)
    } else {
        ([(header::CONTENT_TYPE, "application/json")], body).into_response()
    }
}

/// Sends `frames`, then stays silent until the hang limit or shutdown.
fn stalled(frames: Vec<Bytes>, st: &Shared) -> Response {
    let pace = st.latency.per_event();
    let (state, limit) = (st.clone(), st.hang_limit);
    let sent = stream::iter(frames).then(move |frame| async move {
        tokio::time::sleep(pace).await;
        Ok::<_, std::io::Error>(frame)
    });
    let silence = stream::once(async move {
        wait_or_closed(&state, limit).await;
        Err(std::io::Error::other("simulated stall ended"))
    });
    sse_response(Body::from_stream(sent.chain(silence)))
}

async fn wait_or_closed(st: &SimState, limit: Duration) {
    tokio::select! {
        () = tokio::time::sleep(limit) => {}
        () = st.closed() => {}
    }
}

/// Never answers (until the hang limit or shutdown, then a 500).
async fn hang(st: &SimState) -> Response {
    wait_or_closed(st, st.hang_limit).await;
    fail(st, ApiFailure::for_status(StatusCode::INTERNAL_SERVER_ERROR))
}

async fn retrieve(
    State(st): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(e) = authorize(&st, &headers) {
        return fail(&st, e);
    }
    match st.get(&id) {
        Some(stored) => {
            ([(header::CONTENT_TYPE, "application/json")], stored.json.clone()).into_response()
        }
        None => {
            let failure = ApiFailure {
                status: StatusCode::NOT_FOUND,
                ..ApiFailure::invalid(format!("Response with id '{id}' not found."), None, None)
            };
            fail(&st, failure)
        }
    }
}

/// 204 once applied; 400 with the API's error shape, naming the problem, for a body that is
/// not a valid command (not counted in the stats, which count `/v1/responses` answers).
async fn control(State(st): State<Shared>, raw: Bytes) -> Response {
    match Control::from_json(&raw) {
        Ok(command) => {
            command.apply(&st);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => {
            let message = format!("invalid control command: {e}");
            ApiFailure::invalid(message, None, Some("invalid_control_command")).into_response()
        }
    }
}

async fn requests(State(st): State<Shared>) -> Json<Vec<Value>> {
    let logged = st.logged();
    let bodies = logged.iter().map(|r| {
        r.json().unwrap_or_else(|| Value::String(String::from_utf8_lossy(&r.body).into()))
    });
    Json(bodies.collect())
}

async fn stats(State(st): State<Shared>) -> Json<super::SimStats> {
    Json(st.stats())
}
