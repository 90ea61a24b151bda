//! MCP servers as server tools (issue 44; docs/tools.md): a real MCP server built on the official
//! Python SDK (tests/mcp/server.py) counts every call it receives. The model calls its tools by
//! their function names (`tickets__open_ticket`), the pipeline runs them and lists them in
//! `ToolResults`; a server that hangs, one that fails and one that answers 10 MB each cost the
//! turn one error result and nothing else; a redelivered step does not run a completed call
//! again; and only the allowed tools are offered.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use aptix::config::McpServer;
use aptix::stage::Stage as _;
use common::{new_session, user_turn, Harness};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// The test MCP server, running until dropped.
pub struct ToolServer {
    child: Child,
    pub url: String,
    pub calls: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for ToolServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ToolServer {
    /// Starts tests/mcp/server.py on a free port (its environment is installed first if missing).
    pub fn start() -> ToolServer {
        let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp");
        // Once per test process (setup.sh also locks against other processes).
        static SETUP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let installed = *SETUP.get_or_init(|| {
            Command::new("bash").arg(here.join("setup.sh")).status().is_ok_and(|s| s.success())
        });
        assert!(installed, "tests/mcp/setup.sh failed");
        let dir = tempfile::tempdir().unwrap();
        let calls = dir.path().join("calls.jsonl");
        // The server picks its port and says which once it listens: a port picked here and
        // released could be taken by another test's server before this one binds it, and the
        // test would then talk to that one.
        let port_file = dir.path().join("port");
        let mut child = Command::new(here.join(".venv/bin/python"))
            .arg(here.join("server.py"))
            .arg("--port-file")
            .arg(&port_file)
            .arg("--calls")
            .arg(&calls)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        for _ in 0..400 {
            if let Some(port) =
                std::fs::read_to_string(&port_file).ok().and_then(|p| p.parse::<u16>().ok())
            {
                let url = format!("http://127.0.0.1:{port}/mcp");
                return ToolServer { child, url, calls, _dir: dir };
            }
            assert!(child.try_wait().unwrap().is_none(), "the MCP test server exited");
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the MCP test server did not start");
    }

    /// The calls it received, in order.
    pub fn calls(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.calls).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// Waits (up to a minute) until it received a call of `tool`.
    pub async fn wait_for(&self, tool: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while self.count(tool) == 0 {
            assert!(std::time::Instant::now() < deadline, "{tool} was never called");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How many calls of `tool` it received.
    pub fn count(&self, tool: &str) -> usize {
        self.calls().iter().filter(|c| c["tool"] == tool).count()
    }

    /// The server as a context lists it.
    pub fn config(&self, token_file: &Path) -> McpServer {
        toml::from_str(&format!(
            r#"name = "tickets"
               url = "{}"
               allowed_tools = ["open_ticket", "hang", "broken", "huge"]
               headers = {{ "X-Team" = "core" }}
               token_file = "{}"
               timeout_ms = 1500
               max_output_bytes = 65536"#,
            self.url,
            token_file.display()
        ))
        .unwrap()
    }
}

/// `aptix run` as its own process, with the harness's environment and the configuration file
/// `config`, so that a test can SIGKILL it.
pub fn worker(h: &Harness, config: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_aptix"))
        .arg("run")
        .envs(h.child_env())
        .env("APTIX_CONFIG", config)
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// A harness whose default context offers the test server's tools.
async fn harness(server: &ToolServer, dir: &Path) -> Harness {
    let token = dir.join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let config = server.config(&token);
    Harness::start_with(1, move |s| {
        let name = s.default_conversation_context.clone();
        s.conversation_contexts.get_mut(&name).unwrap().server_tools.mcp.push(config);
    })
    .await
}

fn executed(reply: &Value) -> Vec<Value> {
    reply["Result"]["ToolResults"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_model_calls_an_mcp_tool_and_the_pipeline_runs_it_once() {
    let server = ToolServer::start();
    let dir = tempfile::tempdir().unwrap();
    let h = harness(&server, dir.path()).await;
    let s = new_session();
    let call = r#"@call(tickets__open_ticket, {"title":"printer on fire"})"#;
    h.submit(&user_turn(&s, "t1", &format!("Open a ticket. {call}"))).await;
    let replies = h.replies(&s, 1, WAIT).await;
    let result = &replies[0].body["Result"];
    assert_eq!(result["Kind"], "final", "{result}");
    let done = executed(&replies[0].body);
    assert_eq!(done.len(), 1, "{result}");
    assert_eq!(done[0]["Name"], "tickets__open_ticket");
    let out = done[0]["ResultJson"].as_str().unwrap_or_else(|| panic!("{}", done[0]));
    let out: Value = serde_json::from_str(out).unwrap();
    assert_eq!(out["ticket"], 1);

    // The server saw one call: the arguments, the configured header and token, and an
    // idempotency key that names neither the session nor the turn.
    let calls = server.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["arguments"]["title"], "printer on fire");
    assert_eq!(calls[0]["team"], "core");
    assert_eq!(calls[0]["authorization"], "Bearer s3cret");
    let key = calls[0]["idempotency_key"].as_str().unwrap();
    assert_eq!(key.len(), 32);
    assert!(!key.contains(&s) && !key.contains("t1"));

    // Only the allowed tools are offered, under the server's name.
    let first = h.sim.request_bodies()[0].clone();
    let names: Vec<&str> =
        first["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"tickets__open_ticket") && names.contains(&"tickets__huge"));
    assert!(!names.iter().any(|n| n.contains("search_tickets")), "{names:?}");

    // The step again, as a redelivery brings it: the call is not run again, its recorded
    // result is used.
    let key = aptix::contracts::TurnKey {
        session_id: s.parse().unwrap(),
        turn_id: "t1".parse().unwrap(),
    };
    let row = h.deps.store.turn(&key).await.unwrap().unwrap();
    let mut job = row.start_job().unwrap();
    let again = aptix::contracts::ToolCall {
        tool_call_id: done[0]["ToolCallId"].as_str().unwrap().to_owned(),
        name: "tickets__open_ticket".into(),
        arguments_json: r#"{"title":"printer on fire"}"#.into(),
    };
    // The answer of round trip 0 made the call; round trip 1 ran it.
    job.step = 1;
    job.server_calls = vec![again];
    job.executed = Vec::new();
    job.continuation = None;
    let retrieve = aptix::stages::retrieve::Retrieve::new(&h.deps);
    retrieve.run(job).await.unwrap();
    assert_eq!(server.count("open_ticket"), 1, "a completed call ran again");
    let effects = h.deps.store.effects(key.session_id.as_uuid(), "t1").await.unwrap();
    assert_eq!(effects.len(), 1);
    assert_eq!(effects[0].1, 2, "the second attempt is counted");
    drop(retrieve);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hanging_a_failing_and_a_flooding_server_each_cost_one_error_result() {
    let server = ToolServer::start();
    let dir = tempfile::tempdir().unwrap();
    let h = harness(&server, dir.path()).await;
    let s = new_session();
    let calls = r#"@call(tickets__hang, {}) @call(tickets__broken, {}) @call(tickets__huge, {"megabytes":10})"#;
    h.submit(&user_turn(&s, "t1", &format!("Try them all. {calls}"))).await;
    let replies = h.replies(&s, 1, WAIT).await;
    let result = &replies[0].body["Result"];
    assert_eq!(result["Kind"], "final", "{result}");
    let done = executed(&replies[0].body);
    let error = |name: &str| {
        let r =
            done.iter().find(|r| r["Name"] == name).unwrap_or_else(|| panic!("{name}: {result}"));
        r["ErrorMessage"].as_str().unwrap_or_else(|| panic!("{name} has no error: {r}")).to_owned()
    };
    assert!(error("tickets__hang").contains("did not answer within 1500 ms"));
    assert!(error("tickets__hang").starts_with("outcome unknown"));
    assert!(error("tickets__broken").contains("read-only today"), "{}", error("tickets__broken"));
    // The transport refuses the answer past the cap (and drops the connection): the tool ran,
    // but its output never arrives.
    assert!(error("tickets__huge").starts_with("outcome unknown"), "{}", error("tickets__huge"));
    // Nothing of the 10 MB reached the model.
    let sent = h.sim.request_bodies().last().unwrap().to_string();
    assert!(sent.len() < 200_000, "{} bytes sent to the model", sent.len());

    // The server is still usable, by the next turn.
    let call = r#"@call(tickets__open_ticket, {"title":"after"})"#;
    h.submit(&user_turn(&s, "t2", call)).await;
    let replies = h.replies(&s, 1, WAIT).await;
    let last = replies.last().unwrap();
    assert_eq!(executed(&last.body)[0]["Name"], "tickets__open_ticket", "{}", last.body);
    assert!(executed(&last.body)[0]["ResultJson"].is_string(), "{}", last.body);
    assert_eq!(server.count("hang"), 1);
    h.teardown().await;
}

/// A worker SIGKILLed while an MCP tool call runs, then restarted: the redelivered step finds
/// the call recorded and not ended. A tool that is not idempotent does not run again (the
/// server counts one call) and the model is told its outcome is unknown; an idempotent one runs
/// again with the same idempotency key.
async fn killed_during_a_call(idempotent: bool) -> (Vec<Value>, Value) {
    let server = ToolServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("aptix.toml");
    let idempotent = if idempotent { r#"idempotent_tools = ["open_ticket"]"# } else { "" };
    std::fs::write(
        &config,
        format!(
            "[[conversation_contexts.default.server_tools.mcp]]\nname = \"tickets\"\nurl = \"{}\"\n\
             allowed_tools = [\"open_ticket\"]\n{idempotent}\ntimeout_ms = 8000\n",
            server.url
        ),
    )
    .unwrap();
    let h = Harness::start(0).await;
    let spawn = || worker(&h, &config);
    let mut worker = spawn();
    let s = new_session();
    let call = r#"@call(tickets__open_ticket, {"title":"once","delay_seconds":5})"#;
    h.submit(&user_turn(&s, "t1", call)).await;
    server.wait_for("open_ticket").await;
    worker.kill().unwrap(); // SIGKILL, while the tool runs
    worker.wait().unwrap();
    let mut worker = spawn();
    let replies = h.replies(&s, 1, Duration::from_secs(90)).await;
    assert_eq!(replies.len(), 1, "{replies:?}");
    let result = executed(&replies[0].body).first().cloned().unwrap_or(Value::Null);
    assert_eq!(h.records(&s).await.len(), 2, "two round trips, one record each");
    common::terminate(&mut worker);
    let calls = server.calls();
    h.teardown().await;
    (calls, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_cut_short_by_a_crash_is_not_run_again_and_its_outcome_is_unknown() {
    let (calls, result) = killed_during_a_call(false).await;
    assert_eq!(calls.len(), 1, "the ticket was opened twice: {calls:?}");
    let message = result["ErrorMessage"].as_str().unwrap_or_else(|| panic!("{result}"));
    assert!(message.starts_with("outcome unknown"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idempotent_call_cut_short_runs_again_with_the_same_key() {
    let (calls, result) = killed_during_a_call(true).await;
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0]["idempotency_key"], calls[1]["idempotency_key"]);
    assert!(result["ResultJson"].is_string(), "{result}");
}

/// A context that does not list the server offers none of its tools, so its turns (another
/// tenant's, another mode's) cannot reach it, whatever the instruction says.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_context_that_does_not_list_the_server_cannot_reach_it() {
    let server = ToolServer::start();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret").unwrap();
    let config = server.config(&token);
    let h = Harness::start_with(1, move |s| {
        let name = s.default_conversation_context.clone();
        let mut other = s.conversation_contexts[&name].clone();
        other.mode = "other".into();
        s.conversation_contexts.insert("other".into(), other);
        s.conversation_contexts.get_mut(&name).unwrap().server_tools.mcp.push(config);
    })
    .await;
    let s = new_session();
    let mut turn = user_turn(&s, "t1", r#"@call(tickets__open_ticket, {"title":"sneaky"})"#);
    turn["ConversationContextId"] = "other".into();
    h.submit(&turn).await;
    let replies = h.replies(&s, 1, WAIT).await;
    assert_eq!(replies[0].body["Result"]["Kind"], "final", "{}", replies[0].body);
    let tools = h.sim.request_bodies()[0]["tools"].to_string();
    assert!(!tools.contains("tickets__"), "the other context offered the server's tools: {tools}");
    assert!(server.calls().is_empty(), "{:?}", server.calls());
    h.teardown().await;
}

/// A `command` server (stdio, for local development) works the same: each worker starts its
/// own, it gets none of the worker's environment, and an answer line is bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stdio_server_is_started_by_the_worker_and_called() {
    let http = ToolServer::start(); // installs the environment; its own server is not used
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp");
    let calls = http.calls.with_file_name("stdio-calls.jsonl");
    let python = here.join(".venv/bin/python").display().to_string();
    let script = here.join("server.py").display().to_string();
    let config: McpServer = toml::from_str(&format!(
        r#"name = "local"
           command = ["{python}", "{script}", "--stdio", "--calls", "{}"]
           allowed_tools = ["open_ticket", "environment", "huge"]
           timeout_ms = 15000
           max_output_bytes = 65536"#,
        calls.display()
    ))
    .unwrap();
    let h = Harness::start_with(1, move |s| {
        let name = s.default_conversation_context.clone();
        s.conversation_contexts.get_mut(&name).unwrap().server_tools.mcp.push(config);
    })
    .await;
    let s = new_session();
    let instruction =
        r#"@call(local__open_ticket, {"title":"over stdio"}) @call(local__environment, {})"#;
    h.submit(&user_turn(&s, "t1", instruction)).await;
    let replies = h.replies(&s, 1, WAIT).await;
    let done = executed(&replies[0].body);
    assert_eq!(done.len(), 2, "{}", replies[0].body);
    let out = |i: usize| done[i]["ResultJson"].as_str().unwrap_or_else(|| panic!("{}", done[i]));
    assert!(out(0).contains("over stdio"), "{}", out(0));
    // Only what a program needs to start: none of the worker's own variables (cargo sets
    // CARGO_PKG_NAME for this test process, the workers' keys and URLs live beside it).
    let names: Vec<String> = serde_json::from_str(out(1)).unwrap();
    assert!(names.iter().any(|n| n == "PATH"), "{names:?}");
    assert!(!names.iter().any(|n| n == "CARGO_PKG_NAME" || n.starts_with("APTIX")), "{names:?}");
    let text = std::fs::read_to_string(&calls).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");

    // An answer line over the SDK's 16 MiB is dropped unread, not buffered (a smaller one is
    // read and clipped: "the tool ran, but …"); the call ends at its timeout and the server
    // serves the next call.
    let instruction =
        r#"@call(local__huge, {"megabytes":17}) @call(local__open_ticket, {"title":"next"})"#;
    h.submit(&user_turn(&s, "t2", instruction)).await;
    let replies = h.replies(&s, 1, WAIT).await;
    let done = executed(&replies.iter().rfind(|r| r.is_final).unwrap().body);
    let error = done[0]["ErrorMessage"].as_str().unwrap_or_else(|| panic!("{}", done[0]));
    assert!(error.starts_with("outcome unknown: the tool server did not answer"), "{error}");
    assert!(done[1]["ResultJson"].as_str().is_some_and(|o| o.contains("next")), "{}", done[1]);
    h.teardown().await;
}
