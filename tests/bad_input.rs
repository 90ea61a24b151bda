//! The bad-input corpus (`tests/corpus/bad/`, format in its README) driven through the real
//! pipeline: every malformed or hostile message gets its specific error reply on its session
//! queue, or a dead-letter entry naming the problem when it carries no usable `SessionId`; the
//! worker process survives; valid turns afterwards (including tool continuations of turns the
//! corpus tried to disturb) complete normally.
//!
//! Oversized messages are generated here instead of being committed. Everything is published at
//! once and collected afterwards, so the whole corpus takes seconds.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use aptix::contracts::SessionId;
use common::{new_session, terminate, user_turn, Harness};
use lapin::options::{BasicGetOptions, QueueDeleteOptions};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(90);

/// The worker process, killed if the test fails before stopping it (an orphan would keep the
/// test's output pipe open).
struct Worker(Option<std::process::Child>);

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Worker {
    fn alive(&mut self) -> bool {
        self.0.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }
}

/// What a message must lead to.
#[derive(Debug, Clone, PartialEq)]
enum Expected {
    /// An error reply on the session queue with exactly these codes, in order.
    Reply(Vec<String>),
    /// A dead-letter entry whose reason says there is no usable SessionId and names the code.
    Dead(String),
    /// A successful final reply (a control case: not bad after all).
    Ok,
}

/// One step of a case's set-up: a turn that must exist before the case is published.
#[derive(Debug, Clone)]
struct Setup {
    /// `await1` / `await2` (a turn left awaiting one or two tool results) or `done`.
    kind: String,
    session: String,
    turn: String,
}

#[derive(Debug, Clone)]
struct Case {
    name: String,
    body: Vec<u8>,
    setup: Vec<Setup>,
    expected: Expected,
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/bad")
}

fn parse_expected(s: &str) -> Expected {
    if s == "ok" {
        return Expected::Ok;
    }
    if let Some(code) = s.strip_prefix("dead:") {
        return Expected::Dead(code.to_owned());
    }
    let codes = s.strip_prefix("reply:").unwrap_or_else(|| panic!("bad expectation `{s}`"));
    let mut out = Vec::new();
    for item in codes.split(',') {
        match item.split_once('*') {
            Some((code, n)) => out.extend(std::iter::repeat_n(code.to_owned(), n.parse().unwrap())),
            None => out.push(item.to_owned()),
        }
    }
    Expected::Reply(out)
}

fn parse_setup(s: &str) -> Vec<Setup> {
    if s == "-" {
        return Vec::new();
    }
    s.split(';')
        .map(|step| {
            let parts: Vec<&str> = step.split(':').collect();
            assert_eq!(parts.len(), 3, "bad set-up step `{step}`");
            assert!(["await1", "await2", "done"].contains(&parts[0]), "bad set-up step `{step}`");
            Setup { kind: parts[0].into(), session: parts[1].into(), turn: parts[2].into() }
        })
        .collect()
}

/// The checked-in corpus, in manifest order.
fn checked_in() -> Vec<Case> {
    let dir = corpus_dir();
    let manifest = std::fs::read_to_string(dir.join("expected.tsv")).unwrap();
    let mut cases = Vec::new();
    for line in manifest.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        let cols: Vec<&str> = line.split('\t').collect();
        assert_eq!(cols.len(), 3, "manifest line `{line}`");
        let body = std::fs::read(dir.join(cols[0])).unwrap_or_else(|e| panic!("{}: {e}", cols[0]));
        cases.push(Case {
            name: cols[0].into(),
            body,
            setup: parse_setup(cols[1]),
            expected: parse_expected(cols[2]),
        });
    }
    // Every file in the directory is in the manifest, so nothing is silently skipped.
    let listed: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name != "expected.tsv" && name != "README.md" {
            assert!(listed.contains(&name.as_str()), "{name} is not in expected.tsv");
        }
    }
    cases
}

/// Oversized and amplifying messages, built at test time (megabytes are not committed).
fn generated() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut n = 0;
    let mut add = |name: &str, build: &dyn Fn(&str) -> Vec<u8>, expected: &str| {
        n += 1;
        let session = format!("b0000000-0000-4000-a000-{n:012}");
        cases.push(Case {
            name: format!("generated:{name}"),
            body: build(&session),
            setup: Vec::new(),
            expected: parse_expected(expected),
        });
    };
    let to = |v: Value| serde_json::to_vec(&v).unwrap();
    let mib = 1024 * 1024;
    let file = |path: &str, contents: String| json!({"RelativePath": path, "FileName": path, "Contents": contents, "Origin": "ide"});
    let png =
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    // Over limits.max_request_bytes (4 MiB); the broker's own limit (16 MiB) refuses bigger.
    add(
        "body-over-4-mib",
        &|s| to(json!({"SessionId": s, "TurnId": "t1", "Instruction": "x".repeat(4 * mib + 10)})),
        "reply:request.too_large",
    );
    add(
        "16-mib-of-junk-with-a-session",
        &|s| to(json!({"SessionId": s, "TurnId": "t1", "Junk": "j".repeat(16 * mib - 100)})),
        "reply:request.too_large",
    );
    add("garbage-over-4-mib", &|_| vec![b'A'; 4 * mib + 1], "dead:request.too_large");
    add(
        "280000-empty-artifacts",
        &|s| {
            let mut b =
                format!(r#"{{"SessionId":"{s}","TurnId":"t1","InputArtifacts":["#).into_bytes();
            b.extend_from_slice(&b"{},".repeat(280_000));
            b.pop();
            b.extend_from_slice(b"]}");
            b
        },
        "reply:validation.limit_exceeded",
    );
    add(
        "900000-rag-scope-values",
        &|s| {
            let values = vec!["v"; 900_000];
            to(
                json!({"SessionId": s, "TurnId": "t1", "Instruction": "x", "RagScope": [{"Key": "path", "Operator": "==", "Values": values}]}),
            )
        },
        "reply:validation.limit_exceeded",
    );
    add(
        "3-mb-image-id",
        &|s| {
            to(
                json!({"SessionId": s, "TurnId": "t1", "ClipboardImages": [{"Id": "i".repeat(3_000_000), "MimeType": "image/png", "DataBase64": png}]}),
            )
        },
        "reply:validation.limit_exceeded",
    );
    add(
        "instruction-200001-chars",
        &|s| to(json!({"SessionId": s, "TurnId": "t1", "Instruction": "é".repeat(200_001)})),
        "reply:validation.limit_exceeded",
    );
    add(
        "65-artifacts",
        &|s| {
            let files: Vec<Value> =
                (0..65).map(|i| file(&format!("f{i}.rs"), "fn f() {}".into())).collect();
            to(json!({"SessionId": s, "TurnId": "t1", "InputArtifacts": files}))
        },
        "reply:validation.limit_exceeded",
    );
    add(
        "artifact-over-2-mib",
        &|s| {
            to(
                json!({"SessionId": s, "TurnId": "t1", "InputArtifacts": [file("big.txt", "y".repeat(2 * mib + 1))]}),
            )
        },
        "reply:validation.limit_exceeded",
    );
    // Base64 of more than 3 MiB is more than 4 MiB: the request limit refuses it first.
    add(
        "base64-artifact-over-2-mib",
        &|s| {
            use base64::Engine as _;
            let data = base64::engine::general_purpose::STANDARD.encode(vec![0xffu8; 2 * mib + 3]);
            let mut f = file("big.bin", data);
            f["Encoding"] = json!("base64");
            to(json!({"SessionId": s, "TurnId": "t1", "InputArtifacts": [f]}))
        },
        "reply:validation.limit_exceeded",
    );
    add(
        "11-images",
        &|s| {
            let images: Vec<Value> = (0..11)
                .map(|i| json!({"Id": format!("i{i}"), "MimeType": "image/png", "DataBase64": png}))
                .collect();
            to(json!({"SessionId": s, "TurnId": "t1", "ClipboardImages": images}))
        },
        "reply:validation.limit_exceeded",
    );
    add(
        "image-over-2-mib",
        &|s| {
            use base64::Engine as _;
            let data = base64::engine::general_purpose::STANDARD.encode(vec![0u8; 2 * mib + 3]);
            to(
                json!({"SessionId": s, "TurnId": "t1", "ClipboardImages": [{"Id": "i", "MimeType": "image/png", "DataBase64": data}]}),
            )
        },
        "reply:validation.limit_exceeded",
    );
    add(
        "solution-context-50001-chars",
        &|s| {
            to(
                json!({"SessionId": s, "TurnId": "t1", "Instruction": "x", "SolutionContextText": "z".repeat(50_001)}),
            )
        },
        "reply:validation.limit_exceeded",
    );
    add(
        "65-tool-results",
        &|s| {
            let results: Vec<Value> = (0..65)
                .map(|i| json!({"ToolCallId": format!("call_{i}"), "ExecutionMs": 1, "ResultJson": "1"}))
                .collect();
            to(json!({"SessionId": s, "TurnId": "t1", "ToolResults": results}))
        },
        "reply:validation.limit_exceeded",
    );
    add(
        "tool-result-over-1-mib",
        &|s| {
            let big = serde_json::to_string(&"r".repeat(mib)).unwrap();
            to(
                json!({"SessionId": s, "TurnId": "t1", "ToolResults": [{"ToolCallId": "c", "ExecutionMs": 1, "ResultJson": big}]}),
            )
        },
        "reply:validation.limit_exceeded",
    );
    add(
        "2000-unknown-fields",
        &|s| {
            let mut m = serde_json::Map::new();
            m.insert("SessionId".into(), json!(s));
            m.insert("TurnId".into(), json!("t1"));
            m.insert("Instruction".into(), json!("x"));
            for i in 0..2000 {
                m.insert(format!("Junk{i}"), json!(i));
            }
            to(Value::Object(m))
        },
        "reply:request.unknown_field*20,request.too_many_errors",
    );
    add(
        "nesting-100000-deep",
        &|s| {
            let mut b = format!("{{\"SessionId\": \"{s}\", \"TurnId\": \"t1\", \"Instruction\": ")
                .into_bytes();
            b.extend(std::iter::repeat_n(b'[', 100_000));
            b.extend(std::iter::repeat_n(b']', 100_000));
            b.push(b'}');
            b
        },
        "reply:request.invalid_json",
    );
    cases
}

fn session_of(body: &[u8]) -> Option<SessionId> {
    aptix::rules::session_hint(body)
}

fn codes(reply: &Value) -> Vec<String> {
    reply["Errors"]
        .as_array()
        .map(|a| a.iter().map(|e| e["Code"].as_str().unwrap_or_default().to_owned()).collect())
        .unwrap_or_default()
}

fn call_ids(reply: &Value) -> Vec<String> {
    reply["Result"]["ToolCalls"]
        .as_array()
        .map(|a| {
            a.iter().map(|c| c["ToolCallId"].as_str().unwrap_or_default().to_owned()).collect()
        })
        .unwrap_or_default()
}

/// Creates the set-up turns (all at once), waits for them, and returns the tool call ids of
/// each `(session, turn)` left awaiting results.
async fn run_setups(h: &Harness, cases: &[Case]) -> HashMap<(String, String), Vec<String>> {
    let mut steps: Vec<Setup> = cases.iter().flat_map(|c| c.setup.clone()).collect();
    steps.dedup_by(|a, b| a.session == b.session && a.turn == b.turn);
    for s in &steps {
        let instruction = match s.kind.as_str() {
            "await1" => "read the file @call(read_file)",
            "await2" => "read the file and run the tests @call(read_file) @call(run_tests)",
            _ => "hello, a turn that completes",
        };
        h.submit(&user_turn(&s.session, &s.turn, instruction)).await;
    }
    let mut calls = HashMap::new();
    for s in &steps {
        let replies = h.replies(&s.session, 1, WAIT).await;
        let reply = &replies
            .iter()
            .find(|r| r.is_final)
            .unwrap_or_else(|| panic!("no set-up reply for {s:?}"))
            .body;
        assert_eq!(reply["Successful"], true, "set-up {s:?}: {reply}");
        let kind = reply["Result"]["Kind"].as_str().unwrap_or_default();
        if s.kind == "done" {
            assert_eq!(kind, "final", "set-up {s:?}: {reply}");
        } else {
            let ids = call_ids(reply);
            assert_eq!(kind, "client_tool_continuation", "set-up {s:?}: {reply}");
            assert_eq!(ids.len(), if s.kind == "await2" { 2 } else { 1 }, "set-up {s:?}: {reply}");
            calls.insert((s.session.clone(), s.turn.clone()), ids);
        }
    }
    calls
}

/// `{{CALL_n}}` becomes the n-th tool call id of the case's first awaiting set-up turn.
fn with_calls(case: &Case, calls: &HashMap<(String, String), Vec<String>>) -> Vec<u8> {
    let Some(first) = case.setup.iter().find(|s| s.kind.starts_with("await")) else {
        return case.body.clone();
    };
    let ids = &calls[&(first.session.clone(), first.turn.clone())];
    let mut text = String::from_utf8(case.body.clone()).expect("a case with placeholders is UTF-8");
    for (i, id) in ids.iter().enumerate() {
        text = text.replace(&format!("{{{{CALL_{i}}}}}"), id);
    }
    text.into_bytes()
}

/// Every dead letter that arrives within `limit`, until `want` are in.
async fn collect_dead(
    h: &Harness,
    want: usize,
    limit: Duration,
) -> Vec<(HashMap<String, String>, Vec<u8>)> {
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    while out.len() < want && Instant::now() < deadline {
        out.extend(h.dead_letters().await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    out
}

/// Final replies still in a session queue (nothing should be left once collected).
async fn leftover(h: &Harness, session: &str) -> Vec<Value> {
    let ch = h.conn.create_channel().await.unwrap();
    let queue = format!("{}.session.{session}", h.topology.prefix());
    let mut out = Vec::new();
    while let Ok(Some(m)) =
        ch.basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true }).await
    {
        out.push(serde_json::from_slice(&m.delivery.data).unwrap_or(Value::Null));
    }
    let _ = ch.close(200, "done".into()).await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_corpus_gets_specific_errors_and_spares_valid_turns() {
    let files = checked_in();
    assert!(files.len() >= 100, "the corpus has only {} files", files.len());
    let mut cases = files;
    cases.extend(generated());
    let h = Harness::start(0).await;
    let mut worker = Worker(Some(h.spawn_child(&["run"])));
    let started = Instant::now();

    let calls = run_setups(&h, &cases).await;

    // Publish everything, then collect.
    let mut sessions: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, case) in cases.iter().enumerate() {
        let body = with_calls(case, &calls);
        let session = session_of(&body);
        match (&case.expected, &session) {
            (Expected::Dead(_), Some(s)) => {
                panic!("{}: expected a dead letter but it names session {s}", case.name)
            }
            (Expected::Reply(_) | Expected::Ok, None) => {
                panic!("{}: expected a reply but it names no usable session", case.name)
            }
            _ => {}
        }
        if let Some(s) = session {
            h.topology.declare_client_queue(h.publisher.channel(), &s).await.unwrap();
            h.sessions.lock().unwrap().insert(s);
            sessions.entry(s.to_string()).or_default().push(i);
        }
        let key = session.map_or_else(|| "-".to_owned(), |s| s.to_string());
        let msg = h.topology.request(&key, format!("corpus:{}", case.name), body);
        h.publisher.publish(&msg).await.unwrap();
    }

    let mut failures = Vec::new();
    for (session, idx) in &sessions {
        let replies = h.replies(session, idx.len(), WAIT).await;
        let finals: Vec<&Value> = replies.iter().filter(|r| r.is_final).map(|r| &r.body).collect();
        let mut want: Vec<&Case> = idx.iter().map(|&i| &cases[i]).collect();
        if finals.len() != want.len() {
            failures.push(format!(
                "session {session}: {} final replies for {:?}",
                finals.len(),
                want.iter().map(|c| &c.name).collect::<Vec<_>>()
            ));
            continue;
        }
        for reply in finals {
            let got = codes(reply);
            let pos = want.iter().position(|c| match &c.expected {
                Expected::Reply(codes) => reply["Successful"] == false && &got == codes,
                Expected::Ok => reply["Successful"] == true,
                Expected::Dead(_) => false,
            });
            match pos {
                Some(p) => {
                    want.remove(p);
                }
                None => failures.push(format!(
                    "{}: expected {:?}, got {got:?}: {reply}",
                    want.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(" / "),
                    want.iter().map(|c| &c.expected).collect::<Vec<_>>()
                )),
            }
        }
    }

    let dead_cases: Vec<&Case> =
        cases.iter().filter(|c| matches!(c.expected, Expected::Dead(_))).collect();
    let dead = collect_dead(&h, dead_cases.len(), WAIT).await;
    // A body that names no session is kept to its first 64 KiB, with its size in a header.
    const KEPT: usize = 64 * 1024;
    let mut by_body: HashMap<&[u8], &Case> =
        dead_cases.iter().map(|c| (&c.body[..c.body.len().min(KEPT)], *c)).collect();
    assert_eq!(by_body.len(), dead_cases.len(), "two dead-letter cases have the same body");
    for (headers, body) in &dead {
        let reason = headers.get("x-aptix-reason").cloned().unwrap_or_default();
        match by_body.remove(body.as_slice()) {
            Some(case) => {
                let size = headers.get("x-aptix-body-bytes").map(|s| s.parse::<usize>().unwrap());
                let expected = (case.body.len() > KEPT).then_some(case.body.len());
                if size != expected {
                    failures.push(format!("{}: body size header {size:?}", case.name));
                }
                let Expected::Dead(code) = &case.expected else { unreachable!() };
                if !(reason.contains("no usable SessionId") && reason.contains(code.as_str())) {
                    failures.push(format!(
                        "{}: dead-letter reason `{reason}` does not name {code}",
                        case.name
                    ));
                }
                if headers.get("x-aptix-stage").map(String::as_str) != Some("validate") {
                    failures.push(format!(
                        "{}: dead-lettered by {:?}",
                        case.name,
                        headers.get("x-aptix-stage")
                    ));
                }
            }
            None => failures.push(format!(
                "unexpected dead letter ({reason}): {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            )),
        }
    }
    for case in by_body.values() {
        failures.push(format!("{}: no dead letter", case.name));
    }

    // Nothing else arrives for any corpus session.
    for session in sessions.keys() {
        let extra = leftover(&h, session).await;
        if !extra.is_empty() {
            failures.push(format!("session {session}: {} extra messages: {extra:?}", extra.len()));
        }
    }
    let elapsed = started.elapsed();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );

    // The worker survived all of it, and valid turns are unaffected.
    assert!(worker.alive(), "the worker process died");
    let s = new_session();
    h.submit(&user_turn(&s, "after", "a valid turn after the corpus")).await;
    let reply = h.replies(&s, 1, WAIT).await.pop().expect("a reply to the valid turn").body;
    assert_eq!(reply["Successful"], true, "{reply}");
    assert_eq!(reply["Result"]["Kind"], "final", "{reply}");
    // Turns the corpus left waiting for tool results (or tried to hijack from another session)
    // still accept their correct results.
    let waiting: Vec<(uuid::Uuid, String, Value)> = sqlx::query_as(
        "SELECT session_id, turn_id, pending_tool_calls FROM turns WHERE state = 'awaiting_tool_results'",
    )
    .fetch_all(h.deps.store.pool())
    .await
    .unwrap();
    assert!(!waiting.is_empty(), "the corpus should leave some turns awaiting tool results");
    for (session, turn, pending) in &waiting {
        let results: Vec<Value> = pending
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let id = c
                    .get("ToolCallId")
                    .or_else(|| c.get("tool_call_id"))
                    .and_then(Value::as_str)
                    .unwrap();
                json!({"ToolCallId": id, "ExecutionMs": 3, "ResultJson": "{\"contents\":\"ok\"}"})
            })
            .collect();
        h.submit(&json!({"SessionId": session, "TurnId": turn, "ToolResults": results})).await;
    }
    for (session, turn, _) in &waiting {
        let reply = h
            .replies(&session.to_string(), 1, WAIT)
            .await
            .pop()
            .expect("a continuation reply")
            .body;
        assert_eq!(reply["Successful"], true, "{session}/{turn}: {reply}");
        assert_eq!(reply["Result"]["Kind"], "final", "{session}/{turn}: {reply}");
    }
    assert!(worker.alive(), "the worker process died");
    eprintln!(
        "bad-input corpus: {} cases ({} files, {} generated), {} replies, {} dead letters, collected in {:.1} s",
        cases.len(),
        cases.iter().filter(|c| !c.name.starts_with("generated:")).count(),
        cases.iter().filter(|c| c.name.starts_with("generated:")).count(),
        cases.len() - dead_cases.len(),
        dead_cases.len(),
        elapsed.as_secs_f64()
    );

    let status = terminate(worker.0.as_mut().unwrap());
    assert!(status.success(), "the worker did not stop cleanly: {status:?}");
    let ch = h.conn.create_channel().await.unwrap();
    let mut all: Vec<String> = sessions.keys().cloned().collect();
    all.push(s);
    all.extend(cases.iter().flat_map(|c| c.setup.iter().map(|x| x.session.clone())));
    for session in all {
        let q = format!("{}.session.{session}", h.topology.prefix());
        let _ = ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default()).await;
    }
    h.teardown().await;
}
