//! Server-executed tools (issue 19, point 2): the model calls `search_code` or `write_file`,
//! the pipeline runs them and calls the model again; the final response lists each execution
//! in `ToolResults` (and `write_file`'s file in `Files`, served by `GET /files/<sha256>`). A
//! step that also calls client tools returns exactly the client's calls; their results and the
//! server's go to the model together. Every round trip is its own record.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::{new_session, user_turn, Harness};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

const WAIT: Duration = Duration::from_secs(60);

fn kinds(records: &[Value]) -> Vec<&str> {
    records.iter().map(|r| r["kind"].as_str().unwrap()).collect()
}

/// The `function_call_output` items of the simulator's `n`th logged request.
fn outputs(h: &Harness, n: usize) -> Vec<Value> {
    let body = &h.sim.request_bodies()[n];
    let items = body["input"].as_array().unwrap();
    items.iter().filter(|i| i["type"] == "function_call_output").cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_model_searches_the_code_itself_then_answers() {
    let h = Harness::start(1).await;
    let s = new_session();
    let call = r#"@call(search_code, {"query":"send invoice email","path_prefix":"billing","language":null})"#;
    h.submit(&user_turn(&s, "t1", &format!("Where are invoices mailed? {call}"))).await;
    let replies = h.replies(&s, 1, WAIT).await;
    assert_eq!(replies.len(), 1, "one reply: the server round sends none {replies:?}");
    let result = &replies[0].body["Result"];
    assert_eq!(result["Kind"], "final", "{result}");
    assert_eq!(replies[0].headers["x-aptix-step"], "1");
    let executed = result["ToolResults"].as_array().unwrap();
    assert_eq!(executed.len(), 1);
    assert_eq!(executed[0]["Name"], "search_code");
    let found: Value = serde_json::from_str(executed[0]["ResultJson"].as_str().unwrap()).unwrap();
    let paths: Vec<&str> =
        found["Chunks"].as_array().unwrap().iter().map(|c| c["Path"].as_str().unwrap()).collect();
    assert!(paths.contains(&"billing/invoice.rs"), "{paths:?}");
    assert!(paths.iter().all(|p| p.starts_with("billing")), "path_prefix holds: {paths:?}");
    let chunk = &found["Chunks"][0];
    assert!(chunk["StartLine"].as_u64().unwrap() >= 1 && chunk["EndLine"].is_u64());

    // The model got the output, naming indexed paths, on its second call.
    assert_eq!(h.sim.request_bodies().len(), 2);
    let sent = outputs(&h, 1);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["call_id"], executed[0]["ToolCallId"]);
    assert!(sent[0]["output"].as_str().unwrap().contains("billing/invoice.rs"));
    let first = h.sim.request_bodies()[0].clone();
    let tools: Vec<&str> =
        first["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(tools, ["read_file", "run_tests", "search_code", "write_file"]);

    let records = h.records(&s).await;
    assert_eq!(kinds(&records), ["server_tool_calls", "final"], "a record per round trip");
    assert_eq!(records[0]["reply"]["ServerToolCalls"][0]["Name"], "search_code");
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_written_file_is_a_file_ref_whose_url_serves_the_hashed_bytes() {
    // Bound here and kept: a port chosen and released could be taken by another test's server.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let b = base.clone();
    let h = Harness::start_with(1, move |s| s.files.base_url = Some(b)).await;
    // Served alone, as with `files.listen`: what clients reach holds no metrics.
    let files = aptix::files::router(h.deps.store.clone(), h.deps.settings.pipeline.keys());
    tokio::spawn(aptix::files::serve_alone_on(listener, files, h.shutdown.clone()));
    let s = new_session();
    let content = "# Plan\n\n1. mail the invoice\n";
    let args = json!({"path": "notes/plan.md", "content": content, "mime_type": null});
    h.submit(&user_turn(&s, "t1", &format!("Write the plan @call(write_file, {args})"))).await;
    let replies = h.replies(&s, 1, WAIT).await;
    let result = &replies[0].body["Result"];
    assert_eq!(result["Kind"], "final", "{result}");
    let file = &result["Files"][0];
    assert_eq!(
        (file["Name"].as_str(), file["MimeType"].as_str()),
        (Some("plan.md"), Some("text/markdown"))
    );
    assert_eq!(file["SizeBytes"], content.len());
    assert!(file["ContentExpires"].as_str().unwrap().ends_with('Z'));
    assert!(
        !result["PrimaryOutputText"].as_str().unwrap().contains("mail the invoice"),
        "never embedded"
    );
    assert_eq!(result["ToolResults"][0]["Name"], "write_file");

    let url = file["Url"].as_str().unwrap();
    assert!(url.starts_with(&base), "{url}");
    let got = aptix::http::get(url).await.unwrap();
    assert_eq!(got.status(), 200);
    let bytes = got.bytes().await.unwrap();
    let hash = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    assert_eq!(hash, file["ContentHash"].as_str().unwrap());
    assert_eq!(&bytes[..], content.as_bytes());
    let metrics = aptix::http::get(format!("{base}/metrics")).await.unwrap();
    assert_eq!(metrics.status(), 404, "the files listener serves metrics");
    let missing = aptix::http::get(format!("{base}/files/{}", "0".repeat(64))).await.unwrap();
    assert_eq!(missing.status(), 404);
    // The URL is a capability: the bare hash, an altered owner, expiry or signature, and
    // another key's signature all get the same 404.
    let sha = hex::encode(Sha256::digest(&bytes));
    let (head, query) = url.split_once('?').unwrap();
    let params: std::collections::HashMap<&str, &str> =
        query.split('&').filter_map(|kv| kv.split_once('=')).collect();
    let (owner, expires, sig) = (params["owner"], params["expires"], params["sig"]);
    let later: i64 = expires.parse::<i64>().unwrap() + 3600;
    let other = aptix::config::MessageKeys::new(vec![b"someone else's key".to_vec()]).unwrap();
    let forged = aptix::config::file_url(&base, &other, owner, &sha, later);
    for bad in [
        format!("{base}/files/{sha}"),
        format!("{head}?owner=acme&expires={expires}&sig={sig}"),
        format!("{head}?owner={owner}&expires={later}&sig={sig}"),
        format!("{head}?owner={owner}&expires={expires}&sig={}", "0".repeat(64)),
        forged,
    ] {
        let got = aptix::http::get(&bad).await.unwrap();
        assert_eq!(got.status(), 404, "{bad}");
    }
    // The same bytes under another owner are another file: never served by this URL's
    // signature, and a URL signed for that owner finds nothing it did not write.
    let keys = h.deps.settings.pipeline.keys().unwrap();
    let theirs = aptix::config::file_url(&base, &keys, "acme", &sha, later);
    assert_eq!(aptix::http::get(&theirs).await.unwrap().status(), 404);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_step_with_both_kinds_returns_only_the_client_calls() {
    let h = Harness::start(1).await;
    let s = new_session();
    let search = r#"@call(search_code, {"query":"vat","path_prefix":null,"language":null})"#;
    h.submit(&user_turn(&s, "t1", &format!("Check @call(read_file) and {search}"))).await;
    let first = h.replies(&s, 1, WAIT).await;
    let calls = first[0].body["Result"]["ToolCalls"].as_array().unwrap().clone();
    let names: Vec<&str> = calls.iter().map(|c| c["Name"].as_str().unwrap()).collect();
    assert_eq!(names, ["read_file"], "exactly the client's calls");
    assert!(first[0].body["Result"].get("ToolResults").is_none());

    let results = json!({"SessionId": s, "TurnId": "t1", "ToolResults": [
        {"ToolCallId": calls[0]["ToolCallId"], "ExecutionMs": 4, "ResultJson": "{\"contents\":\"fn vat() {}\"}"}]});
    h.submit(&results).await;
    let last = h.replies(&s, 1, WAIT).await;
    let result = &last[0].body["Result"];
    assert_eq!(result["Kind"], "final", "{result}");
    let executed: Vec<&str> = result["ToolResults"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["Name"].as_str().unwrap())
        .collect();
    assert_eq!(executed, ["search_code"]);
    // Both outputs went to the model together, answering every call of its answer.
    let sent = outputs(&h, 1);
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert!(sent[0]["output"].as_str().unwrap().contains("fn vat"));
    assert!(sent[1]["output"].as_str().unwrap().contains("Chunks"));
    assert_eq!(kinds(&h.records(&s).await), ["client_tool_continuation", "final"]);
    h.teardown().await;
}

/// A written file is kept no longer than it is served: an hour after it expired it is deleted,
/// and a file still served (or expired less than an hour ago) stays.
#[tokio::test]
async fn expired_files_are_deleted_an_hour_after() {
    use crate::store_support::{drop_database, fresh_store};
    let (store, db) = fresh_store().await;
    let now = chrono::Utc::now();
    for (content, expires) in [
        (&b"long gone"[..], now - chrono::Duration::hours(2)),
        (b"just expired", now - chrono::Duration::minutes(5)),
        (b"still served", now + chrono::Duration::hours(1)),
    ] {
        store.put_file("acme", content, expires).await.unwrap();
    }
    assert_eq!(store.delete_expired_files(10).await.unwrap(), 1);
    assert_eq!(store.delete_expired_files(10).await.unwrap(), 0);
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM files").fetch_one(store.pool()).await.unwrap();
    assert_eq!(left, 2);
    drop_database(store, &db).await;
}
