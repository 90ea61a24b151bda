//! The Responses client against the in-process simulator: answers (plain, streamed, tool calls),
//! retries of every retryable fault, non-retryable faults with their cause, broken streams,
//! `previous_response_not_found`, and the three timeouts.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use crate::sim_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use aptix::config::{AgentContext, Secret};
use aptix::contracts::{ApiError, ErrorCode, Outcome};
use aptix::llm::{
    DeltaEvent, Endpoint, HttpLlmClient, LlmClient, LlmError, LlmRequest, LlmResponse, RequestBody,
    ResponseStatus, StreamDelta, TimeoutPhase, ACCOUNT_UNUSABLE, CREDENTIALS_REFUSED,
    INCOMPLETE_WARNING_CODE,
};
use aptix::sim::{Fault, SimHandle};
use serde_json::{json, Value};
use sim_support::{first_turn, next_turn, settings, start_sim, tool_outputs};
use tokio::sync::mpsc;

struct Rig {
    sim: SimHandle,
    client: Arc<dyn LlmClient>,
    endpoint: Endpoint,
}

async fn rig() -> Rig {
    let sim = start_sim(None).await;
    let client: Arc<dyn LlmClient> =
        Arc::new(HttpLlmClient::new(&settings(&sim.base_url())).expect("client builds"));
    let endpoint = Endpoint::new(sim.base_url(), None);
    Rig { sim, client, endpoint }
}

impl Rig {
    async fn call(&self, body: &Value) -> Result<LlmResponse, LlmError> {
        self.client
            .create_response(LlmRequest {
                endpoint: &self.endpoint,
                body: &body.clone().into(),
                deltas: None,
                once: false,
            })
            .await
    }

    /// A streaming call; returns the result and every delta forwarded.
    async fn stream(&self, body: &Value) -> (Result<LlmResponse, LlmError>, Vec<StreamDelta>) {
        let (tx, mut rx) = mpsc::channel(1024);
        let result = self
            .client
            .create_response(LlmRequest {
                endpoint: &self.endpoint,
                body: &body.clone().into(),
                deltas: Some(&tx),
                once: false,
            })
            .await;
        drop(tx);
        let mut deltas = Vec::new();
        while let Some(d) = rx.recv().await {
            deltas.push(d);
        }
        (result, deltas)
    }

    fn requests(&self) -> u64 {
        self.sim.stats().requests
    }
}

fn final_text(r: &LlmResponse) -> &str {
    match &r.outcome {
        Outcome::Final(f) => &f.primary_output_text,
        other => panic!("expected a final answer, got {other:?}"),
    }
}

fn calls(r: &LlmResponse) -> Vec<(String, String)> {
    match &r.outcome {
        Outcome::ClientToolContinuation(t) => {
            t.tool_calls().iter().map(|c| (c.name.clone(), c.arguments_json.clone())).collect()
        }
        other => panic!("expected tool calls, got {other:?}"),
    }
}

#[tokio::test]
async fn plain_answer_maps_text_usage_and_raw() {
    let rig = rig().await;
    let r = rig.call(&first_turn("Explain chunk 1", false)).await.unwrap();
    let text = final_text(&r);
    assert!(text.contains("instruction: Explain chunk 1"), "{text}");
    assert!(text.contains("context_chunks: 2 (c1, c2)"), "{text}");
    assert!(text.contains("tools_offered: read_file, run_tests"), "{text}");
    assert_eq!((r.status.clone(), r.attempts), (ResponseStatus::Completed, 1));
    assert_eq!(r.raw["id"], json!(r.response_id));
    let usage = r.usage.unwrap();
    assert!(usage.input_tokens > 0 && usage.output_tokens > 0);
    assert_eq!(usage.total_tokens, usage.input_tokens + usage.output_tokens);
    let Outcome::Final(f) = &r.outcome else { unreachable!() };
    assert_eq!(f.usage, Some(usage));
}

#[tokio::test]
async fn streamed_answer_forwards_ordered_deltas() {
    let rig = rig().await;
    let (result, deltas) = rig.stream(&first_turn("Stream please", true)).await;
    let r = result.unwrap();
    assert!(deltas.iter().enumerate().all(|(i, d)| d.seq == i as u64), "{deltas:?}");
    assert_eq!(deltas[0].event, DeltaEvent::Started { response_id: r.response_id.clone() });
    let streamed: String = deltas
        .iter()
        .filter_map(|d| match &d.event {
            DeltaEvent::OutputText { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert!(deltas.len() > 5, "the text arrives in several deltas");
    assert_eq!(streamed, final_text(&r));
    assert!(final_text(&r).contains("context_chunks: 2"));
    assert_eq!(r.raw["status"], "completed");
    assert!(r.usage.is_some());
}

#[tokio::test]
async fn tool_calls_one_and_several_keep_order_and_chain_outputs() {
    let rig = rig().await;
    let one = rig
        .call(&first_turn(r#"Look: @call(read_file, {"path":"src/lib.rs"})"#, false))
        .await
        .unwrap();
    assert_eq!(calls(&one), vec![("read_file".into(), r#"{"path":"src/lib.rs"}"#.into())]);
    assert!(one.usage.is_some(), "usage is reported for continuations too");

    for stream in [false, true] {
        let (result, deltas) =
            rig.stream(&first_turn("@call(run_tests) then @call(read_file)", stream)).await;
        let several = result.unwrap();
        assert_eq!(
            calls(&several),
            vec![
                ("run_tests".into(), r#"{"filter":"sample"}"#.into()),
                ("read_file".into(), r#"{"path":"sample"}"#.into())
            ]
        );
        if stream {
            let started: Vec<&str> = deltas
                .iter()
                .filter_map(|d| match &d.event {
                    DeltaEvent::ToolCallStarted { name, .. } => Some(name.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(started, ["run_tests", "read_file"]);
        }
        let Outcome::ClientToolContinuation(t) = &several.outcome else { unreachable!() };
        let ids: Vec<&str> = t.tool_calls().iter().map(|c| c.tool_call_id.as_str()).collect();
        let answered = rig
            .call(&tool_outputs(
                &several.response_id,
                &[(ids[0], "3 passed"), (ids[1], "fn main() {}")],
            ))
            .await
            .unwrap();
        let text = final_text(&answered);
        assert!(text.contains("tool_outputs: 2"), "{text}");
        assert!(text.contains(&format!("tool_output {}: 3 passed", ids[0])), "{text}");
        assert!(text.contains("chain_depth: 2"), "{text}");
    }
}

#[tokio::test]
async fn retryable_statuses_are_retried_honouring_retry_after() {
    let rig = rig().await;
    rig.sim
        .faults()
        .fail_next(Fault::RateLimit { retry_after_ms: Some(30), retry_after_secs: Some(5) }, 2);
    let r = rig.call(&first_turn("hi", false)).await.unwrap();
    assert_eq!(r.attempts, 3);

    rig.sim.faults().fail_next(Fault::ServerError, 1);
    rig.sim.faults().fail_next(Fault::Status { status: 503 }, 1);
    assert_eq!(rig.call(&first_turn("hi", false)).await.unwrap().attempts, 3);

    rig.sim.faults().fail_next(Fault::Status { status: 408 }, 1);
    let (r, _) = rig.stream(&first_turn("hi", true)).await;
    assert_eq!(r.unwrap().attempts, 2);

    // `Retry-After` in whole seconds is honoured too: the retry waits at least that long.
    rig.sim
        .faults()
        .fail_next(Fault::RateLimit { retry_after_ms: None, retry_after_secs: Some(1) }, 1);
    let started = Instant::now();
    assert_eq!(rig.call(&first_turn("hi", false)).await.unwrap().attempts, 2);
    assert!(started.elapsed() >= Duration::from_secs(1));
}

#[tokio::test]
async fn exhausted_retries_report_unavailable() {
    let rig = rig().await;
    rig.sim.faults().fail_next(Fault::ServerError, 10);
    let e = rig.call(&first_turn("hi", false)).await.unwrap_err();
    assert!(matches!(e, LlmError::Unavailable { attempts: 3, status: Some(500), .. }), "{e:?}");
    assert_eq!(e.code(), ErrorCode::LlmUnavailable);
    // The client reads the status and the provider's code; the provider's text goes to the log.
    assert!(e.to_string().ends_with("HTTP 500 (server_error)"), "{e}");
    rig.sim.faults().clear();

    // A Retry-After beyond `retry_after_max_ms` ends the retries at once.
    rig.sim
        .faults()
        .fail_next(Fault::RateLimit { retry_after_ms: None, retry_after_secs: Some(60) }, 1);
    let e = rig.call(&first_turn("hi", false)).await.unwrap_err();
    assert!(matches!(e, LlmError::Unavailable { attempts: 1, status: Some(429), .. }), "{e:?}");
}

#[tokio::test]
async fn dropped_connections_are_retried() {
    let rig = rig().await;
    rig.sim.faults().fail_next(Fault::Disconnect, 1);
    assert_eq!(rig.call(&first_turn("hi", false)).await.unwrap().attempts, 2);
    rig.sim.faults().fail_next(Fault::Disconnect, 1);
    let (r, _) = rig.stream(&first_turn("hi", true)).await;
    assert_eq!(r.unwrap().attempts, 2);
    // A JSON body cut halfway is a broken connection, not a bad answer.
    rig.sim.faults().fail_next(Fault::StreamCut { after_events: 0 }, 1);
    assert_eq!(rig.call(&first_turn("hi", false)).await.unwrap().attempts, 2);
    // A stream cut before its first event has delivered nothing: retried.
    rig.sim.faults().fail_next(Fault::StreamCut { after_events: 0 }, 1);
    let (r, deltas) = rig.stream(&first_turn("hi", true)).await;
    assert_eq!(r.unwrap().attempts, 2);
    assert_eq!(deltas[0].seq, 0, "deltas come from the one successful attempt");
}

#[tokio::test]
async fn non_retryable_faults_report_their_cause() {
    let rig = rig().await;
    let mut bad = first_turn("hi", false);
    bad["input"][1]["content"][0]["type"] = json!("text");
    let e = rig.call(&bad).await.unwrap_err();
    let LlmError::Rejected { status: 400, error } = &e else { panic!("{e:?}") };
    assert_eq!(error.code.as_deref(), Some("invalid_value"));
    assert_eq!(error.param.as_deref(), Some("input[1].content[0].type"));
    assert_eq!(e.code(), ErrorCode::LlmRejected);
    assert_eq!(rig.requests(), 1, "a 400 is not retried");

    rig.sim.faults().fail_next(Fault::InsufficientQuota, 1);
    let e = rig.call(&first_turn("hi", false)).await.unwrap_err();
    assert!(
        matches!(&e, LlmError::Rejected { status: 429, error } if error.is("insufficient_quota")),
        "{e:?}"
    );
    assert_eq!(rig.requests(), 2, "insufficient_quota is not retried");

    rig.sim.faults().fail_next(Fault::Status { status: 404 }, 1);
    let e = rig.call(&first_turn("hi", true)).await.unwrap_err();
    assert!(matches!(&e, LlmError::Rejected { status: 404, .. }), "{e:?}");
    assert_eq!(rig.requests(), 3, "the status is checked before the stream is parsed");
}

#[tokio::test]
async fn wrong_api_key_is_rejected_with_401_and_the_right_one_works() {
    let sim = start_sim(Some("sk-sim-right")).await;
    let client = HttpLlmClient::new(&settings(&sim.base_url())).unwrap();
    let body = first_turn("hi", false);
    let wrong = Endpoint::new(sim.base_url(), Some(Secret::new("sk-sim-wrong")));
    let e = client
        .create(LlmRequest {
            endpoint: &wrong,
            body: &RequestBody::new(&body),
            deltas: None,
            once: false,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&e, LlmError::Rejected { status: 401, error } if error.is("invalid_api_key")),
        "{e:?}"
    );
    assert!(
        !format!("{e:?} {e} {wrong:?}").contains("sk-sim-wrong"),
        "the key never appears in errors"
    );
    let right = Endpoint::new(sim.base_url(), Some(Secret::new("sk-sim-right")));
    client
        .create(LlmRequest {
            endpoint: &right,
            body: &RequestBody::new(&body),
            deltas: None,
            once: false,
        })
        .await
        .unwrap();
    assert_eq!(sim.stats().requests, 2);
}

/// What the invoke stage puts in the client's reply for `e`.
fn client_error(e: &LlmError) -> ApiError {
    ApiError::new(e.code(), e.to_string())
}

#[tokio::test]
async fn account_errors_reach_clients_as_a_fixed_sentence() {
    let sim = start_sim(Some("sk-sim-right")).await;
    let client = HttpLlmClient::new(&settings(&sim.base_url())).unwrap();
    let body = first_turn("hi", false);
    let wrong = Endpoint::new(sim.base_url(), Some(Secret::new("sk-sim-wrong")));
    let e = client
        .create(LlmRequest {
            endpoint: &wrong,
            body: &RequestBody::new(&body),
            deltas: None,
            once: false,
        })
        .await
        .unwrap_err();
    let reply = client_error(&e);
    assert_eq!(reply.code, ErrorCode::LlmRejected);
    assert!(reply.message.ends_with(CREDENTIALS_REFUSED), "{}", reply.message);
    assert!(!reply.message.contains("Incorrect API key"), "{}", reply.message);
    // The provider's words stay on the error for the log.
    assert!(
        matches!(&e, LlmError::Rejected { error, .. } if error.message.contains("Incorrect API key"))
    );

    // Injected 401 and 403 answers, and an exhausted quota, read the same way.
    let rig = rig().await;
    for (fault, sentence, text) in [
        (Fault::Status { status: 401 }, CREDENTIALS_REFUSED, "Incorrect API key"),
        (Fault::Status { status: 403 }, CREDENTIALS_REFUSED, "Country, region"),
        (Fault::InsufficientQuota, ACCOUNT_UNUSABLE, "exceeded your current quota"),
    ] {
        rig.sim.faults().fail_next(fault, 1);
        let e = rig.call(&first_turn("hi", false)).await.unwrap_err();
        let reply = client_error(&e);
        assert_eq!(reply.code, ErrorCode::LlmRejected);
        assert!(reply.message.ends_with(sentence), "{}", reply.message);
        assert!(!reply.message.contains(text), "{}", reply.message);
    }

    // A rate limit that outlasts the retries names neither the organisation nor its limits.
    rig.sim.faults().fail_next(Fault::Status { status: 429 }, 10);
    let e = rig.call(&first_turn("hi", false)).await.unwrap_err();
    let reply = client_error(&e);
    assert_eq!(reply.code, ErrorCode::LlmUnavailable);
    assert!(reply.message.ends_with("HTTP 429 (rate_limit_exceeded)"), "{}", reply.message);
}

#[tokio::test]
async fn stream_broken_after_first_token_is_reported_not_retried() {
    let rig = rig().await;
    // created, in_progress, output_item.added, content_part.added, first text delta.
    rig.sim.faults().fail_next(Fault::StreamCut { after_events: 5 }, 1);
    let (r, deltas) = rig.stream(&first_turn("hi", true)).await;
    let e = r.unwrap_err();
    assert!(matches!(e, LlmError::StreamInterrupted { events: 5, .. }), "{e:?}");
    assert_eq!(e.code(), ErrorCode::LlmUnavailable);
    assert!(deltas.iter().any(|d| matches!(d.event, DeltaEvent::OutputText { .. })));
    assert_eq!(rig.requests(), 1);

    rig.sim.faults().fail_next(Fault::StreamStall { after_events: 5 }, 1);
    let (r, _) = rig.stream(&first_turn("hi", true)).await;
    let e = r.unwrap_err();
    assert!(
        matches!(e, LlmError::Timeout { attempts: 1, phase: TimeoutPhase::StreamIdle }),
        "{e:?}"
    );
    assert_eq!(e.code(), ErrorCode::LlmTimeout);
    assert_eq!(rig.requests(), 2);
}

#[tokio::test]
async fn previous_response_not_found_is_its_own_error() {
    let rig = rig().await;
    let e = rig.call(&next_turn("resp_unknown", "again", false)).await.unwrap_err();
    assert!(
        matches!(&e, LlmError::PreviousResponseNotFound { message } if message.contains("resp_unknown")),
        "{e:?}"
    );
    let first = rig.call(&first_turn("hi", false)).await.unwrap();
    rig.sim.forget_stored_responses();
    let e = rig.call(&next_turn(&first.response_id, "again", true)).await.unwrap_err();
    assert!(matches!(e, LlmError::PreviousResponseNotFound { .. }), "{e:?}");
    assert_eq!(rig.requests(), 3, "not retried");
}

#[tokio::test]
async fn request_timeout_then_retry_recovers_and_exhaustion_reports_timeout() {
    let rig = rig().await;
    rig.sim.faults().fail_next(Fault::Hang, 1);
    assert_eq!(rig.call(&first_turn("hi", false)).await.unwrap().attempts, 2);
    // A stream silent before its first event is retried too.
    rig.sim.faults().fail_next(Fault::StreamStall { after_events: 0 }, 1);
    let (r, _) = rig.stream(&first_turn("hi", true)).await;
    assert_eq!(r.unwrap().attempts, 2);

    let mut quick = settings(&rig.sim.base_url());
    quick.request_timeout_ms = 200;
    quick.max_retries = 1;
    let client = HttpLlmClient::new(&quick).unwrap();
    rig.sim.faults().fail_next(Fault::Hang, 2);
    let body = first_turn("hi", false);
    let e = client
        .create(LlmRequest {
            endpoint: &rig.endpoint,
            body: &RequestBody::new(&body),
            deltas: None,
            once: false,
        })
        .await
        .unwrap_err();
    assert!(matches!(e, LlmError::Timeout { attempts: 2, phase: TimeoutPhase::Request }), "{e:?}");
    assert_eq!(e.code(), ErrorCode::LlmTimeout);

    // A call under a money budget (`once`): the provider may have run, and billed, the attempt
    // that timed out, so it is not tried again inside the same reservation. A 429 still is.
    rig.sim.faults().fail_next(Fault::Hang, 1);
    let request = RequestBody::new(&body);
    let once = LlmRequest { endpoint: &rig.endpoint, body: &request, deltas: None, once: true };
    let e = client.create(once).await.unwrap_err();
    assert!(matches!(e, LlmError::Timeout { attempts: 1, phase: TimeoutPhase::Request }), "{e:?}");
    rig.sim.faults().fail_next(Fault::Status { status: 429 }, 1);
    let once = LlmRequest { endpoint: &rig.endpoint, body: &request, deltas: None, once: true };
    assert_eq!(client.create(once).await.unwrap().attempts, 2);
}

#[tokio::test]
async fn connect_timeout_and_refused_connections() {
    // A listener whose accept queue is full: further connection attempts get no answer.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_millis(100), tokio::net::TcpStream::connect(addr))
            .await
        {
            Ok(Ok(stream)) if fillers.len() < 64 => fillers.push(stream),
            _ => break,
        }
    }
    let mut quick = settings("http://unused");
    quick.connect_timeout_ms = 100;
    quick.max_retries = 1;
    let client = HttpLlmClient::new(&quick).unwrap();
    let endpoint = Endpoint::new(format!("http://{addr}/v1"), None);
    let body = first_turn("hi", false);
    let e = client
        .create(LlmRequest {
            endpoint: &endpoint,
            body: &RequestBody::new(&body),
            deltas: None,
            once: false,
        })
        .await
        .unwrap_err();
    assert!(matches!(e, LlmError::Timeout { attempts: 2, phase: TimeoutPhase::Connect }), "{e:?}");

    drop((listener, fillers));
    let e = client
        .create(LlmRequest {
            endpoint: &endpoint,
            body: &RequestBody::new(&body),
            deltas: None,
            once: false,
        })
        .await
        .unwrap_err();
    assert!(matches!(e, LlmError::Unavailable { attempts: 2, status: None, .. }), "{e:?}");
}

#[tokio::test]
async fn incomplete_refused_and_failed_responses() {
    let rig = rig().await;
    for stream in [false, true] {
        let r = rig.stream(&first_turn("@incomplete", stream)).await.0.unwrap();
        assert_eq!(r.status, ResponseStatus::Incomplete { reason: "max_output_tokens".into() });
        let Outcome::Final(f) = &r.outcome else { panic!("{r:?}") };
        assert_eq!(f.user_warnings[0].code, INCOMPLETE_WARNING_CODE);

        let e = rig.stream(&first_turn("@refuse", stream)).await.0.unwrap_err();
        assert!(
            matches!(&e, LlmError::Refused { refusal, .. } if refusal.contains("can't help")),
            "{e:?}"
        );
        assert_eq!(e.code(), ErrorCode::LlmRefused);
        assert!(e.raw_response().is_some());

        let e = rig.stream(&first_turn("@fail", stream)).await.0.unwrap_err();
        assert!(matches!(&e, LlmError::Failed { error, .. } if error.is("server_error")), "{e:?}");
        assert_eq!(e.code(), ErrorCode::LlmFailed);
    }
    let mut capped = first_turn("a long question", false);
    capped["max_output_tokens"] = json!(16);
    let r = rig.call(&capped).await.unwrap();
    assert!(matches!(r.status, ResponseStatus::Incomplete { .. }));
    assert!(r.usage.unwrap().output_tokens <= 16);
}

#[test]
fn endpoints_resolve_per_tenant_and_keep_query_strings() {
    let s = settings("https://api.example/v1/");
    let tenant: AgentContext = serde_json::from_value(json!({
        "llm_base_url": "https://tenant.example/openai/v1?api-version=preview",
        "llm_api_key": "sk-tenant",
        "collection": "c",
    }))
    .unwrap();
    let e = Endpoint::resolve(&s, Some(&tenant)).unwrap();
    assert_eq!(
        e.url("responses"),
        "https://tenant.example/openai/v1/responses?api-version=preview"
    );
    assert_eq!(e.api_key.as_ref().map(Secret::expose), Some("sk-tenant"));
    assert!(!format!("{e:?}").contains("sk-tenant"));
    assert_eq!(
        Endpoint::resolve(&s, None).unwrap().url("responses"),
        "https://api.example/v1/responses"
    );
}

/// Issue 17, point 5: a context with its own endpoint never receives the global key; a key file
/// is read at each call (replacing it rotates the key), and a missing one is an error that
/// names the path, not a call without a key.
#[test]
fn own_endpoints_never_get_the_global_key_and_key_files_rotate() {
    let mut s = settings("https://api.example/v1/");
    s.api_key = Some(Secret::new("sk-global"));
    let own: AgentContext = serde_json::from_value(json!({
        "llm_base_url": "https://tenant.example/v1", "collection": "c",
    }))
    .unwrap();
    assert_eq!(Endpoint::resolve(&s, Some(&own)).unwrap().api_key, None);
    let shared: AgentContext = serde_json::from_value(json!({"collection": "c"})).unwrap();
    let key = Endpoint::resolve(&s, Some(&shared)).unwrap().api_key;
    assert_eq!(key.as_ref().map(Secret::expose), Some("sk-global"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("key");
    std::fs::write(&file, "sk-one\n").unwrap();
    let from_file: AgentContext = serde_json::from_value(json!({
        "llm_base_url": "https://tenant.example/v1", "collection": "c",
        "llm_api_key_file": file,
    }))
    .unwrap();
    let key = |a: &AgentContext| Endpoint::resolve(&s, Some(a)).unwrap().api_key.unwrap();
    assert_eq!(key(&from_file).expose(), "sk-one");
    std::fs::write(&file, "sk-two").unwrap();
    assert_eq!(key(&from_file).expose(), "sk-two");
    std::fs::remove_file(&file).unwrap();
    let e = Endpoint::resolve(&s, Some(&from_file)).unwrap_err().to_string();
    assert!(e.contains(&file.display().to_string()) && !e.contains("sk-"), "{e}");
}
