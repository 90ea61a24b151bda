//! Batch reprocessing against the real PostgreSQL and RabbitMQ, with the Responses simulator:
//! real turns run through the pipeline, then are reprocessed into new linked records while the
//! originals, the live sessions and the reply queues stay untouched; runs resume without doing a
//! turn twice; overrides show in the stored requests; dry runs write nothing.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use aptix::config::Settings;
use aptix::llm::HttpLlmClient;
use aptix::reprocess::{Options, Report, Reprocessor, Selection};
use aptix::sim::Fault;
use common::{new_session, user_turn, Harness};
use indicatif::ProgressBar;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(60);

async fn one_final(h: &Harness, session: &str, request: Value) -> Value {
    h.submit(&request).await;
    let replies = h.replies(session, 1, WAIT).await;
    let last = replies.into_iter().rfind(|r| r.is_final).expect("a final reply");
    assert_eq!(last.body["Successful"], true, "{}", last.body);
    last.body
}

/// Two sessions: A with three turns (the third a client tool round trip), B with one.
async fn conversation(h: &Harness) -> (String, String) {
    let a = new_session();
    let mut t1 = user_turn(&a, "t1", "How is the invoice e-mail sent? send_invoice_email");
    t1["InputArtifacts"] = json!([{"RelativePath": "src/a.rs", "FileName": "a.rs", "Contents": "fn a() {}\n", "Origin": "ide"}]);
    one_final(h, &a, t1).await;
    one_final(h, &a, user_turn(&a, "t2", "And the tax? vat_for_line")).await;
    let r3 = one_final(h, &a, user_turn(&a, "t3", "Read the file @call(read_file)")).await;
    assert_eq!(r3["Result"]["Kind"], "client_tool_continuation", "{r3}");
    let call = r3["Result"]["ToolCalls"][0]["ToolCallId"].clone();
    let results = json!({"SessionId": a, "TurnId": "t3",
        "ToolResults": [{"ToolCallId": call, "ExecutionMs": 3, "ResultJson": "{\"contents\":\"hello\"}"}]});
    let r3b = one_final(h, &a, results).await;
    assert_eq!(r3b["Result"]["Kind"], "final", "{r3b}");
    let b = new_session();
    one_final(h, &b, user_turn(&b, "only", "Where is VAT computed?")).await;
    (a, b)
}

fn reprocessor(h: &Harness) -> Reprocessor {
    Reprocessor::new(h.deps.store.clone(), h.settings.clone(), h.deps.llm.clone())
}

fn options(selection: Selection, run: &str) -> Options {
    let mut o = Options::new(selection, run);
    o.rate = Some(50.0);
    o
}

async fn run(r: &Reprocessor, opts: &Options) -> Report {
    r.run(opts, &ProgressBar::hidden(), &CancellationToken::new()).await.expect("reprocess run")
}

async fn texts(h: &Harness, sql: &str) -> Vec<String> {
    sqlx::query_scalar(sql).fetch_all(h.deps.store.pool()).await.expect("query")
}

/// Originals, sessions and turns as text, to compare byte for byte, and the outbox's id sequence
/// (its rows are deleted once published, so only the sequence says whether any were added).
async fn live_snapshot(h: &Harness) -> Vec<(&'static str, Vec<String>)> {
    vec![
        (
            "originals",
            texts(
                h,
                "SELECT to_jsonb(r)::text FROM response_records r WHERE reprocess_of IS NULL ORDER BY id",
            )
            .await,
        ),
        ("sessions", texts(h, "SELECT to_jsonb(s)::text FROM sessions s ORDER BY id").await),
        ("turns", texts(h, "SELECT to_jsonb(t)::text FROM turns t ORDER BY session_id, seq").await),
        (
            "llm_results",
            texts(h, "SELECT to_jsonb(l)::text FROM llm_results l ORDER BY session_id, turn_id, step").await,
        ),
        ("outbox ids", texts(h, "SELECT last_value::text FROM outbox_id_seq").await),
    ]
}

async fn run_records(h: &Harness, run: &str) -> Vec<Value> {
    sqlx::query_scalar(
        "SELECT to_jsonb(n) || jsonb_build_object('original_step', o.step, 'original_turn', o.turn_id)
         FROM response_records n JOIN response_records o ON o.id = n.reprocess_of
         WHERE n.reprocess_run = $1 ORDER BY o.created_at, o.id",
    )
    .bind(run)
    .fetch_all(h.deps.store.pool())
    .await
    .expect("run records")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reprocessing_links_new_records_resumes_and_touches_nothing_live() {
    let h = Harness::start(1).await;
    let (a, b) = conversation(&h).await;
    let before = live_snapshot(&h).await;
    let calls_before = h.sim.requests().len();
    let r = reprocessor(&h);
    let everything = Selection { all: true, ..Selection::default() };

    // A dry run says what would run and writes nothing.
    let plan = r.dry_run(&options(everything.clone(), "r1")).await.unwrap();
    assert_eq!((plan.turns.len(), plan.would_run), (4, 4), "{plan}");
    assert!(plan.estimated_input_tokens > 0 && plan.original_input_tokens > 0, "{plan}");
    assert!(plan.to_string().contains("would run 4"), "{plan}");
    assert_eq!(h.sim.requests().len(), calls_before, "a dry run must not call the model");
    assert!(run_records(&h, "r1").await.is_empty());

    // Cancelled before it starts: nothing runs, everything is left for later.
    let cancelled = CancellationToken::new();
    cancelled.cancel();
    let stopped = r
        .run(&options(everything.clone(), "r1"), &ProgressBar::hidden(), &cancelled)
        .await
        .unwrap();
    assert_eq!((stopped.done, stopped.left, stopped.interrupted), (0, 4, true), "{stopped}");
    assert!(stopped.to_string().contains("(interrupted)"), "{stopped}");

    // Interrupted after two turns: two done, two left.
    let mut limited = options(everything.clone(), "r1");
    limited.limit = Some(2);
    let first = run(&r, &limited).await;
    assert_eq!((first.done, first.left, first.failed), (2, 2, 0), "{first}");
    assert_eq!(first.comparison.turns, 2, "{first}");

    // The same run again finishes the rest, each exactly once.
    let mut rest = options(everything.clone(), "r1");
    rest.concurrency = 3;
    let second = run(&r, &rest).await;
    assert_eq!(
        (second.done, second.already_done, second.failed, second.left),
        (2, 2, 0, 0),
        "{second}"
    );
    let records = run_records(&h, "r1").await;
    let originals =
        texts(&h, "SELECT id::text FROM response_records WHERE reprocess_of IS NULL").await;
    assert_eq!(
        records.len(),
        originals.len(),
        "one new record per original round trip: {records:#?}"
    );
    let mut linked: Vec<&str> =
        records.iter().map(|r| r["reprocess_of"].as_str().unwrap()).collect();
    linked.sort_unstable();
    linked.dedup();
    assert_eq!(linked.len(), originals.len());

    // A third run does nothing and calls nobody.
    let calls = h.sim.requests().len();
    let third = run(&r, &options(everything.clone(), "r1")).await;
    assert_eq!((third.done, third.already_done), (0, 4), "{third}");
    assert_eq!(h.sim.requests().len(), calls);
    assert_eq!(run_records(&h, "r1").await.len(), records.len());
    // The run again with another model is refused before anything runs: its records so far
    // were made with the turns' own, and a run mixing two would report neither.
    let mut other = options(everything.clone(), "r1");
    other.model = Some("gpt-5-mini".into());
    let refused = r.run(&other, &ProgressBar::hidden(), &CancellationToken::new()).await;
    let refused = refused.expect_err("a run resumed with another model").to_string();
    assert!(refused.starts_with("run `r1` was started with model None"), "{refused}");
    assert_eq!(h.sim.requests().len(), calls);

    // New records: self-contained requests, the tool round trip replayed on the new chain.
    for rec in &records {
        assert_eq!(rec["step"], rec["original_step"]);
        assert_eq!(rec["turn_id"], rec["original_turn"]);
        assert_eq!(rec["reprocess_run"], "r1");
        assert_eq!(rec["request_payload"]["stream"], false);
        if rec["step"] == 0 {
            assert!(
                rec["request_payload"].get("previous_response_id").is_none(),
                "{}",
                rec["request_payload"]
            );
            assert_eq!(rec["request_payload"]["input"][0]["role"], "system");
        }
    }
    let t3: Vec<&Value> = records.iter().filter(|r| r["turn_id"] == "t3").collect();
    assert_eq!(t3.len(), 2, "{t3:#?}");
    assert_eq!(t3[0]["kind"], "client_tool_continuation");
    assert_eq!(t3[1]["kind"], "final");
    assert_eq!(t3[1]["request_payload"]["previous_response_id"], t3[0]["provider_response_id"]);
    let new_call = &t3[0]["reply"]["Result"]["ToolCalls"][0]["ToolCallId"];
    assert_eq!(t3[1]["request_payload"]["input"][0]["call_id"], *new_call);
    assert!(t3[1]["reply"]["Result"]["PrimaryOutputText"].as_str().unwrap().contains("hello"));
    // t2 ran on a rehydrated chain that restores t1.
    let t2 = records.iter().find(|r| r["turn_id"] == "t2").unwrap();
    assert_eq!(t2["chain"]["status"], "rehydrated", "{}", t2["chain"]);
    assert!(t2["request_payload"].to_string().contains("send_invoice_email"));
    // t3's history is t1 and t2 (replayed once per session and run, then turn by turn).
    let t3_request = t3[0]["request_payload"].to_string();
    assert!(t3_request.contains("send_invoice_email") && t3_request.contains("vat_for_line"));

    // Compared with the originals: first turns and the tool call are identical, later turns differ.
    let c = &third.comparison;
    assert_eq!((c.turns, c.round_trips, c.round_trips_not_replayed), (4, 5, 0), "{third}");
    assert_eq!((c.identical, c.text_changed, c.kind_changed), (3, 2, 0), "{third}");
    // t2 now sees the earlier context restored, where the original relied on the chain.
    assert!(c.examples.iter().any(|d| d.turn_id == "t2" && d.what == "text"), "{third}");
    assert!(c.original_usage.total_tokens > 0 && c.new_usage.total_tokens > 0, "{third}");

    // Nothing live changed and nothing was published.
    for ((what, after), (_, was)) in live_snapshot(&h).await.iter().zip(&before) {
        assert_eq!(after, was, "{what} changed");
    }
    for s in [&a, &b] {
        let replies = h.replies(s, 1, Duration::from_secs(2)).await;
        assert!(replies.is_empty(), "reprocessing published to {s}: {replies:?}");
    }
    // The live pipeline still works on the same session afterwards, chained as before.
    let next = one_final(&h, &b, user_turn(&b, "later", "one more")).await;
    assert!(
        next["Result"]["PrimaryOutputText"].as_str().unwrap().contains("chain_depth: 2"),
        "{next}"
    );
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overrides_show_in_the_stored_requests_and_failures_are_retried() {
    let h = Harness::start_with(1, |s: &mut Settings| {
        let mut alt = s.conversation_contexts["default"].clone();
        alt.mode = "REVIEW".into();
        alt.mode_display_name = "Review".into();
        s.conversation_contexts.insert("alt".into(), alt);
    })
    .await;
    let (a, _b) = conversation(&h).await;
    let session_a = Selection { session: Some(a.parse().unwrap()), ..Selection::default() };
    let r = reprocessor(&h);

    let mut model = options(session_a.clone(), "model");
    model.model = Some("gpt-test-mini".into());
    let report = run(&r, &model).await;
    assert_eq!(report.done, 3, "{report}");
    let records = run_records(&h, "model").await;
    assert_eq!(records.len(), 4);
    assert!(records.iter().all(|r| r["request_payload"]["model"] == "gpt-test-mini"));
    assert!(records.iter().all(|r| r["session_id"] == a.as_str()));
    // The override is another version of the same context, and the records say so.
    let originals: Vec<Value> = sqlx::query_scalar(
        "SELECT context_versions FROM response_records WHERE session_id = $1::uuid
         AND reprocess_of IS NULL",
    )
    .bind(&a)
    .fetch_all(h.deps.store.pool())
    .await
    .unwrap();
    let (was, now) = (&originals[0]["ConversationContext"], &records[0]["context_versions"]);
    assert_eq!(now["ConversationContext"]["Id"], was["Id"], "{now} {was}");
    assert!(now["ConversationContext"]["Version"].is_string(), "{now}");
    assert_ne!(now["ConversationContext"]["Version"], was["Version"], "{now} {was}");
    assert_eq!(now["AgentContext"], originals[0]["AgentContext"]);

    let mut context = options(session_a.clone(), "context");
    context.conversation_context = Some("alt".into());
    run(&r, &context).await;
    let records = run_records(&h, "context").await;
    assert!(records[0]["request_payload"].to_string().contains("[MODE: REVIEW]"));
    assert_eq!(records[0]["reply"]["Result"]["ModeDisplayName"], "Review");
    let mut unknown = options(session_a.clone(), "x");
    unknown.conversation_context = Some("nope".into());
    assert!(r.run(&unknown, &ProgressBar::hidden(), &CancellationToken::new()).await.is_err());

    // The provider fails one turn: nothing is written for it, and the same run retries it.
    let mut settings: Settings = (*h.settings).clone();
    settings.llm.max_retries = 0;
    let llm = Arc::new(HttpLlmClient::new(&settings.llm).unwrap());
    let flaky = Reprocessor::new(h.deps.store.clone(), Arc::new(settings), llm);
    h.sim.faults().fail_next(Fault::ServerError, 1);
    let mut one_at_a_time = options(session_a.clone(), "flaky");
    one_at_a_time.concurrency = 1;
    let failed = run(&flaky, &one_at_a_time).await;
    assert_eq!((failed.done, failed.failed), (2, 1), "{failed}");
    assert_eq!(failed.problems[0].turn_id, "t1", "{failed}");
    assert!(failed.to_string().contains("--run flaky"), "{failed}");
    assert_eq!(run_records(&h, "flaky").await.len(), 3);
    let retried = run(&flaky, &one_at_a_time).await;
    assert_eq!((retried.done, retried.already_done, retried.failed), (1, 2, 0), "{retried}");
    assert_eq!(run_records(&h, "flaky").await.len(), 4);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_invocation_holds_a_run_and_turns_in_flight_wait_for_their_end() {
    let h = Harness::start(1).await;
    let a = new_session();
    one_final(&h, &a, user_turn(&a, "t1", "Where is VAT computed?")).await;
    // t2 waits for its client's tool results: a turn in flight, with one round trip so far.
    let r2 = one_final(&h, &a, user_turn(&a, "t2", "Read the file @call(read_file)")).await;
    assert_eq!(r2["Result"]["Kind"], "client_tool_continuation", "{r2}");
    let session = Selection { session: Some(a.parse().unwrap()), ..Selection::default() };
    let r = reprocessor(&h);
    let mut opts = options(session, "held");

    // While one invocation holds the run, another (even with another model, which the
    // first has not written a record with yet) is refused before it calls anything.
    let hold = aptix::reprocess::claim(&h.deps.store, &opts).await.expect("hold the run");
    let calls = h.sim.requests().len();
    let mut other = opts.clone();
    other.model = Some("gpt-test-mini".into());
    let refused = r.run(&other, &ProgressBar::hidden(), &CancellationToken::new()).await;
    assert!(
        matches!(&refused, Err(aptix::reprocess::ReprocessError::Held(run)) if run == "held"),
        "{refused:?}"
    );
    assert_eq!(h.sim.requests().len(), calls);
    hold.release().await;

    // The turn in flight is skipped, not replayed with the round trips it has so far.
    opts.concurrency = 1;
    let first = run(&r, &opts).await;
    assert_eq!((first.done, first.unavailable), (1, 1), "{first}");
    assert!(first.to_string().contains("still awaiting_tool_results"), "{first}");
    assert_eq!(run_records(&h, "held").await.len(), 1);
    // Once it has ended, the same run does it, and only it.
    let call = r2["Result"]["ToolCalls"][0]["ToolCallId"].clone();
    let results = json!({"SessionId": a, "TurnId": "t2",
        "ToolResults": [{"ToolCallId": call, "ExecutionMs": 3, "ResultJson": "{}"}]});
    one_final(&h, &a, results).await;
    let second = run(&r, &opts).await;
    assert_eq!((second.done, second.already_done, second.unavailable), (1, 1, 0), "{second}");
    assert_eq!(run_records(&h, "held").await.len(), 3);
    // --limit takes its places among turns it runs: a run with nothing left runs nothing.
    opts.limit = Some(1);
    let third = run(&r, &opts).await;
    assert_eq!((third.done, third.already_done, third.left), (0, 2, 0), "{third}");
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_command_line_dry_runs_runs_and_reports_as_json() {
    let h = Harness::start(1).await;
    let s = new_session();
    one_final(&h, &s, user_turn(&s, "t1", "hello")).await;
    one_final(&h, &s, user_turn(&s, "t2", "again")).await;
    let list = h.dir.join("turns.txt");
    std::fs::write(&list, format!("# one turn\n{s} t2\n")).unwrap();
    let aptix = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_aptix"))
            .arg("reprocess")
            .args(args)
            .env_remove("APTIX_CONFIG")
            .envs(h.child_env())
            .output()
            .expect("run aptix reprocess")
    };
    let list_arg = list.display().to_string();

    let dry = aptix(&["--turns", &list_arg, "--run", "cli", "--dry-run", "--json"]);
    assert!(dry.status.success(), "{}", String::from_utf8_lossy(&dry.stderr));
    let plan: Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert_eq!(plan["would_run"], 1, "{plan}");
    assert_eq!(plan["turns"][0]["turn_id"], "t2");

    let out = aptix(&["--turns", &list_arg, "--run", "cli", "--rate", "0", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["done"], 1, "{report}");
    assert_eq!(report["comparison"]["text_changed"], 1, "t2 ran on a rehydrated chain: {report}");

    let text = aptix(&["--session", &s, "--run", "cli"]);
    assert!(text.status.success(), "{}", String::from_utf8_lossy(&text.stderr));
    let shown = String::from_utf8_lossy(&text.stdout);
    assert!(shown.contains("1 done, 1 skipped (1 already done in this run"), "{shown}");
    assert_eq!(run_records(&h, "cli").await.len(), 2);

    let generated = aptix(&["--session", &s, "--dry-run"]);
    assert!(String::from_utf8_lossy(&generated.stdout).contains("dry run of reprocess run rp-"));
    let unselected = aptix(&["--run", "cli"]);
    assert_eq!(unselected.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unselected.stderr).contains("--all"));
    h.teardown().await;
}

/// A session's history is rebuilt a page at a time (`SAVED_PAGE` round trips): the last turn of
/// a session longer than a page, reprocessed alone, is sent with the history of the turns of
/// both pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_history_longer_than_a_page_is_rebuilt_whole() {
    let h = Harness::start(1).await;
    let s = new_session();
    for n in 1..=20 {
        one_final(&h, &s, user_turn(&s, &format!("t{n}"), &format!("question number {n} here")))
            .await;
    }
    let r = reprocessor(&h);
    let last = (aptix::contracts::SessionId::new(s.parse().unwrap()), "t20".parse().unwrap());
    let only = Selection { turns: Some(vec![last]), ..Selection::default() };
    let report = run(&r, &options(only, "long")).await;
    assert_eq!((report.done, report.failed), (1, 0), "{report}");
    let records = run_records(&h, "long").await;
    assert_eq!(records.len(), 1, "{records:#?}");
    let sent = records[0]["request_payload"].to_string();
    for n in [2, 16, 17, 19] {
        assert!(sent.contains(&format!("question number {n} here")), "turn {n} missing: {sent}");
    }
    h.teardown().await;
}

/// One turn whose stored rows cannot be read back (here a NUL in its saved round trip, which
/// the live path's `json` column kept and the reprocess read's `jsonb` refuses) is that turn's
/// problem: a dry run over every turn plans the others instead of stopping.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dry_run_plans_around_a_turn_it_cannot_read() {
    let h = Harness::start(1).await;
    let (_, b) = conversation(&h).await;
    sqlx::query(
        r#"UPDATE llm_results SET result = '{"job": {"note": "\u0000"}}'::json
           WHERE session_id = $1::uuid"#,
    )
    .bind(&b)
    .execute(h.deps.store.pool())
    .await
    .unwrap();
    let everything = Selection { all: true, ..Selection::default() };
    let plan = reprocessor(&h).dry_run(&options(everything, "nul")).await.expect("a plan");
    assert_eq!(plan.turns.len(), 4, "{plan}");
    let unreadable: Vec<_> =
        plan.turns.iter().filter(|t| t.status == "not reprocessable").collect();
    assert_eq!(unreadable.len(), 1, "{plan}");
    assert_eq!(unreadable[0].session_id, b);
    assert!(
        unreadable[0].reason.as_deref().is_some_and(|r| r.contains("cannot be read")),
        "{plan}"
    );
    h.teardown().await;
}
