//! The Responses API simulator on its own: validation with the API's 400 bodies, stored
//! responses and chaining, the SSE event sequence, the request log and counters, the control
//! routes, latency, and the `aptix sim` command.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use crate::sim_support;

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aptix::sim::{self, Control, Fault, Latency, SimConfig};
use serde_json::{json, Value};
use sim_support::{first_turn, next_turn, start_sim, tool_outputs, PNG_1X1};

async fn post(base: &str, body: &Value) -> (u16, Value) {
    let resp = aptix::http::client()
        .build()
        .unwrap()
        .post(format!("{base}/responses"))
        .json(body)
        .send()
        .await
        .expect("sent");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// `(param, code, message fragment)` of a 400 answer.
fn error_of(v: &Value) -> (Option<&str>, Option<&str>, &str) {
    let e = &v["error"];
    assert_eq!(e["type"], "invalid_request_error", "{v}");
    (e["param"].as_str(), e["code"].as_str(), e["message"].as_str().unwrap_or_default())
}

#[tokio::test]
async fn malformed_bodies_get_the_apis_400() {
    let sim = start_sim(None).await;
    let base = sim.base_url();
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut b = first_turn("hi", false);
        f(&mut b);
        b
    };
    let cases: Vec<(Value, &str, Option<&str>, &str)> = vec![
        (
            edit(&|b| b["input"][1]["content"][0]["type"] = json!("text")),
            "input[1].content[0].type",
            Some("invalid_value"),
            "Invalid value: 'text'",
        ),
        (
            edit(&|b| b["input"][1]["role"] = json!("tool")),
            "input[1].role",
            Some("invalid_value"),
            "Supported values are: 'assistant', 'system', 'developer', and 'user'",
        ),
        (
            edit(&|b| {
                b["input"][0] =
                    json!({"role":"assistant","content":[{"type":"input_text","text":"x"}]})
            }),
            "input[0].content[0]",
            Some("invalid_value"),
            "'output_text' and 'refusal'",
        ),
        (
            edit(&|b| {
                b["tools"][0] =
                    json!({"type":"function","function":{"name":"read_file","parameters":{}}})
            }),
            "tools[0].name",
            Some("missing_required_parameter"),
            "Missing required parameter",
        ),
        (
            edit(&|b| {
                b["tool_choice"] = json!({"type":"function","function":{"name":"read_file"}})
            }),
            "tool_choice.name",
            Some("missing_required_parameter"),
            "tool_choice.name",
        ),
        (
            edit(&|b| b["tool_choice"] = json!({"type":"tool","name":"read_file"})),
            "tool_choice.type",
            Some("invalid_value"),
            "Invalid value: 'tool'",
        ),
        (
            edit(&|b| b["tool_choice"] = json!({"type":"function","name":"nope"})),
            "tool_choice",
            None,
            "not found in 'tools'",
        ),
        (
            edit(&|b| {
                b["input"][1]["content"][1] =
                    json!({"type":"input_image","image_url":{"url":"data:image/png;base64,AAAA"}})
            }),
            "input[1].content[1].image_url",
            Some("invalid_type"),
            "expected an image URL, but got an object instead",
        ),
        (
            edit(&|b| {
                b["input"][1]["content"][1] =
                    json!({"type":"input_image","image_url":"data:image/png;base64,aGVsbG8="})
            }),
            "input[1].content[1].image_url",
            Some("invalid_value"),
            "does not represent a valid image",
        ),
        (
            edit(&|b| b["messages"] = json!([])),
            "messages",
            Some("unknown_parameter"),
            "Unknown parameter: 'messages'",
        ),
        (
            edit(&|b| {
                b.as_object_mut().unwrap().remove("model");
            }),
            "model",
            Some("missing_required_parameter"),
            "'model'",
        ),
        (
            edit(&|b| b["max_output_tokens"] = json!(5)),
            "max_output_tokens",
            Some("integer_below_min_value"),
            ">= 16",
        ),
        (
            edit(&|b| b["temperature"] = json!(3)),
            "temperature",
            Some("decimal_above_max_value"),
            "<= 2",
        ),
        (
            edit(&|b| {
                b["input"] =
                    json!([{"type":"function_call_output","call_id":"call_x","output":"1"}])
            }),
            "input",
            None,
            "No tool call found for function call output with call_id call_x",
        ),
        (
            edit(&|b| b["previous_response_id"] = json!("resp bad")),
            "previous_response_id",
            Some("invalid_value"),
            "additional characters",
        ),
    ];
    for (body, param, code, fragment) in cases {
        let (status, v) = post(&base, &body).await;
        assert_eq!(status, 400, "{body}\n{v}");
        let (p, c, message) = error_of(&v);
        assert_eq!((p, c), (Some(param), code), "{v}");
        assert!(message.contains(fragment), "{message}");
    }
    let resp = aptix::http::client()
        .build()
        .unwrap()
        .post(format!("{base}/responses"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);

    // Everything DESIGN.md §5 asks for is accepted: input_text, a data-URL image, flat tools,
    // a named tool_choice.
    let good = edit(&|b| {
        b["input"][1]["content"][1] = json!({"type":"input_image","image_url": format!("data:image/png;base64,{PNG_1X1}"),"detail":"auto"});
        b["tool_choice"] = json!({"type":"function","name":"read_file"});
    });
    let (status, v) = post(&base, &good).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["output"][0]["type"], "function_call", "a forced tool is called");
    assert_eq!(sim.stats().errors, 16);
}

#[tokio::test]
async fn stored_responses_chain_and_can_be_forgotten() {
    let sim = start_sim(None).await;
    let base = sim.base_url();
    let (_, r1) = post(&base, &first_turn("first", false)).await;
    let id1 = r1["id"].as_str().unwrap();
    let (status, r2) = post(&base, &next_turn(id1, "second", false)).await;
    assert_eq!(status, 200, "{r2}");
    let text = r2["output"][0]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("chain_depth: 2") && text.contains("system_messages_in_chain: 1"),
        "{text}"
    );
    assert_eq!(r2["previous_response_id"], id1);
    let context = r1["usage"]["input_tokens"].as_u64().unwrap()
        + r1["usage"]["output_tokens"].as_u64().unwrap();
    assert!(r2["usage"]["input_tokens"].as_u64().unwrap() > context, "the chain is billed again");
    assert_eq!(
        r2["usage"]["input_tokens_details"]["cached_tokens"], 0,
        "a prompt under 1,024 tokens is not cached"
    );

    let fetched: Value =
        aptix::http::get(format!("{base}/responses/{id1}")).await.unwrap().json().await.unwrap();
    assert_eq!(fetched, r1);
    assert_eq!(
        aptix::http::get(format!("{base}/responses/resp_nope")).await.unwrap().status().as_u16(),
        404
    );

    // A tool call must be answered before the chain goes on, and the answers are echoed.
    let (_, calls) = post(&base, &next_turn(r2["id"].as_str().unwrap(), "@call(*)", false)).await;
    let call_ids: Vec<&str> = calls["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(call_ids.len(), 2);
    let (status, v) =
        post(&base, &next_turn(calls["id"].as_str().unwrap(), "ignore the tools", false)).await;
    assert_eq!(status, 400);
    assert!(error_of(&v).2.starts_with("No tool output found for function call"), "{v}");
    let outputs = [(call_ids[0], "{\"ok\":true}"), (call_ids[1], "fn main() {}")];
    let (status, done) = post(&base, &tool_outputs(calls["id"].as_str().unwrap(), &outputs)).await;
    assert_eq!(status, 200, "{done}");
    let text = done["output"][0]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains(&format!("tool_output {}: {{\"ok\":true}}", call_ids[0]))
            && text.contains("chain_depth: 4"),
        "{text}"
    );

    // store:false is not kept; forgetting drops everything; both give the real 400.
    let mut unstored = first_turn("x", false);
    unstored["store"] = json!(false);
    let (_, r) = post(&base, &unstored).await;
    for gone in [r["id"].as_str().unwrap().to_owned(), {
        sim.forget_stored_responses();
        id1.to_owned()
    }] {
        let (status, v) = post(&base, &next_turn(&gone, "again", false)).await;
        assert_eq!(status, 400);
        assert_eq!(
            v,
            json!({"error":{"message": format!("Previous response with id '{gone}' not found."),
                "type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}})
        );
    }
}

/// The `(event line, data)` pairs of an SSE body.
fn sse_events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|frame| {
            let event = frame
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .expect("event line")
                .to_owned();
            let data = frame.lines().find_map(|l| l.strip_prefix("data: ")).expect("data line");
            (event, serde_json::from_str(data).expect("JSON data"))
        })
        .collect()
}

#[tokio::test]
async fn streams_follow_the_real_event_sequence() {
    let sim = start_sim(None).await;
    let mut body = first_turn("stream", true);
    body["reasoning"] = json!({"effort": "low"});
    let resp = aptix::http::client()
        .build()
        .unwrap()
        .post(format!("{}/responses", sim.base_url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let events = sse_events(&resp.text().await.unwrap());
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(
            (data["type"].as_str(), data["sequence_number"].as_u64()),
            (Some(name.as_str()), Some(i as u64))
        );
    }
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let deltas = names.iter().filter(|n| **n == "response.output_text.delta").count();
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done", // the reasoning item
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names, expected);
    assert!(deltas > 3);
    let (_, created) = &events[0];
    assert_eq!(
        (created["response"]["status"].as_str(), created["response"]["usage"].is_null()),
        (Some("in_progress"), true)
    );
    let (_, completed) = events.last().unwrap();
    let text: String = events.iter().filter_map(|(_, d)| d["delta"].as_str()).collect();
    assert_eq!(completed["response"]["output"][1]["content"][0]["text"], text);
    assert!(
        completed["response"]["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64()
            > Some(0)
    );

    let resp = aptix::http::client()
        .build()
        .unwrap()
        .post(format!("{}/responses", sim.base_url()))
        .json(&first_turn("@call(read_file)", true))
        .send()
        .await
        .unwrap();
    let events = sse_events(&resp.text().await.unwrap());
    let added = &events.iter().find(|(n, _)| n == "response.output_item.added").unwrap().1["item"];
    assert_eq!(
        (added["arguments"].as_str(), added["status"].as_str()),
        (Some(""), Some("in_progress"))
    );
    let args: String = events
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.delta")
        .inspect(|(_, d)| assert_eq!(d["item_id"], added["id"]))
        .filter_map(|(_, d)| d["delta"].as_str())
        .collect();
    assert_eq!(args, r#"{"path":"sample"}"#);
}

#[tokio::test]
async fn request_log_is_bounded_and_controls_work_over_http() {
    let config = SimConfig { log_capacity: 3, ..SimConfig::default() };
    let sim = sim::start(config).await.unwrap();
    let base = sim.base_url();
    for i in 0..5 {
        post(&base, &first_turn(&format!("turn {i}"), false)).await;
    }
    let logged = sim.requests();
    assert_eq!(logged.iter().map(|r| r.seq).collect::<Vec<_>>(), [2, 3, 4]);
    assert!(sim.request_bodies()[0]["input"][1]["content"][0]["text"]
        .as_str()
        .unwrap()
        .ends_with("turn 2"));

    let root = format!("http://{}", sim.addr());
    let http = aptix::http::client().build().unwrap();
    let command = Control::FailNext { fault: Fault::ServerError, count: 1 };
    assert_eq!(
        http.post(format!("{root}/_sim/control"))
            .json(&command)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        204
    );
    assert_eq!(post(&base, &first_turn("x", false)).await.0, 500);
    assert_eq!(post(&base, &first_turn("x", false)).await.0, 200);
    let bodies: Vec<Value> =
        http.get(format!("{root}/_sim/requests")).send().await.unwrap().json().await.unwrap();
    assert_eq!(bodies.len(), 3);
    let stats: Value =
        http.get(format!("{root}/_sim/stats")).send().await.unwrap().json().await.unwrap();
    assert_eq!(
        (stats["requests"].as_u64(), stats["faults"].as_u64(), stats["responses"].as_u64()),
        (Some(7), Some(1), Some(6))
    );

    // Random faults at probability 1 hit every request until disarmed.
    sim.control(Control::FailRandomly { fault: Fault::Status { status: 503 }, probability: 1.0 });
    assert_eq!(post(&base, &first_turn("x", false)).await.0, 503);
    sim.faults().clear();
    assert_eq!(post(&base, &first_turn("x", false)).await.0, 200);

    sim.set_latency(Latency { fixed_ms: 60, jitter_ms: 10, per_event_ms: 0 });
    let started = Instant::now();
    post(&base, &first_turn("slow", false)).await;
    assert!(started.elapsed() >= Duration::from_millis(60));
    sim.shutdown().await;
}

#[tokio::test]
async fn the_control_route_refuses_unknown_fields_and_values_with_a_named_400() {
    let sim = start_sim(None).await;
    let url = format!("http://{}/_sim/control", sim.addr());
    let http = aptix::http::client().build().unwrap();
    let cases = [
        (
            json!({"command":"fail_next","fault":{"kind":"server_error"},"count":1,"times":3}),
            "unknown field `times`",
        ),
        (
            json!({"command":"fail_next","fault":{"kind":"rate_limit","retry_after":5},"count":1}),
            "unknown field `retry_after`",
        ),
        (json!({"command":"clear_faults","now":true}), "unknown field `now`"),
        (
            json!({"command":"set_latency","latency":{"fixed_ms":5,"jitter":1}}),
            "unknown field `jitter`",
        ),
        (json!({"command":"fail_forever"}), "unknown variant `fail_forever`"),
        (json!({"fault":{"kind":"hang"},"count":1}), "missing field `command`"),
        (
            json!({"command":"fail_randomly","fault":{"kind":"hang"},"probability":1.5}),
            "between 0 and 1",
        ),
    ];
    for (body, expected) in cases {
        let resp = http.post(&url).json(&body).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{body}");
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(answer["error"]["code"], "invalid_control_command", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{body}: {message}");
    }
    let resp = http.post(&url).body("not json").send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    // Nothing was armed by the refused commands, and they are not counted as API errors.
    assert_eq!(sim.faults().queued(), 0);
    assert_eq!(post(&sim.base_url(), &first_turn("x", false)).await.0, 200);
    assert_eq!(sim.stats().errors, 0);
    let ok = json!({"command":"fail_next","fault":{"kind":"status","status":503},"count":1});
    assert_eq!(http.post(&url).json(&ok).send().await.unwrap().status().as_u16(), 204);
    assert_eq!(post(&sim.base_url(), &first_turn("x", false)).await.0, 503);
    sim.shutdown().await;
}

#[test]
fn the_sim_command_serves_until_stopped() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_aptix"))
        .args(["sim", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let base = line.trim().to_owned();
    assert!(base.starts_with("http://127.0.0.1:") && base.ends_with("/v1"), "{base}");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (status, v) = runtime.block_on(post(&base, &first_turn("hello", false)));
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "response");
}

/// The prompt cache as the provider's guide describes it: a chained call finds the prompt of the
/// call before it, in 128-token steps, once that prompt reaches 1,024 tokens.
#[tokio::test]
async fn a_long_chain_is_served_from_the_prompt_cache() {
    let sim = start_sim(None).await;
    let base = sim.base_url();
    let long = format!("first {}", "lorem ipsum dolor sit amet ".repeat(300));
    let mut first = first_turn(&long, false);
    first["prompt_cache_key"] = json!("aptix-test-session");
    let (status, r1) = post(&base, &first).await;
    assert_eq!(status, 200, "{r1}");
    assert_eq!(r1["usage"]["input_tokens_details"]["cached_tokens"], 0, "nothing held yet");
    let prompt = r1["usage"]["input_tokens"].as_u64().unwrap();
    assert!(prompt >= 1024, "{prompt}");
    let mut next = next_turn(r1["id"].as_str().unwrap(), "second", false);
    next["prompt_cache_key"] = json!("aptix-test-session");
    let (status, r2) = post(&base, &next).await;
    assert_eq!(status, 200, "{r2}");
    assert_eq!(r2["usage"]["input_tokens_details"]["cached_tokens"], prompt / 128 * 128);
    let stats = sim.stats();
    assert_eq!(stats.cached_tokens, prompt / 128 * 128);
    assert!(stats.input_tokens > prompt + stats.cached_tokens, "{stats:?}");
}
