//! OTLP export through the OpenTelemetry SDK: a turn through all five stages arrives at a
//! collector as one trace whose stage spans form a parent chain starting at the client's span,
//! with the LLM call as a GenAI client span under invoke. The collector is a local HTTP server
//! that decodes each request with the protobuf types generated from the official OTLP
//! definitions (`opentelemetry-proto`), as a real collector would. (Its own binary: the global
//! subscriber and the exporter are per process.)

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aptix::broker::OutMessage;
use common::{new_session, user_turn, Harness};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

/// What the collector was sent: each span with its resource's `service.name`.
type Received = Arc<Mutex<Vec<(String, Span)>>>;

/// Starts a collector on a free port; returns its traces endpoint and what it received.
async fn collector() -> (String, Received) {
    let got: Received = Arc::default();
    let sink = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let sink = sink.clone();
            async move {
                assert_eq!(headers["content-type"], "application/x-protobuf");
                let request = ExportTraceServiceRequest::decode(body).unwrap();
                let mut sink = sink.lock().unwrap();
                for rs in request.resource_spans {
                    let service =
                        rs.resource.as_ref().and_then(|r| text_of(&r.attributes, "service.name"));
                    for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                        sink.push((service.clone().unwrap_or_default(), span));
                    }
                }
                ""
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1/traces"), got)
}

type Attributes = [opentelemetry_proto::tonic::common::v1::KeyValue];

fn value_of<'a>(attrs: &'a Attributes, key: &str) -> Option<&'a Any> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn text_of(attrs: &Attributes, key: &str) -> Option<String> {
    match value_of(attrs, key)? {
        Any::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn int_of(attrs: &Attributes, key: &str) -> Option<i64> {
    match value_of(attrs, key)? {
        Any::IntValue(n) => Some(*n),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_turn_is_exported_as_one_trace_with_a_span_per_stage_and_a_genai_call() {
    let (endpoint, got) = collector().await;
    let export = aptix::otel::Export { endpoint, service: "aptix-test".into() };
    let format = aptix::telemetry::LogFormat::Pretty;
    aptix::telemetry::init_with(format, aptix::telemetry::DEFAULT_FILTER, Some(&export));
    assert!(aptix::otel::enabled());
    let h = Harness::start(1).await;
    let s = new_session();
    let (client_trace, client_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let body = serde_json::to_vec(&user_turn(&s, "t1", "traced")).unwrap();
    let msg = OutMessage::to_queue(h.topology.requests(), "request", "r1".into(), body)
        .header("traceparent", format!("00-{client_trace}-{client_span}-01"));
    h.topology.declare_session(h.publisher.channel(), &s.parse().unwrap()).await.unwrap();
    h.publisher.publish(&msg).await.unwrap();
    let reply = h.replies(&s, 1, Duration::from_secs(60)).await.pop().unwrap();
    // A client that decided not to sample: its decision holds in every process.
    let unsampled = "0af7651916cd43dd8448eb211c80319c";
    let body = serde_json::to_vec(&user_turn(&s, "t2", "not sampled")).unwrap();
    let msg = OutMessage::to_queue(h.topology.requests(), "request", "r2".into(), body)
        .header("traceparent", format!("00-{unsampled}-b7ad6b7169203331-00"));
    h.publisher.publish(&msg).await.unwrap();
    let quiet = h.replies(&s, 1, Duration::from_secs(60)).await.pop().unwrap();
    assert!(quiet.headers["traceparent"].ends_with("-00"), "{:?}", quiet.headers);
    // No traceparent at all: the turn's derived trace, under its derived start.
    h.submit(&user_turn(&s, "t3", "derived")).await;
    h.replies(&s, 1, Duration::from_secs(60)).await;
    h.teardown().await;
    aptix::otel::flush().await;

    let spans: Vec<(String, Span)> = got.lock().unwrap().clone();
    let in_trace: Vec<&Span> =
        spans.iter().map(|(_, s)| s).filter(|s| hex(&s.trace_id) == client_trace).collect();
    assert!(spans.iter().all(|(service, _)| service == "aptix-test"));
    let by_name: HashMap<&str, &Span> = in_trace.iter().map(|s| (s.name.as_str(), *s)).collect();

    let mut parent = client_span.to_owned();
    for stage in ["validate", "retrieve", "assemble", "invoke", "persist"] {
        let span = by_name
            .get(stage)
            .unwrap_or_else(|| panic!("no {stage} span; got {:?}", by_name.keys()));
        assert_eq!(hex(&span.parent_span_id), parent, "{stage}'s parent");
        assert_eq!(span.kind, SpanKind::Consumer as i32, "{stage}");
        assert_eq!(span.status.as_ref().unwrap().code, StatusCode::Ok as i32, "{stage}");
        assert!(span.end_time_unix_nano >= span.start_time_unix_nano);
        assert_eq!(text_of(&span.attributes, "aptix.turn_id").as_deref(), Some("t1"));
        assert_eq!(text_of(&span.attributes, "aptix.session_id").as_deref(), Some(s.as_str()));
        assert_eq!(text_of(&span.attributes, "aptix.outcome").as_deref(), Some("forwarded"));
        assert_eq!(text_of(&span.attributes, "messaging.system").as_deref(), Some("rabbitmq"));
        parent = hex(&span.span_id);
    }
    // The reply the client gets names persist's span as its parent.
    let tp = &reply.headers["traceparent"];
    assert_eq!(aptix::broker::trace::parse_span_id(tp), Some(parent.as_str()), "{tp}");

    // The LLM call: a client span under invoke, with the GenAI conventions' attributes.
    let invoke = hex(&by_name["invoke"].span_id);
    let calls: Vec<&&Span> = in_trace.iter().filter(|s| s.name.starts_with("chat ")).collect();
    assert_eq!(calls.len(), 1, "one LLM call in the turn: {:?}", by_name.keys());
    let call = calls[0];
    let a = &call.attributes;
    assert_eq!(hex(&call.parent_span_id), invoke);
    assert_eq!(call.kind, SpanKind::Client as i32);
    assert_eq!(text_of(a, "gen_ai.operation.name").as_deref(), Some("chat"));
    let model = text_of(a, "gen_ai.request.model").unwrap();
    assert_eq!(call.name, format!("chat {model}"));
    assert!(!model.is_empty());
    assert!(text_of(a, "gen_ai.response.id").unwrap().starts_with("resp"), "{a:?}");
    assert!(int_of(a, "gen_ai.usage.input_tokens").unwrap() > 0, "{a:?}");
    assert!(int_of(a, "gen_ai.usage.output_tokens").unwrap() > 0, "{a:?}");
    assert_eq!(text_of(a, "server.address").as_deref(), Some("127.0.0.1"));
    assert!(matches!(value_of(a, "gen_ai.response.finish_reasons"), Some(Any::ArrayValue(_))));
    assert_eq!(call.status.as_ref().unwrap().code, StatusCode::Ok as i32);
    assert!(
        spans.iter().all(|(_, s)| hex(&s.trace_id) != unsampled),
        "an unsampled turn was exported"
    );
    let derived = aptix::broker::trace::derived_trace_id(&s, "t3");
    let t3: Vec<&Span> =
        spans.iter().map(|(_, x)| x).filter(|x| hex(&x.trace_id) == derived).collect();
    let validate = t3.iter().find(|x| x.name == "validate").expect("t3's validate span");
    let start = aptix::broker::trace::derived_span_id(&s, "t3");
    assert_eq!(hex(&validate.parent_span_id), start);
    assert!(t3.len() >= 6, "five stages and the LLM call: {}", t3.len());
    // Every span of the turn is in the client's trace: none of its stages started another.
    let turn_spans = spans
        .iter()
        .filter(|(_, s)| text_of(&s.attributes, "aptix.turn_id").as_deref() == Some("t1"));
    assert!(turn_spans.clone().count() >= 5);
    assert!(turn_spans.into_iter().all(|(_, s)| hex(&s.trace_id) == client_trace));
}
