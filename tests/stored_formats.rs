//! Rows written by the previous version still work after an upgrade: an outbox row holding a
//! ready-made AMQP message (before typed payloads) is published, and a saved provider answer
//! stored as a bare round trip (before versioning) is used instead of calling the provider again.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use aptix::broker::StageName;
use common::{new_session, user_turn, Harness};
use lapin::options::BasicGetOptions;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

async fn take(h: &Harness, stage: &'static str) -> Vec<u8> {
    let ch = h.conn.create_channel().await.unwrap();
    let queue = h.topology.stage_queue(StageName::new(stage));
    let got = ch.basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true }).await.unwrap();
    got.expect("a message").delivery.data.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outbox_row_in_the_old_format_is_published_when_its_turn_is_found_again() {
    let mut h = Harness::start(0).await;
    let s = new_session();
    let request = user_turn(&s, "t1", "hello");
    h.submit(&request).await;
    assert!(h.drive("validate").await);
    // The old version crashed after its commit and before its publish: its row holds the
    // message itself (exchange, routing key, headers, body), and nothing was published.
    let body = take(&h, "retrieve").await;
    let queue = h.topology.stage_queue(StageName::new("retrieve"));
    sqlx::query(
        "INSERT INTO outbox (session_id, turn_id, exchange, routing_key, message_id, kind, declare_session, headers, body)
         VALUES ($1::uuid, 't1', '', $2, $3, 'turn', false, $4, $5)",
    )
    .bind(&s)
    .bind(&queue)
    .bind(format!("retrieve:{s}:t1:0"))
    .bind(json!({"x-aptix-session-id": s, "x-aptix-turn-id": "t1"}))
    .bind(&body)
    .execute(h.deps.store.pool())
    .await
    .unwrap();
    // The client's redelivered request finds the turn in flight and publishes the row.
    h.run(1);
    h.submit(&request).await;
    let replies = h.replies(&s, 1, WAIT).await;
    assert_eq!(
        replies.last().unwrap().body["Successful"],
        true,
        "{:?}",
        replies.last().unwrap().body
    );
    assert_eq!(h.records(&s).await.len(), 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        h.deps.store.outbox_len().await.unwrap(),
        0,
        "the old row was deleted once published"
    );
    h.teardown().await;
}

/// A saved answer leaves out the `/responses` body (the redelivered invoke message carries it);
/// a redelivery still forwards the whole round trip, and rows of the older formats still read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_saved_answer_without_its_body_or_in_the_old_format_is_forwarded_without_a_second_call() {
    let h = Harness::start(0).await;
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "what does send_invoice_email do?")).await;
    for stage in ["validate", "retrieve", "assemble"] {
        assert!(h.drive(stage).await, "{stage}");
    }
    let invoke = take(&h, "invoke").await;
    let sent: serde_json::Value =
        serde_json::from_slice::<serde_json::Value>(&invoke).unwrap()["assembled"]["body"].clone();
    assert!(sent["input"].is_array(), "{sent}");
    let queue = h.topology.stage_queue(StageName::new("invoke"));
    // The third copy as an earlier build queued it: with the retrieved chunks again.
    let mut old: serde_json::Value = serde_json::from_slice(&invoke).unwrap();
    old["chunks"] = serde_json::json!([{"id": "c1", "path": "src/a.rs", "start_line": 1,
        "end_line": 2, "language": "rust", "text": "fn a() {}", "score": 1.0}]);
    let old = serde_json::to_vec(&old).unwrap();
    for body in [invoke.clone(), invoke, old] {
        let copy = aptix::broker::OutMessage::to_queue(queue.clone(), "turn", "copy".into(), body);
        h.publisher.publish(&copy).await.unwrap();
    }
    assert!(h.drive("invoke").await);
    assert_eq!(h.sim.stats().requests, 1);
    let saved: serde_json::Value = sqlx::query_scalar(
        "SELECT result FROM llm_results WHERE session_id = $1::uuid AND turn_id = 't1'",
    )
    .bind(&s)
    .fetch_one(h.deps.store.pool())
    .await
    .unwrap();
    assert_eq!(saved["v"], 2, "written with its version: {saved}");
    assert!(saved["job"]["assembled"]["body"].is_null(), "the body is not stored again");
    assert!(h.drive("invoke").await, "the second copy");
    assert_eq!(h.sim.stats().requests, 1, "the saved answer was used");

    // Its chunk texts are kept once, in session_texts, by reference.
    assert_eq!(saved["texts_by_ref"], true, "{saved}");
    let mut legacy = saved["job"].clone();
    let chunks = legacy["assembled"]["update"]["chunks"].as_array_mut().unwrap();
    assert!(!chunks.is_empty(), "the turn sent chunks: {saved}");
    for chunk in chunks {
        let sha = chunk.as_object_mut().unwrap().remove("text_ref").expect("a text_ref");
        let text: String = sqlx::query_scalar("SELECT body FROM session_texts WHERE sha256 = $1")
            .bind(sha.as_str().unwrap())
            .fetch_one(h.deps.store.pool())
            .await
            .unwrap();
        chunk["text"] = text.into();
    }
    // Rewrite the saved answer as the first version stored it: the bare round trip, texts and
    // body included.
    legacy["assembled"]["body"] = serde_json::json!({"model": "stored-before", "input": []});
    sqlx::query(
        "UPDATE llm_results SET result = $2 WHERE session_id = $1::uuid AND turn_id = 't1'",
    )
    .bind(&s)
    .bind(&legacy)
    .execute(h.deps.store.pool())
    .await
    .unwrap();
    assert!(h.drive("invoke").await, "the third copy, with chunks");
    assert_eq!(h.sim.stats().requests, 1, "the old-format answer was used");
    for _ in 0..3 {
        assert!(h.drive("persist").await);
    }
    assert_eq!(h.replies(&s, 1, WAIT).await.last().unwrap().body["Successful"], true);
    let records = h.records(&s).await;
    assert_eq!(records.len(), 1, "one record for the three copies");
    assert_eq!(records[0]["request_payload"], sent, "the record keeps the body that was sent");
    assert!(h.dead_letters().await.is_empty());
    h.teardown().await;
}

/// A session state keeps its chunk texts in `session_texts`, by SHA-256, and reads them back in
/// place; a state written before that (texts inline) still reads as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn session_texts_are_stored_once_by_reference_and_old_inline_states_still_read() {
    let h = Harness::start(1).await;
    let pool = h.deps.store.pool().clone();
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "what does send_invoice_email do?")).await;
    assert_eq!(h.replies(&s, 1, WAIT).await.len(), 1);
    let raw: serde_json::Value =
        sqlx::query_scalar("SELECT state FROM sessions WHERE id = $1::uuid")
            .bind(&s)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(raw["texts_by_ref"], true);
    let chunks = raw["history"]["chunks"].as_array().unwrap();
    assert!(!chunks.is_empty());
    assert!(chunks.iter().all(|c| c.get("text").is_none() && c["text_ref"].is_string()));
    let sid: aptix::contracts::SessionId = s.parse().unwrap();
    let read = h.deps.store.session_state(&sid).await.unwrap();
    assert!(read.get("texts_by_ref").is_none());
    assert!(read["history"]["chunks"][0]["text"].as_str().unwrap().contains("send_invoice_email"));
    // Each reference keeps its text's length, for the history's budgets, not the text.
    for (stored, back) in chunks.iter().zip(read["history"]["chunks"].as_array().unwrap()) {
        let text = back["text"].as_str().unwrap();
        assert_eq!(stored["text_chars"], text.chars().count(), "{stored}");
        assert!(back.get("text_chars").is_none() && back.get("text_ref").is_none());
    }

    // The same state inline, as an older version wrote it, reads the same.
    sqlx::query("UPDATE sessions SET state = $2 WHERE id = $1::uuid")
        .bind(&s)
        .bind(&read)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(h.deps.store.session_state(&sid).await.unwrap(), read);
    h.submit(&user_turn(&s, "t2", "and the tax?")).await;
    assert_eq!(h.replies(&s, 1, WAIT).await[0].body["Successful"], true);
    let raw = state_row(&h, &s).await;
    assert_eq!(raw["texts_by_ref"], true, "the next write keeps the texts by reference again");
    h.teardown().await;
}

/// A state written before the references kept their texts' lengths (`text_chars`) is read
/// with its texts, and the next turn's write stores every length; the history it holds is the
/// same. The turns are sent one after another: each one's persist reads the state the last
/// one wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn references_written_without_their_lengths_get_them_on_the_next_turn() {
    let h = Harness::start(1).await;
    let pool = h.deps.store.pool().clone();
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "what does send_invoice_email do?")).await;
    assert_eq!(h.replies(&s, 1, WAIT).await.len(), 1);
    let mut old = state_row(&h, &s).await;
    for list in ["chunks", "files"] {
        for entry in old["history"][list].as_array_mut().into_iter().flatten() {
            entry.as_object_mut().unwrap().remove("text_chars").expect("a length");
        }
    }
    sqlx::query("UPDATE sessions SET state = $2 WHERE id = $1::uuid")
        .bind(&s)
        .bind(&old)
        .execute(&pool)
        .await
        .unwrap();
    let sid: aptix::contracts::SessionId = s.parse().unwrap();
    let before = h.deps.store.session_state(&sid).await.unwrap();
    let kept: Vec<String> = before["history"]["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap().to_owned())
        .collect();
    assert!(!kept.is_empty());
    h.submit(&user_turn(&s, "t2", "and the tax?")).await;
    assert_eq!(h.replies(&s, 1, WAIT).await[0].body["Successful"], true);
    let raw = state_row(&h, &s).await;
    let after = h.deps.store.session_state(&sid).await.unwrap();
    // Each length is its text's, in characters, as the history's budgets count them.
    for list in ["chunks", "files"] {
        let stored = raw["history"][list].as_array().unwrap();
        let read = after["history"][list].as_array().unwrap();
        assert_eq!(stored.len(), read.len());
        for (entry, back) in stored.iter().zip(read) {
            assert!(entry["text_ref"].is_string(), "{entry}");
            let chars = back["text"].as_str().unwrap().chars().count();
            assert_eq!(entry["text_chars"], chars, "{entry}");
        }
    }
    let texts: Vec<&str> = after["history"]["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    for text in &kept {
        assert!(texts.contains(&text.as_str()), "the first turn's chunks are still held");
    }
    assert_eq!(after["history"]["transcript"].as_array().unwrap().len(), 2);
    h.teardown().await;
}

/// The tool definitions, the same on every turn and echoed back by the provider, are stored
/// once, by reference, in the record's request and response and in the saved answer; every
/// reader gets them back in place. A record written before (tools inline) reads as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tool_definitions_are_stored_once_by_reference_and_read_back_in_place() {
    let h = Harness::start(1).await;
    let pool = h.deps.store.pool().clone();
    let s = new_session();
    for (turn, ask) in [("t1", "what does send_invoice_email do?"), ("t2", "and the tax?")] {
        h.submit(&user_turn(&s, turn, ask)).await;
    }
    assert_eq!(h.replies(&s, 2, WAIT).await.len(), 2);
    let (request, response, saved): (serde_json::Value, serde_json::Value, serde_json::Value) =
        sqlx::query_as(
            "SELECT r.request_payload, r.response_payload, l.result FROM response_records r
             JOIN llm_results l USING (session_id, turn_id, step)
             WHERE r.session_id = $1::uuid AND r.turn_id = 't2'",
        )
        .bind(&s)
        .fetch_one(&pool)
        .await
        .unwrap();
    let sha = request["tools"]["aptix_text_ref"].as_str().expect("tools by reference").to_owned();
    let echoed = response["tools"]["aptix_text_ref"].as_str().expect("echoed tools by reference");
    assert_eq!(saved["job"]["result"]["raw"]["tools"]["aptix_text_ref"], echoed, "{saved}");
    let texts: i64 = sqlx::query_scalar("SELECT count(*) FROM session_texts WHERE sha256 = $1")
        .bind(&sha)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(texts, 1, "kept once for both turns");

    // Read back, the arrays are in place: the records, the reprocessing reads and the saved
    // answer that a redelivered invoke message would use.
    let records = h.records(&s).await;
    assert_eq!(records.len(), 2);
    for r in &records {
        let tools = r["request_payload"]["tools"].as_array().expect("the request's tools");
        assert!(!tools.is_empty() && tools.iter().all(|t| t["name"].is_string()), "{tools:?}");
        assert!(r["response_payload"]["tools"].is_array(), "{r}");
    }
    let steps = h.deps.store.original_steps(s.parse().unwrap(), "t2").await.unwrap();
    assert_eq!(steps[0].request_payload.as_ref(), Some(&records[1]["request_payload"]));
    let saved = steps[0].saved.as_ref().unwrap();
    assert_eq!(saved["job"]["result"]["raw"], records[1]["response_payload"]);

    // A record written before this format, tools inline, reads as it is.
    let old_id: uuid::Uuid = sqlx::query_scalar(
        "INSERT INTO response_records (id, session_id, turn_id, step, kind, request_payload, reply)
         VALUES (gen_random_uuid(), $1::uuid, 't0', 0, 'final', $2, '{}') RETURNING id",
    )
    .bind(&s)
    .bind(&records[1]["request_payload"])
    .fetch_one(&pool)
    .await
    .unwrap();
    let records = h.records(&s).await;
    let old = records.iter().find(|r| r["id"] == old_id.to_string()).unwrap();
    assert_eq!(old["request_payload"], records[1]["request_payload"]);

    // A reference to a text that is not there is an error, never a record without its tools.
    sqlx::query("DELETE FROM session_texts WHERE sha256 = $1")
        .bind(&sha)
        .execute(&pool)
        .await
        .unwrap();
    let id: aptix::contracts::SessionId = s.parse().unwrap();
    let err = h.deps.store.session_view(&id).await.unwrap_err().to_string();
    assert!(err.contains("which is not stored"), "{err}");
    h.teardown().await;
}

/// A finished turn submitted again gets the reply that ended it, read from its record; a turn
/// row written before that, with the reply copied into `turns.last_reply`, still answers with
/// that copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_repeated_turn_gets_its_records_reply_or_an_old_rows_copy() {
    let h = Harness::start(1).await;
    let pool = h.deps.store.pool().clone();
    let s = new_session();
    let request = user_turn(&s, "t1", "hello");
    h.submit(&request).await;
    let first = h.replies(&s, 1, WAIT).await.pop().unwrap().body;
    let copy: Option<serde_json::Value> = sqlx::query_scalar(
        "SELECT last_reply FROM turns WHERE session_id = $1::uuid AND turn_id = 't1'",
    )
    .bind(&s)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(copy, None, "the reply is kept once, in the record");
    h.submit(&request).await;
    assert_eq!(h.replies(&s, 1, WAIT).await.pop().unwrap().body, first);

    let mut old = first.clone();
    old["Result"]["PrimaryOutputText"] = json!("as an older version stored it");
    sqlx::query("UPDATE turns SET last_reply = $2 WHERE session_id = $1::uuid AND turn_id = 't1'")
        .bind(&s)
        .bind(&old)
        .execute(&pool)
        .await
        .unwrap();
    h.submit(&request).await;
    assert_eq!(h.replies(&s, 1, WAIT).await.pop().unwrap().body, old);
    assert_eq!(h.sim.requests().len(), 1, "repeats never call the LLM");
    h.teardown().await;
}

/// Persist builds the next session state from the one the round trip carries from assemble,
/// without reading the row again; an invoke message queued by a build before that (no
/// `session_state`) still ends its turn, persist reading the row instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn persist_builds_on_the_carried_state_and_reads_the_row_for_an_older_message() {
    let h = Harness::start(0).await;
    let s = new_session();
    let queue = h.topology.stage_queue(StageName::new("invoke"));
    for (turn, carried) in [("t1", true), ("t2", true), ("t3", false)] {
        h.submit(&user_turn(&s, turn, "what does send_invoice_email do?")).await;
        for stage in ["validate", "retrieve", "assemble"] {
            assert!(h.drive(stage).await, "{turn} {stage}");
        }
        let mut invoke: serde_json::Value =
            serde_json::from_slice(&take(&h, "invoke").await).unwrap();
        // The state as stored travels (written out again from the state it was read into).
        let row = aptix::assemble::PackedState::from_stored_value(&state_row(&h, &s).await);
        let travels = aptix::assemble::PackedState::from_stored_value(&invoke["session_state"]);
        assert_eq!(travels.unwrap(), row.unwrap(), "{turn}: {invoke}");
        let state = invoke.as_object_mut().unwrap();
        match (turn, carried) {
            // Marked, so the state persist builds on shows where it came from.
            ("t2", _) => state["session_state"]["solution_context"] = json!("carried"),
            (_, false) => drop(state.remove("session_state")),
            _ => {}
        }
        let body = serde_json::to_vec(&invoke).unwrap();
        let copy = aptix::broker::OutMessage::to_queue(queue.clone(), "turn", turn.into(), body);
        h.publisher.publish(&copy).await.unwrap();
        assert!(h.drive("invoke").await, "{turn} invoke");
        assert!(h.drive("persist").await, "{turn} persist");
        let reply = h.replies(&s, 1, WAIT).await.pop().unwrap().body;
        assert_eq!(reply["Successful"], true, "{turn}: {reply}");
    }
    // t2 built on the carried state; t3, without one, on the row t2 wrote.
    assert_eq!(state_row(&h, &s).await["solution_context"], "carried");
    let saved: Vec<serde_json::Value> =
        sqlx::query_scalar("SELECT result FROM llm_results WHERE session_id = $1::uuid")
            .bind(&s)
            .fetch_all(h.deps.store.pool())
            .await
            .unwrap();
    assert_eq!(saved.len(), 3);
    assert!(saved.iter().all(|r| r["job"].get("session_state").is_none()), "never saved");
    assert!(h.dead_letters().await.is_empty());
    h.teardown().await;
}

async fn state_row(h: &Harness, session: &str) -> serde_json::Value {
    sqlx::query_scalar("SELECT state FROM sessions WHERE id = $1::uuid")
        .bind(session)
        .fetch_one(h.deps.store.pool())
        .await
        .unwrap()
}

/// A worker of the previous build that starts while a newer build's migrations are applied (a
/// scale-up or a crash restart during a rollout or a rollback) runs on that database; only
/// `aptix migrate` refuses migrations it does not know.
#[tokio::test]
async fn a_worker_starts_on_a_database_a_newer_build_migrated() {
    use crate::store_support::{drop_database, fresh_store};
    let (store, db) = fresh_store().await;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (99999, 'a newer build''s', true, '\\x00', 0)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    store.migrate_as_worker().await.expect("a worker starts");
    let refused = store.migrate().await.expect_err("aptix migrate refuses what it does not know");
    assert!(refused.to_string().contains("99999"), "{refused}");
    drop_database(store, &db).await;
}

/// A worker that does not migrate itself (`pipeline.migrate_on_start` off, the migrate job's
/// layout) refuses to start on a database behind its build, instead of failing every turn
/// that reaches a table or function of the migration not applied yet.
#[tokio::test]
async fn a_worker_that_does_not_migrate_refuses_a_database_behind_its_build() {
    use crate::store_support::{drop_database, fresh_store};
    let (store, db) = fresh_store().await;
    assert_eq!(store.missing_migrations().await.unwrap(), Vec::<i64>::new());
    let newest: i64 = sqlx::query_scalar(
        "DELETE FROM _sqlx_migrations WHERE version = (SELECT max(version) FROM _sqlx_migrations)
         RETURNING version",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(store.missing_migrations().await.unwrap(), vec![newest]);
    let dir = tempfile::tempdir().unwrap();
    let mut settings = common::test_settings(&db, "http://127.0.0.1:9", dir.path());
    settings.pipeline.migrate_on_start = false;
    let refused = aptix::pipeline::build_deps(std::sync::Arc::new(settings), None)
        .await
        .map(drop)
        .expect_err("a worker does not start on a database behind its build");
    let said = refused.to_string();
    assert!(said.contains(&newest.to_string()) && said.contains("aptix migrate"), "{said}");
    drop_database(store, &db).await;
}
