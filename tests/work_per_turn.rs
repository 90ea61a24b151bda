//! The work one turn costs, counted over real turns (RabbitMQ, PostgreSQL, the embedded store,
//! the simulator): how many times its JSON is parsed and serialised (the process's own
//! `aptix_json_ops` metric), and how many SQL statements it runs (sqlx's own statement events).
//! The figures are the ones `docs/benchmarks.md` states; a change that does more makes this fail
//! and the docs must say why. Both read process-wide counters, so the tests take turns.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{new_session, user_turn, Harness};
use statements::Statements;

#[path = "work_per_turn/statements.rs"]
mod statements;

/// The tests count process-wide: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const OPS: [(&str, &str); 24] = [
    ("parse", "request_hint"),
    ("parse", "request_scan"),
    ("parse", "request_fields"),
    ("parse", "request_read"),
    ("serialize", "request_stored"),
    ("serialize", "request_fingerprint"),
    ("parse", "request_stored"),
    ("serialize", "outbox"),
    ("parse", "outbox"),
    ("serialize", "turn.retrieve/v1"),
    ("parse", "turn.retrieve/v1"),
    ("serialize", "turn.assemble/v1"),
    ("parse", "turn.assemble/v1"),
    ("serialize", "turn.invoke/v1"),
    ("parse", "turn.invoke/v1"),
    ("serialize", "turn.persist/v1"),
    ("parse", "turn.persist/v1"),
    ("serialize", "saved_answer"),
    ("parse", "session_state"),
    ("parse", "session_state_row"),
    ("parse", "session_state_carried"),
    ("parse", "session_state_packed"),
    ("serialize", "session_state_carried"),
    ("serialize", "session_state"),
];

fn snapshot() -> BTreeMap<String, u64> {
    let m = aptix::metrics::metrics();
    let mut out: BTreeMap<String, u64> =
        OPS.iter().map(|(op, what)| (format!("{op} {what}"), m.json_count(op, what))).collect();
    for (op, what) in [("serialize", "reply"), ("serialize", "reply_body"), ("serialize", "record")]
    {
        out.insert(format!("{op} {what}"), m.json_count(op, what));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_user_turn_parses_its_request_once_and_each_stage_message_once() {
    let _serial = SERIAL.lock().await;
    Statements::install();
    let h = Harness::start(1).await;
    let s = new_session();
    let session: aptix::contracts::SessionId = s.parse().unwrap();
    h.topology.declare_client_queue(h.publisher.channel(), &session).await.unwrap();
    h.sessions.lock().unwrap().insert(session);
    let body = serde_json::to_vec(&user_turn(&s, "t1", "How is the invoice e-mail sent?")).unwrap();
    // Published as a client does; the harness's own helper would read the body for its routing.
    let request = h.topology.request(&s, "m-1".into(), body);
    let before = snapshot();
    h.publisher.publish(&request).await.unwrap();
    let replies = h.replies(&s, 1, Duration::from_secs(60)).await;
    assert_eq!(replies.last().unwrap().body["Successful"], true);
    // The outbox rows are deleted after the reply is published; wait for the counters to settle.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = snapshot();
    let done: BTreeMap<&str, u64> =
        after.iter().map(|(k, v)| (k.as_str(), v - before[k])).filter(|(_, v)| *v > 0).collect();
    let expected: BTreeMap<&str, u64> = [
        // Ingress: the turn named once per delivery, then one scan, one pass over the known
        // properties and one typed read; the request serialised to be stored and to be hashed.
        ("parse request_hint", 1),
        ("parse request_scan", 1),
        ("parse request_fields", 1),
        ("parse request_read", 1),
        ("serialize request_stored", 1),
        ("serialize request_fingerprint", 1),
        // The turn's start message is built from the stored row, checked at that boundary.
        ("parse request_stored", 1),
        // Outbox rows: the start message and the reply, written and never read back (published
        // from memory after the commit).
        ("serialize outbox", 2),
        // Each hop: one encode, one decode.
        ("serialize turn.retrieve/v1", 1),
        ("parse turn.retrieve/v1", 1),
        ("serialize turn.assemble/v1", 1),
        ("parse turn.assemble/v1", 1),
        ("serialize turn.invoke/v1", 1),
        ("parse turn.invoke/v1", 1),
        ("serialize turn.persist/v1", 1),
        ("parse turn.persist/v1", 1),
        ("serialize saved_answer", 1),
        // Session state: its row's text parsed by assemble straight into the state with its
        // texts by reference (which are then put in) and carried to persist, as the row's text,
        // in the round trip's messages; parsed there the same way, updated and written.
        ("parse session_state_packed", 2),
        ("serialize session_state", 1),
        ("serialize reply", 1),
        ("serialize reply_body", 1),
        ("serialize record", 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(done, expected);

    // A second turn finds a history: both stages still parse the state by reference, neither
    // reads it as a tree (as a state written before texts' lengths were kept is read).
    let body = serde_json::to_vec(&user_turn(&s, "t2", "And the invoice PDF?")).unwrap();
    let before = snapshot();
    h.publisher.publish(&h.topology.request(&s, "m-2".into(), body)).await.unwrap();
    let replies = h.replies(&s, 1, Duration::from_secs(60)).await;
    assert_eq!(replies.last().unwrap().body["Successful"], true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = snapshot();
    let ran = |what: &str| after[what] - before[what];
    assert_eq!(ran("parse session_state_packed"), 2);
    for tree in ["parse session_state", "parse session_state_row", "parse session_state_carried"] {
        assert_eq!(ran(tree), 0, "{tree}");
    }
    h.teardown().await;
}

/// Statements a plain user turn (one round trip, a final answer) runs, all stages together,
/// COMMITs included (sqlx does not report BEGIN), over a session's first and second turns: 7 for
/// each: admission's one-round-trip function (which creates a new session too), assemble's state
/// read, invoke's look for a saved answer and its save, persist's one-round-trip function, the
/// two outbox deletes: 7.0 on average, as docs/benchmarks.md states (the fewer-round-trips work
/// took it from 30.7; admission's transaction made it 12.0, persist's 9.0). The half statement of
/// margin covers a second turn that arrives before its session's last outbox row is deleted and
/// takes admission's transaction after the function (five statements more).
const STATEMENTS_PER_TURN: f64 = 7.5;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_user_turn_runs_no_more_statements_than_the_docs_say() {
    let _serial = SERIAL.lock().await;
    let statements = Statements::install();
    let h = Harness::start(1).await;
    const SESSIONS: usize = 10;
    const TURNS: usize = 2 * SESSIONS;
    // Two turns of each session, one after another: a first turn creates its session.
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        let s = new_session();
        let session: aptix::contracts::SessionId = s.parse().unwrap();
        h.topology.declare_client_queue(h.publisher.channel(), &session).await.unwrap();
        h.sessions.lock().unwrap().insert(session);
        sessions.push(s);
    }
    // Settled before counting: the first statements of a pool set up its connections.
    warm_up(&h).await;
    let before = statements.snapshot();
    for s in &sessions {
        for turn in ["t1", "t2"] {
            let body = serde_json::to_vec(&user_turn(s, turn, "How is the invoice e-mail sent?"));
            let request = h.topology.request(s, format!("m-{s}-{turn}"), body.unwrap());
            h.publisher.publish(&request).await.unwrap();
            let replies = h.replies(s, 1, Duration::from_secs(60)).await;
            assert_eq!(replies.last().unwrap().body["Successful"], true);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ran = statements.since(&before);
    let per_turn = ran.turn_statements() as f64 / TURNS as f64;
    eprintln!("{per_turn:.2} statements per turn over {TURNS} turns");
    assert!(
        per_turn <= STATEMENTS_PER_TURN,
        "{per_turn:.1} statements per turn, over {STATEMENTS_PER_TURN}; by statement:\n{}",
        ran.table()
    );
    // The count is real: a turn cannot be admitted, stored and answered in fewer than five.
    assert!(per_turn >= 5.0, "{per_turn:.1} statements per turn:\n{}", ran.table());
    h.teardown().await;
}

/// One turn through the pipeline, not counted.
async fn warm_up(h: &Harness) {
    let s = new_session();
    let session: aptix::contracts::SessionId = s.parse().unwrap();
    h.topology.declare_client_queue(h.publisher.channel(), &session).await.unwrap();
    h.sessions.lock().unwrap().insert(session);
    let body = serde_json::to_vec(&user_turn(&s, "t1", "warm up")).unwrap();
    h.publisher.publish(&h.topology.request(&s, "m-warm".into(), body)).await.unwrap();
    h.replies(&s, 1, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// Channels opened to make reply queues ready (declare and bind, once per new session queue):
/// kept between declarations (`broker/spare.rs`), so twelve new sessions one after another open
/// no channel beyond the warm-up's, where each used to open one of its own. A queue the client
/// declared with an argument refuses the plain declaration (406), which closes its channel:
/// that one is dropped, not kept, and the next declaration opens one more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn new_sessions_reuse_the_channels_their_queues_are_declared_on() {
    let _serial = SERIAL.lock().await;
    // Every test of this binary installs the statement counter before anything sets another.
    let _statements = Statements::install();
    let h = Harness::start(1).await;
    warm_up(&h).await;
    let m = aptix::metrics::metrics();
    let counts = || (m.amqp_count("channel.open"), m.amqp_count("queue.bind"));
    let (opened, bound) = counts();
    const SESSIONS: usize = 12;
    for i in 0..SESSIONS {
        let s = turn_in_new_session(&h, &format!("m-{i}"), None).await;
        assert_eq!(s["Successful"], true, "{s}");
    }
    let (opened_now, bound_now) = counts();
    // The count is real: the pipeline bound each new session's queue (the test binds none).
    assert!(bound_now - bound >= SESSIONS as u64, "{} bindings", bound_now - bound);
    assert_eq!(opened_now - opened, 0, "channels opened for {SESSIONS} new reply queues");

    // A client's queue with an argument: its refusal closes the kept channel, dropped; the next
    // declaration (its passive one) opens a new channel, which is kept for the session after.
    let args = [("x-expires", 3_600_000)];
    let refused = turn_in_new_session(&h, "m-args", Some(&args)).await;
    assert_eq!(refused["Successful"], true, "{refused}");
    let after = turn_in_new_session(&h, "m-after", None).await;
    assert_eq!(after["Successful"], true, "{after}");
    assert_eq!(counts().0 - opened_now, 1, "a refused declaration's channel was kept");
    h.teardown().await;
}

/// A first turn of a new session whose reply queue the client declared (with `args`), its
/// reply's body.
async fn turn_in_new_session(
    h: &Harness,
    message_id: &str,
    args: Option<&[(&str, i64)]>,
) -> serde_json::Value {
    let s = new_session();
    let session: aptix::contracts::SessionId = s.parse().unwrap();
    match args {
        None => h.topology.declare_client_queue(h.publisher.channel(), &session).await.unwrap(),
        Some(args) => {
            let mut table = lapin::types::FieldTable::default();
            for (k, v) in args {
                table.insert((*k).into(), lapin::types::AMQPValue::LongLongInt(*v));
            }
            let options =
                lapin::options::QueueDeclareOptions { durable: true, ..Default::default() };
            let queue = h.topology.session_queue(&session);
            h.publisher
                .channel()
                .queue_declare(queue.as_str().into(), options, table)
                .await
                .unwrap();
        }
    }
    h.sessions.lock().unwrap().insert(session);
    let body = serde_json::to_vec(&user_turn(&s, "t1", "How is the invoice e-mail sent?"));
    h.publisher.publish(&h.topology.request(&s, message_id.into(), body.unwrap())).await.unwrap();
    let replies = h.replies(&s, 1, Duration::from_secs(60)).await;
    replies.last().unwrap().body.clone()
}
