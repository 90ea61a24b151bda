//! OTLP export: a turn through all five stages arrives at a collector as one trace whose stage
//! spans form a parent chain starting at the client's span. The collector is a local HTTP
//! server that keeps what it is sent. (Its own binary: the exporter is per process.)

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aptix::broker::OutMessage;
use common::{new_session, user_turn, Harness};
use serde_json::Value;

/// Starts a collector on a free port; returns its traces endpoint and what it received.
async fn collector() -> (String, Arc<Mutex<Vec<Value>>>) {
    let got: Arc<Mutex<Vec<Value>>> = Arc::default();
    let sink = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let sink = sink.clone();
            async move {
                sink.lock().unwrap().push(body);
                "{}"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1/traces"), got)
}

/// Every exported span, by stage name, for one trace.
fn spans_of(got: &Mutex<Vec<Value>>, trace: &str) -> HashMap<String, Value> {
    let mut out = HashMap::new();
    for body in got.lock().unwrap().iter() {
        for rs in body["resourceSpans"].as_array().unwrap() {
            assert_eq!(rs["resource"]["attributes"][0]["key"], "service.name");
            for ss in rs["scopeSpans"].as_array().unwrap() {
                for span in ss["spans"].as_array().unwrap() {
                    if span["traceId"] == trace {
                        out.insert(span["name"].as_str().unwrap().to_owned(), span.clone());
                    }
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_turn_is_exported_as_one_trace_with_a_span_per_stage() {
    let (endpoint, got) = collector().await;
    aptix::otlp::install(&endpoint, "aptix-test").unwrap();
    let h = Harness::start(1).await;
    let s = new_session();
    let (client_trace, client_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let body = serde_json::to_vec(&user_turn(&s, "t1", "traced")).unwrap();
    let msg = OutMessage::to_queue(h.topology.requests(), "request", "r1".into(), body)
        .header("traceparent", format!("00-{client_trace}-{client_span}-01"));
    h.topology.declare_session(h.publisher.channel(), &s.parse().unwrap()).await.unwrap();
    h.publisher.publish(&msg).await.unwrap();
    let reply = h.replies(&s, 1, Duration::from_secs(60)).await.pop().unwrap();
    h.teardown().await;
    aptix::otlp::flush().await;

    let spans = spans_of(&got, client_trace);
    let chain = ["validate", "retrieve", "assemble", "invoke", "persist"];
    let mut parent = client_span.to_owned();
    for stage in chain {
        let span =
            spans.get(stage).unwrap_or_else(|| panic!("no {stage} span; got {:?}", spans.keys()));
        assert_eq!(span["parentSpanId"], parent.as_str(), "{stage}'s parent");
        assert_eq!(span["kind"], 5);
        assert_eq!(span["status"]["code"], 1, "{span}");
        let start: u128 = span["startTimeUnixNano"].as_str().unwrap().parse().unwrap();
        let end: u128 = span["endTimeUnixNano"].as_str().unwrap().parse().unwrap();
        assert!(end >= start);
        let attrs: HashMap<&str, &str> = span["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| (a["key"].as_str().unwrap(), a["value"]["stringValue"].as_str().unwrap()))
            .collect();
        assert_eq!(attrs["aptix.turn_id"], "t1");
        assert_eq!(attrs["aptix.session_id"], s);
        assert_eq!(attrs["aptix.outcome"], "forwarded");
        parent = span["spanId"].as_str().unwrap().to_owned();
    }
    // The reply the client gets names persist's span as its parent.
    let tp = &reply.headers["traceparent"];
    assert_eq!(aptix::broker::trace::parse_span_id(tp), Some(parent.as_str()), "{tp}");
}
