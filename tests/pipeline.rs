//! The pipeline end to end against the real RabbitMQ and PostgreSQL, with the Responses
//! simulator: multi-turn chains, tool round trips, file deltas, rehydration, duplicates,
//! redeliveries, per-session order with two copies of every stage, and bad input.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use aptix::broker::{process_one, OutMessage, StageName};
use common::{new_session, user_turn, Harness};
use lapin::options::BasicGetOptions;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);

/// The `Id:` of every chunk a `/responses` body sends.
fn chunk_ids(body: &Value) -> std::collections::BTreeSet<String> {
    let input = body["input"].to_string();
    input.split("Id: ").skip(1).filter_map(|s| s.split('\\').next()).map(str::to_owned).collect()
}

fn text(reply: &Value) -> String {
    reply["Result"]["PrimaryOutputText"].as_str().unwrap_or_default().to_owned()
}

fn file(path: &str, contents: &str) -> Value {
    json!({"RelativePath": path, "FileName": path.rsplit('/').next().unwrap(), "Contents": contents, "Origin": "ide"})
}

async fn one_final(h: &Harness, session: &str, request: Value) -> Value {
    let turn = request["TurnId"].as_str().unwrap().to_owned();
    h.submit(&request).await;
    let replies = h.replies(session, 1, WAIT).await;
    let finals: Vec<_> = replies.iter().filter(|r| r.is_final).collect();
    assert_eq!(finals.len(), 1, "{turn}: {replies:?}");
    assert_eq!(finals[0].turn_id, turn);
    finals[0].body.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multi_turn_conversation_end_to_end() {
    let h = Harness::start(1).await;
    let s = new_session();

    // First turn: system prompt, retrieved context, an active file.
    let mut t1 = user_turn(&s, "t1", "How is the invoice e-mail sent? send_invoice_email");
    t1["InputArtifacts"] = json!([file("src/a.rs", "fn a() { 1 }\n")]);
    let r1 = one_final(&h, &s, t1).await;
    assert_eq!(r1["Successful"], true, "{r1}");
    assert_eq!(r1["Result"]["Kind"], "final");
    assert_eq!(r1["Result"]["ModeDisplayName"], "General");
    assert!(text(&r1).contains("chain_depth: 1"), "{}", text(&r1));
    assert!(text(&r1).contains("system_messages_in_chain: 1"));
    assert!(!text(&r1).contains("context_chunks: 0"), "retrieval found nothing: {}", text(&r1));
    let bodies = h.sim.request_bodies();
    assert_eq!(bodies[0]["input"][0]["role"], "system");
    assert!(bodies[0].get("previous_response_id").is_none());

    // Follow-up: chained, no system message, unchanged file not resent, new file sent.
    let mut t2 = user_turn(&s, "t2", "And the tax?");
    t2["InputArtifacts"] =
        json!([file("src/a.rs", "fn a() { 1 }\n"), file("src/b.rs", "fn b() {}\n")]);
    let r2 = one_final(&h, &s, t2).await;
    assert!(text(&r2).contains("chain_depth: 2"), "{}", text(&r2));
    let body2 = h.sim.request_bodies()[1].clone();
    let prev = body2["previous_response_id"].as_str().expect("chained");
    assert!(body2["input"].as_array().unwrap().iter().all(|m| m["role"] != "system"));
    let sent2 = body2["input"].to_string();
    assert!(sent2.contains("fn b() {}") && !sent2.contains("fn a() { 1 }"), "{sent2}");
    let records = h.records(&s).await;
    assert_eq!(records[0]["provider_response_id"], prev);

    // A changed file is resent.
    let mut t3 = user_turn(&s, "t3", "I changed a.rs");
    t3["InputArtifacts"] = json!([file("src/a.rs", "fn a() { 2 }\n")]);
    one_final(&h, &s, t3).await;
    assert!(h.sim.request_bodies()[2]["input"].to_string().contains("fn a() { 2 }"));

    // A client tool round trip; a new turn meanwhile is refused.
    let mut t4 = user_turn(&s, "t4", "Read the file @call(read_file)");
    t4["InputArtifacts"] = json!([file("big/huge.rs", &"x".repeat(150 * 1024))]);
    h.submit(&t4).await;
    let r4 = h.replies(&s, 1, WAIT).await.pop().unwrap().body;
    assert_eq!(r4["Result"]["Kind"], "client_tool_continuation", "{r4}");
    let call = &r4["Result"]["ToolCalls"][0];
    assert_eq!(call["Name"], "read_file");
    let r5 = one_final(&h, &s, user_turn(&s, "t5", "impatient")).await;
    assert_eq!(r5["Errors"][0]["Code"], "session.awaiting_tool_results");
    let results = json!({"SessionId": s, "TurnId": "t4",
        "ToolResults": [{"ToolCallId": call["ToolCallId"], "ExecutionMs": 7, "ResultJson": "{\"contents\":\"hello\"}"}]});
    let r4b = one_final(&h, &s, results).await;
    assert_eq!(r4b["Result"]["Kind"], "final", "{r4b}");
    assert!(text(&r4b).contains("tool_output"), "{}", text(&r4b));
    // The first round trip skipped a file; its warning reaches the turn's final response.
    assert_eq!(r4b["Result"]["UserWarnings"][0]["Code"], "files.skipped_too_large", "{r4b}");

    // The provider forgets the chain: the next turn rebuilds it from stored history.
    h.sim.forget_stored_responses();
    let r6 = one_final(
        &h,
        &s,
        user_turn(&s, "t6", "Summarise what we did to send_invoice_email and vat_for_line"),
    )
    .await;
    assert_eq!(r6["Successful"], true, "{r6}");
    let bodies = h.sim.request_bodies();
    let (lost, last) = (&bodies[bodies.len() - 2], bodies.last().unwrap());
    assert!(
        lost.get("previous_response_id").is_some() && last.get("previous_response_id").is_none()
    );
    assert_eq!(last["input"][0]["role"], "system");
    let records = h.records(&s).await;
    // The rebuilt request still sends the chunks retrieved for the turn as this turn's
    // retrieval, not as restored history: they no longer travel in the invoke message but come
    // from what the assembled request kept (here all were held by the lost chain already).
    let retrieved: std::collections::BTreeSet<String> = records[5]["retrieved_chunks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c.get("rehydrated").is_none())
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(!retrieved.is_empty(), "{}", records[5]["retrieved_chunks"]);
    assert!(chunk_ids(lost).is_empty(), "the lost chain held them: {lost}");
    assert!(retrieved.is_subset(&chunk_ids(last)), "{retrieved:?} not all in {last}");
    let kinds: Vec<&str> = records.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["final", "final", "final", "client_tool_continuation", "final", "final"]);
    assert_eq!(records[5]["chain"]["status"], "rehydrated", "{}", records[5]["chain"]);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_get_the_stored_reply_and_conflicts_are_refused() {
    let h = Harness::start(1).await;
    let s = new_session();
    let first = one_final(&h, &s, user_turn(&s, "t1", "hello")).await;
    let again = one_final(&h, &s, user_turn(&s, "t1", "hello")).await;
    assert_eq!(first, again);
    assert_eq!(h.sim.requests().len(), 1, "a duplicate must not call the LLM");
    assert_eq!(h.records(&s).await.len(), 1);
    // The duplicate's copy is kept by reference to the turn's record (a tenant's duplicates of a
    // long answer must not store it once each), and `aptix session show` gives it as sent.
    let sid: aptix::contracts::SessionId = s.parse().unwrap();
    let kept: Vec<(Option<Value>, bool)> =
        sqlx::query_as("SELECT body, resent FROM replies WHERE session_id = $1")
            .bind(sid.as_uuid())
            .fetch_all(h.deps.store.pool())
            .await
            .unwrap();
    assert_eq!(kept, [(None, true)]);
    let shown = h.deps.store.session_view(&sid).await.unwrap().unwrap().replies;
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0]["body"], again);
    assert!(shown[0]["message_id"].as_str().unwrap().contains(":resent-"), "{}", shown[0]);
    assert!(shown[0].get("resent").is_none(), "the row reads as before: {}", shown[0]);
    // The query docs/client-protocol.md §13 gives.
    let documented =
        "SELECT message_id, body FROM replies_sent WHERE session_id = $1 ORDER BY created_at";
    let sent: (String, Value) = sqlx::query_as(documented)
        .bind(sid.as_uuid())
        .fetch_one(h.deps.store.pool())
        .await
        .unwrap();
    assert_eq!((sent.0.as_str(), &sent.1), (shown[0]["message_id"].as_str().unwrap(), &again));
    // A turn finished before replies named their turn (its reply in `turns.last_reply`, before
    // migration 0030): sent again with them added, and read back the same way.
    let mut old = again.clone();
    old.as_object_mut().unwrap().retain(|k, _| k != "SessionId" && k != "TurnId");
    sqlx::query("UPDATE turns SET last_reply = $1 WHERE session_id = $2 AND turn_id = 't1'")
        .bind(&old)
        .bind(sid.as_uuid())
        .execute(h.deps.store.pool())
        .await
        .unwrap();
    let resent = one_final(&h, &s, user_turn(&s, "t1", "hello")).await;
    assert_eq!((&resent["SessionId"], &resent["TurnId"]), (&json!(s), &json!("t1")));
    let shown = h.deps.store.session_view(&sid).await.unwrap().unwrap().replies;
    assert_eq!(shown.len(), 2);
    assert!(shown.iter().all(|r| r["body"] == resent), "{shown:?}");
    let conflict = one_final(&h, &s, user_turn(&s, "t1", "different")).await;
    assert_eq!(conflict["Errors"][0]["Code"], "turn.conflict");
    h.teardown().await;
}

async fn drive(h: &Harness, stage: StageName) -> bool {
    let handler = aptix::pipeline::handler(&h.deps, stage).unwrap();
    let settings = aptix::pipeline::runtime_settings(&h.settings, stage);
    process_one(stage, &*handler, &h.conn, &h.publisher, &settings).await.unwrap()
}

/// Duplicates the next message of a stage queue, as a redelivery after a crash would.
async fn duplicate_head(h: &Harness, stage: StageName) {
    let ch = h.conn.create_channel().await.unwrap();
    let queue = h.topology.stage_queue(stage);
    let m = ch
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .unwrap();
    for _ in 0..2 {
        let msg =
            OutMessage::to_queue(queue.clone(), "turn", "dup".into(), m.delivery.data.clone());
        h.publisher.publish(&msg).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redelivered_stage_messages_cause_one_call_one_record_one_reply() {
    let h = Harness::start(0).await;
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "hello")).await;
    for stage in
        [StageName::new("validate"), StageName::new("retrieve"), StageName::new("assemble")]
    {
        assert!(drive(&h, stage).await, "{stage:?} had nothing to do");
    }
    duplicate_head(&h, StageName::new("invoke")).await;
    assert!(drive(&h, StageName::new("invoke")).await && drive(&h, StageName::new("invoke")).await);
    assert_eq!(h.sim.requests().len(), 1, "the saved answer must be reused");
    duplicate_head(&h, StageName::new("persist")).await;
    while drive(&h, StageName::new("persist")).await {}
    assert_eq!(h.records(&s).await.len(), 1);
    let replies = h.replies(&s, 2, Duration::from_secs(3)).await;
    assert_eq!(replies.iter().filter(|r| r.is_final).count(), 1, "{replies:?}");
    h.teardown().await;
}

/// Session texts a process has read or stored are served from its memory afterwards: with every
/// text row gone (in service none ever is), the pipeline's store still reads the session state
/// whole, while a store without that memory finds the references dangling.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn session_texts_once_seen_are_read_from_memory() {
    let h = Harness::start(1).await;
    let s = new_session();
    let mut t1 = user_turn(&s, "t1", "How is the invoice e-mail sent? send_invoice_email");
    t1["InputArtifacts"] = json!([file("src/a.rs", "fn a() { 1 }\n")]);
    assert_eq!(one_final(&h, &s, t1).await["Successful"], true);
    let session: aptix::contracts::SessionId = s.parse().unwrap();
    let warm = h.deps.store.session_state(&session).await.unwrap();
    let history = &warm["history"];
    let texts =
        history["chunks"].as_array().unwrap().iter().chain(history["files"].as_array().unwrap());
    assert!(texts.clone().count() >= 2 && texts.clone().all(|t| t["text"].is_string()), "{warm}");
    sqlx::query("DELETE FROM session_texts").execute(h.deps.store.pool()).await.unwrap();
    let again = h.deps.store.session_state(&session).await.unwrap();
    assert_eq!(again, warm);
    // Assembly's read, which parses the row straight into the state, takes them from there too.
    let (read, _) = h.deps.store.session_state_to_carry(&session).await.unwrap();
    let aptix::store::StateRead::Typed(typed) = read else { panic!("{read:?}") };
    assert_eq!(serde_json::to_value(&typed).unwrap()["history"], warm["history"]);
    let cold = aptix::store::Store::connect(h.settings.database.url.expose(), 1).unwrap();
    let dangling = cold.session_state(&session).await;
    assert!(dangling.is_err(), "a store that never saw the texts read them: {dangling:?}");
    let dangling = cold.session_state_to_carry(&session).await;
    assert!(dangling.is_err(), "nor does assembly's read: {dangling:?}");
    cold.close().await;
    h.teardown().await;
}

/// A copy of a message that finds its turn's outbox rows just written leaves them a moment to
/// their writer, which is publishing and deleting them, instead of publishing them a second
/// time; what is left after that moment, or older, is handed over, as after a crash of the
/// writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_leaves_outbox_rows_being_published_to_their_writer() {
    let h = Harness::start(0).await;
    let s = new_session();
    let session: aptix::contracts::SessionId = s.parse().unwrap();
    let pool = h.deps.store.pool().clone();
    let insert = |age_secs: f64| {
        let (pool, s) = (pool.clone(), s.clone());
        async move {
            sqlx::query_scalar::<_, i64>(
                "INSERT INTO outbox (session_id, turn_id, exchange, routing_key, message_id, kind,
                     body, created_at)
                 VALUES ($1::uuid, 't1', 'x', 'k', 'm', 'reply', '\\x7b7d',
                     now() - make_interval(secs => $2)) RETURNING id",
            )
            .bind(&s)
            .bind(age_secs)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let publishing = insert(0.0).await;
    let writer = {
        let pool = pool.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(15)).await;
            sqlx::query("DELETE FROM outbox WHERE id = $1")
                .bind(publishing)
                .execute(&pool)
                .await
                .unwrap();
        })
    };
    let pending = h.deps.store.pending_outbox(&session, "t1").await.unwrap();
    writer.await.unwrap();
    assert!(pending.is_empty(), "the writer's row was taken too: {:?}", pending.ids);
    let (old, stuck) = (insert(2.0).await, insert(0.0).await);
    let pending = h.deps.store.pending_outbox(&session, "t1").await.unwrap();
    assert_eq!(pending.ids, [old, stuck], "rows nobody deletes are handed over");
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_copies_of_every_stage_keep_per_session_order() {
    let h = Harness::start(2).await;
    let sessions: Vec<String> = (0..12).map(|_| new_session()).collect();
    for turn in 0..4 {
        for s in &sessions {
            h.submit(&user_turn(s, &format!("t{turn}"), &format!("question {turn}"))).await;
        }
    }
    for s in &sessions {
        let replies = h.replies(s, 4, WAIT).await;
        let finals: Vec<_> = replies.iter().filter(|r| r.is_final).collect();
        let order: Vec<&str> = finals.iter().map(|r| r.turn_id.as_str()).collect();
        assert_eq!(order, ["t0", "t1", "t2", "t3"], "session {s}");
        for (i, r) in finals.iter().enumerate() {
            // Each turn chained onto the one before: they ran one at a time, in order.
            assert!(
                text(&r.body).contains(&format!("chain_depth: {}", i + 1)),
                "{}",
                text(&r.body)
            );
        }
        assert_eq!(h.records(s).await.len(), 4);
    }
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invalid_requests_get_specific_errors_and_unanswerable_ones_are_dead_lettered() {
    let h = Harness::start(1).await;
    let s = new_session();
    let cases = [
        (
            json!({"SessionId": s, "TurnId": "a", "Instruction": "x", "Mode": "DDR"}),
            "request.forbidden_field",
        ),
        (json!({"SessionId": s, "TurnId": "b"}), "validation.instruction_missing"),
        (
            json!({"SessionId": s, "TurnId": "c", "Instruction": "x", "ConversationContextId": "nope"}),
            "context.unknown_conversation_context",
        ),
        (
            json!({"SessionId": s, "TurnId": "d", "ToolResults": [{"ToolCallId": "x", "ExecutionMs": 1, "ResultJson": "1"}]}),
            "turn.not_found",
        ),
    ];
    for (request, code) in &cases {
        h.submit(request).await;
        let reply = h.replies(&s, 1, WAIT).await.pop().expect("a reply").body;
        assert_eq!(reply["Successful"], false);
        assert_eq!(reply["Errors"][0]["Code"], *code, "{reply}");
    }
    h.publish_raw(b"{not json".to_vec()).await;
    h.publish_raw(br#"{"TurnId":"x","Instruction":"no session"}"#.to_vec()).await;
    // A valid turn after the bad ones is unaffected.
    let ok = one_final(&h, &s, user_turn(&s, "e", "still fine?")).await;
    assert_eq!(ok["Successful"], true);
    let dead = h.dead_letters().await;
    assert_eq!(dead.len(), 2, "{dead:?}");
    for (headers, _) in &dead {
        assert!(headers["x-aptix-reason"].contains("SessionId"), "{headers:?}");
    }
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_turn_is_one_trace_across_stages() {
    let h = Harness::start(1).await;
    let s = new_session();
    // A client's own trace context is kept for its turn.
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let body = serde_json::to_vec(&user_turn(&s, "t1", "traced")).unwrap();
    let msg = OutMessage::to_queue(h.topology.requests(), "request", "r1".into(), body)
        .header("traceparent", format!("00-{client_trace}-00f067aa0ba902b7-01"));
    h.topology.declare_session(h.publisher.channel(), &s.parse().unwrap()).await.unwrap();
    h.publisher.publish(&msg).await.unwrap();
    let reply = h.replies(&s, 1, WAIT).await.pop().unwrap();
    let tp = &reply.headers["traceparent"];
    assert_eq!(aptix::broker::trace::parse_trace_id(tp), Some(client_trace), "{tp}");
    // Without one, every process derives the same trace id from the turn.
    h.submit(&user_turn(&s, "t2", "derived")).await;
    let reply = h.replies(&s, 1, WAIT).await.pop().unwrap();
    let expected = aptix::broker::trace::derived_trace_id(&s, "t2");
    assert_eq!(
        aptix::broker::trace::parse_trace_id(&reply.headers["traceparent"]),
        Some(expected.as_str())
    );
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_keeps_its_round_trips_path_through_the_stages_and_ignores_a_clients_own() {
    let h = Harness::start(1).await;
    let s = new_session();
    // A client's own x-aptix-hops is not the pipeline's: it must not reach the record.
    let forged =
        r#"[{"stage":"forged","received_ms":1,"sent_ms":2,"attempt":0,"redelivered":false}]"#;
    let body = serde_json::to_vec(&user_turn(&s, "t1", "where is the path")).unwrap();
    let msg = OutMessage::to_queue(h.topology.requests(), "request", "r1".into(), body)
        .header("x-aptix-hops", forged);
    h.topology.declare_session(h.publisher.channel(), &s.parse().unwrap()).await.unwrap();
    h.publisher.publish(&msg).await.unwrap();
    let reply = h.replies(&s, 1, WAIT).await.pop().unwrap();
    assert!(
        !reply.headers.contains_key("x-aptix-hops"),
        "the path is internal: {:?}",
        reply.headers
    );
    let records = h.records(&s).await;
    assert_eq!(records.len(), 1);
    let stored = &records[0]["stage_timings"];
    assert_eq!(stored["v"], 1, "{stored}");
    let path = aptix::messages::hops::from_stored(stored);
    let stages: Vec<&str> = path.iter().map(|h| h.stage.as_str()).collect();
    assert_eq!(stages, ["validate", "retrieve", "assemble", "invoke", "persist"], "{stored}");
    let created = chrono::DateTime::parse_from_rfc3339(records[0]["created_at"].as_str().unwrap());
    let created = created.unwrap().timestamp_millis();
    let mut handed_on = 0;
    for hop in &path {
        assert!(
            hop.received_ms >= handed_on,
            "a stage got its message before it was sent: {stored}"
        );
        assert!(hop.sent_ms >= hop.received_ms, "{stored}");
        assert!(
            hop.received_ms <= created + 1_000 && hop.received_ms > created - 60_000,
            "{stored}"
        );
        assert_eq!((hop.attempt, hop.redelivered), (0, false), "{stored}");
        handed_on = hop.sent_ms;
    }
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_llm_that_stays_down_fails_the_turn_after_the_retries_and_dead_letters_it() {
    let h = Harness::start_with(1, |s| {
        s.llm.max_retries = 0;
        s.pipeline.max_attempts.set("invoke", 2);
    })
    .await;
    h.sim.faults().fail_randomly(aptix::sim::Fault::ServerError, 1.0);
    let s = new_session();
    let reply = one_final(&h, &s, user_turn(&s, "t1", "anyone there?")).await;
    assert_eq!(reply["Successful"], false);
    assert_eq!(reply["Errors"][0]["Code"], "llm.unavailable", "{reply}");
    assert_eq!(h.sim.requests().len(), 2, "one call per attempt");
    let dead = h.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert!(dead[0].0["x-aptix-reason"].starts_with("retries exhausted"), "{:?}", dead[0].0);
    // The session is free again: the next turn runs once the LLM is back.
    h.sim.faults().clear();
    let ok = one_final(&h, &s, user_turn(&s, "t2", "back?")).await;
    assert_eq!(ok["Successful"], true);
    assert_eq!(h.records(&s).await.len(), 2, "the failed turn has its record too");
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_api_key_reaches_the_client_as_a_fixed_sentence() {
    let h = Harness::start(1).await;
    h.sim.faults().fail_next(aptix::sim::Fault::Status { status: 401 }, 1);
    let s = new_session();
    let reply = one_final(&h, &s, user_turn(&s, "t1", "hello?")).await;
    assert_eq!(reply["Successful"], false);
    let error = &reply["Errors"][0];
    assert_eq!(error["Code"], "llm.rejected", "{reply}");
    let message = error["Message"].as_str().unwrap();
    assert!(message.ends_with(aptix::llm::CREDENTIALS_REFUSED), "{message}");
    // The simulator's 401 body says "Incorrect API key provided."; the client never reads it.
    assert!(!reply.to_string().contains("Incorrect API key"), "{reply}");
    let records = h.records(&s).await;
    assert!(!serde_json::to_string(&records).unwrap().contains("Incorrect API key"), "{records:?}");
    h.teardown().await;
}

/// An answer asking the client about more calls than one submission may answer
/// (`limits.max_tool_results`) fails the turn instead of leaving the session waiting for
/// results no client can send; the session takes its next turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn more_client_calls_than_a_client_may_answer_fail_the_turn() {
    let h = Harness::start_with(1, |s| s.limits.max_tool_results = 1).await;
    let s = new_session();
    let r1 = one_final(&h, &s, user_turn(&s, "t1", "Everything at once @call(*)")).await;
    assert_eq!(r1["Successful"], false, "{r1}");
    assert_eq!(r1["Errors"][0]["Code"], "llm.invalid_response", "{r1}");
    assert!(r1["Errors"][0]["Message"].as_str().unwrap().contains("limits.max_tool_results"));
    let r2 = one_final(&h, &s, user_turn(&s, "t2", "hello")).await;
    assert_eq!(r2["Result"]["Kind"], "final", "{r2}");
    h.teardown().await;
}
