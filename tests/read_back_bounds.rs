//! What one session can make the pipeline read back is bounded whatever the client stored in
//! it: a client can give one session any number of turns of up to `limits.max_request_bytes`
//! each, and the console reads its newest `CONSOLE_ROWS` turns without their requests, and one
//! turn's request only on that turn's page (`aptix session show` still reads everything); a
//! turn driven through any number of steps keeps, and a resume sends again, the deltas of its
//! latest `KEPT_STEPS` steps; a session holds at most `MAX_QUEUED_PER_SESSION` turns waiting.
#![allow(clippy::unwrap_used)]

use aptix::contracts::{SessionId, TurnKey};
use aptix::store::{SessionMeta, CONSOLE_ROWS};
use serde_json::json;
use uuid::Uuid;

use crate::store_support::{drop_database, fresh_store};

/// A new session with turn t0 admitted, as a client's first request leaves it.
async fn a_turn(store: &aptix::store::Store) -> (Uuid, TurnKey) {
    let session = Uuid::now_v7();
    let key = TurnKey { session_id: SessionId::new(session), turn_id: "t0".parse().unwrap() };
    let request = json!({"SessionId": session, "TurnId": "t0", "Instruction": "hello"});
    store.admit_user_turn(&key, "fp", &request, &SessionMeta::default(), None).await.unwrap();
    (session, key)
}

#[tokio::test]
async fn the_console_reads_a_sessions_newest_turns_and_only_the_named_turns_request() {
    let (store, db) = fresh_store().await;
    let (session, _) = a_turn(&store).await;
    // The turn ended; then CONSOLE_ROWS + 2 more like it, each with its request.
    for sql in [
        "UPDATE turns SET state = 'completed' WHERE session_id = $1",
        "INSERT INTO turns SELECT (jsonb_populate_record(NULL::turns, to_jsonb(t)
             || jsonb_build_object('turn_id', 'x' || g, 'seq', t.seq + g))).*
         FROM turns t, generate_series(1, 202) g WHERE t.session_id = $1",
    ] {
        sqlx::query(sql).bind(session).execute(store.pool()).await.unwrap();
    }
    assert_eq!(CONSOLE_ROWS, 200, "the insert above makes CONSOLE_ROWS + 2 more");
    let sid = SessionId::new(session);
    let has_request = |t: &serde_json::Value| t.get("request").is_some();

    let view = store.console_view(&sid, None, None).await.unwrap().unwrap();
    assert_eq!(view.turns.len() as i64, CONSOLE_ROWS);
    assert_eq!(view.turns.last().unwrap()["turn_id"], "x202", "the newest, in order");
    assert_eq!(view.turns[0]["turn_id"], "x3");
    assert!(!view.turns.iter().any(has_request), "no request on the session page");

    // The oldest turn's page: its request, beside the newest turns without theirs.
    let view = store.console_view(&sid, Some("t0"), None).await.unwrap().unwrap();
    assert_eq!(view.turns.len() as i64, CONSOLE_ROWS + 1);
    assert_eq!(view.turns[0]["turn_id"], "t0");
    assert_eq!(view.turns[0]["request"]["Instruction"], "hello");
    assert!(!view.turns[1..].iter().any(has_request));

    // A tenant's operator asking for another's session (this one has none) reads nothing of it.
    assert!(store.console_view(&sid, Some("t0"), Some("acme")).await.unwrap().is_none());

    let all = store.session_view(&sid).await.unwrap().unwrap();
    assert_eq!(all.turns.len() as i64, CONSOLE_ROWS + 3, "`aptix session show` reads them all");
    assert!(all.turns.iter().all(has_request));
    drop_database(store, &db).await;
}

/// A turn of many steps keeps the deltas of its latest `KEPT_STEPS` steps only, so what one
/// resume sends again is bounded however many steps a client drives the turn through.
#[tokio::test]
async fn a_turn_keeps_the_deltas_of_its_latest_steps_only() {
    use aptix::store::{Replayed, ResumeFound, KEPT_STEPS};
    let (store, db) = fresh_store().await;
    let (_, key) = a_turn(&store).await;
    for step in 0..7 {
        for seq in 0..3 {
            let body = format!(r#"{{"Delta":true,"Seq":{seq}}}"#);
            store.keep_delta(&key, step, seq, body.as_bytes()).await.unwrap();
        }
    }
    let ResumeFound::Events(found) = store.resume_events(&key, None, None).await.unwrap() else {
        panic!("the turn is there")
    };
    let steps: std::collections::BTreeSet<i32> = found
        .events
        .iter()
        .filter_map(|e| match e {
            Replayed::Delta { step, .. } => Some(*step),
            Replayed::Reply { .. } => None,
        })
        .collect();
    assert_eq!(steps, (7 - KEPT_STEPS..7).collect(), "the latest {KEPT_STEPS} steps' deltas");
    assert_eq!(found.events.len(), 3 * KEPT_STEPS as usize);
    drop_database(store, &db).await;
}

#[tokio::test]
async fn a_session_holds_a_bounded_queue_behind_its_active_turn() {
    use aptix::store::{Admission, MAX_QUEUED_PER_SESSION};
    let (store, db) = fresh_store().await;
    let (session, _) = a_turn(&store).await;
    // t0 runs; all but one of the turns a session may hold wait behind it.
    sqlx::query(
        "INSERT INTO turns SELECT (jsonb_populate_record(NULL::turns, to_jsonb(t)
             || jsonb_build_object('turn_id', 'q' || g, 'seq', t.seq + g, 'state', 'queued'))).*
         FROM turns t, generate_series(1, $2) g WHERE t.session_id = $1",
    )
    .bind(session)
    .bind(MAX_QUEUED_PER_SESSION - 1)
    .execute(store.pool())
    .await
    .unwrap();
    let admit = |turn: &'static str| {
        let store = &store;
        async move {
            let key =
                TurnKey { session_id: SessionId::new(session), turn_id: turn.parse().unwrap() };
            let request = json!({"SessionId": session, "TurnId": turn, "Instruction": "more"});
            store
                .admit_user_turn(&key, turn, &request, &SessionMeta::default(), None)
                .await
                .unwrap()
        }
    };
    assert!(matches!(admit("last").await, Admission::Accepted { queued: true, .. }));
    match admit("over").await {
        Admission::QueueFull { turn_id } => assert_eq!(turn_id, "t0"),
        other => panic!("admitted past the bound: {other:?}"),
    }
    let over = "SELECT count(*) FROM turns WHERE session_id = $1 AND turn_id = 'over'";
    let stored: i64 = sqlx::query_scalar(over).bind(session).fetch_one(store.pool()).await.unwrap();
    assert_eq!(stored, 0, "nothing stored");
    drop_database(store, &db).await;
}

/// Follow-ups already taken into the active turn as steers wait for its end too (it copies its
/// reply to each): they count against the same bound, or a turn that loops on client tools
/// takes in eight steers a round trip without limit.
#[tokio::test]
async fn steers_taken_into_the_active_turn_count_against_the_sessions_bound() {
    use aptix::store::{Admission, MAX_QUEUED_PER_SESSION};
    let (store, db) = fresh_store().await;
    let (session, _) = a_turn(&store).await;
    sqlx::query(
        "INSERT INTO turns SELECT (jsonb_populate_record(NULL::turns, to_jsonb(t)
             || jsonb_build_object('turn_id', 's' || g, 'seq', t.seq + g, 'state', 'steered',
                                   'steers', 't0'))).*
         FROM turns t, generate_series(1, $2) g WHERE t.session_id = $1",
    )
    .bind(session)
    .bind(MAX_QUEUED_PER_SESSION)
    .execute(store.pool())
    .await
    .unwrap();
    let key = TurnKey { session_id: SessionId::new(session), turn_id: "over".parse().unwrap() };
    let request = json!({"SessionId": session, "TurnId": "over", "Instruction": "more"});
    let got =
        store.admit_user_turn(&key, "over", &request, &SessionMeta::default(), None).await.unwrap();
    assert!(matches!(got, Admission::QueueFull { .. }), "admitted past the bound: {got:?}");
    // An interrupt ends the active turn and its steers with it: they do not refuse it.
    let key = TurnKey { session_id: SessionId::new(session), turn_id: "stop".parse().unwrap() };
    let request = json!({"SessionId": session, "TurnId": "stop", "Instruction": "stop that",
                         "FollowUp": "interrupt"});
    let meta =
        SessionMeta { follow_up: aptix::config::FollowUp::Interrupt, ..SessionMeta::default() };
    let got = store.admit_user_turn(&key, "stop", &request, &meta, None).await.unwrap();
    assert!(!matches!(got, Admission::QueueFull { .. }), "an interrupt refused: {got:?}");
    drop_database(store, &db).await;
}
