//! `aptix dead` against a live pipeline: a request given up while the database could not admit
//! it is listed, shown, replayed, and its turn then completes; discards keep the others in
//! order; a stage's letter is replayed only while its turn runs its step, and two replays of it
//! at once publish it once; every action is recorded.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::{new_session, user_turn, Harness};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_given_up_is_replayed_and_its_turn_completes() {
    let h = Harness::start(1).await;
    let s = new_session();
    // With `turns` gone, admission fails and so does ending the turn: the request is
    // dead-lettered and nothing answers it, as after a database fault.
    sql(&h, "ALTER TABLE turns RENAME TO turns_away").await;
    h.submit(&user_turn(&s, "t1", "hello")).await;
    let listed = until_listed(&h, 1).await;
    sql(&h, "ALTER TABLE turns_away RENAME TO turns").await;
    let letter = &listed[0];
    assert_eq!(letter["session_id"], s.as_str(), "{letter}");
    assert_eq!(letter["turn_id"], "t1");
    assert_eq!(letter["stage"], "validate");
    assert_eq!(letter["body"]["SessionId"], s.as_str(), "the body is shown as JSON");
    let id = letter["id"].as_str().unwrap().to_owned();

    let (code, shown) = h.aptix(&["dead", "show", &id]);
    assert_eq!(code, 0, "{shown}");
    let shown: Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["original_queue"], h.topology.requests().as_str());
    assert!(shown["reason"].as_str().unwrap().contains("turns"), "{shown}");

    let (code, out) = h.aptix(&["dead", "replay", &id, "--actor", "test-operator"]);
    assert_eq!(code, 0, "{out}");
    // The client was told at once that its request could not be processed; the replay admits
    // it as new and answers it again.
    let replies = h.replies(&s, 2, Duration::from_secs(60)).await;
    let finals: Vec<&common::ReplyMsg> = replies.iter().filter(|r| r.is_final).collect();
    assert_eq!(finals.len(), 2);
    assert_eq!(finals[0].body["Errors"][0]["Code"], "internal.error", "{}", finals[0].body);
    assert_eq!(finals[1].turn_id, "t1");
    assert_eq!(finals[1].body["Successful"], true, "{}", finals[1].body);
    assert_eq!(h.records(&s).await.len(), 1, "one record: the replayed turn's");
    assert!(until_listed(&h, 0).await.is_empty());

    let (code, _) = h.aptix(&["dead", "replay", &id]);
    assert_eq!(code, 1, "the dead letter is gone: nothing is replayed twice");
    let actions = actions(&h).await;
    assert_eq!(
        actions,
        vec![
            ("test-operator".into(), "dead.replay".into(), id.clone(), "done".into()),
            (
                std::env::var("USER").unwrap_or_else(|_| "cli".into()),
                "dead.replay".into(),
                id,
                "not_found".into()
            ),
        ]
    );
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn discards_keep_the_others_in_order_and_two_at_once_settle_once() {
    let h = Harness::start(1).await;
    // Forged stage messages (an unreadable body on the retrieve queue) are refused into the
    // dead-letter queue with their ids.
    let ids: Vec<String> = (0..4).map(|i| format!("forged-{i}")).collect();
    let publisher = aptix::broker::Publisher::connect(h.settings.amqp.url.expose()).await.unwrap();
    let retrieve = h.topology.stage_queue(aptix::broker::StageName::new("retrieve"));
    // The last one's body is larger than a list keeps of each.
    let big = aptix::broker::LISTED_BODY + 1000;
    for id in &ids {
        let mut body = b"{not json".to_vec();
        if id == "forged-3" {
            body.resize(big, b'x');
        }
        let msg = aptix::broker::OutMessage::to_queue(retrieve.clone(), "turn", id.clone(), body);
        publisher.publish(&msg).await.unwrap();
    }
    // Retrieve handles them concurrently, so they are dead-lettered in any order.
    let order =
        |l: &[Value]| l.iter().map(|v| v["id"].as_str().unwrap().to_owned()).collect::<Vec<_>>();
    let ids = order(&until_listed(&h, 4).await);
    let mut all = ids.clone();
    all.sort();
    assert_eq!(all, ["forged-0", "forged-1", "forged-2", "forged-3"]);
    assert_eq!(order(&until_listed(&h, 4).await), ids, "a look leaves them in place, in order");
    // A list that has read its budget of bytes (the broker sends each letter whole) ends.
    let dead = [h.topology.dead()];
    let budget = h.topology.dead_letters(&h.publisher, &dead, (10, 1)).await.unwrap();
    let read: Vec<&str> = budget.iter().map(|l| l.id.as_str()).collect();
    assert_eq!(read, [ids[0].as_str()], "a look past its bytes");
    // A list keeps a look at each body; `dead show` reads the one letter whole.
    let listed = until_listed(&h, 4).await;
    let large = listed.iter().find(|l| l["id"] == "forged-3").unwrap();
    assert_eq!(large["body_bytes"], big);
    assert_eq!(large["body"].as_str().unwrap().len(), aptix::broker::LISTED_BODY);
    let (code, out) = h.aptix(&["dead", "show", "forged-3"]);
    assert_eq!(code, 0, "{out}");
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["body"].as_str().unwrap().len(), big);

    let (code, out) = h.aptix(&["dead", "discard", &ids[1]]);
    assert_eq!(code, 0, "{out}");
    let left = [ids[0].clone(), ids[2].clone(), ids[3].clone()];
    assert_eq!(order(&until_listed(&h, 3).await), left);

    // A forged stage message names no turn: a replay would only make the same letter again.
    let (code, out) = h.aptix(&["dead", "replay", &ids[2]]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(order(&until_listed(&h, 3).await), left, "the refused letter stays");

    // Two operators discard the same dead letter at once: one holds it while the other looks.
    let a = h.spawn_child(&["dead", "discard", &ids[2]]);
    let b = h.spawn_child(&["dead", "discard", &ids[2]]);
    let codes = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()]
        .map(|o| o.status.code().unwrap_or(-1));
    let mut sorted = codes;
    sorted.sort();
    assert_eq!(sorted, [0, 1], "exactly one discard went through: {codes:?}");
    assert_eq!(order(&until_listed(&h, 2).await), [ids[0].clone(), ids[3].clone()]);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_letter_given_up_after_a_delay_queue_is_described_and_replayed_as_the_pipeline_wrote_it()
{
    let mut h = Harness::start_with(1, |s| {
        s.llm.max_retries = 0;
        s.pipeline.max_attempts.set("invoke", 2);
    })
    .await;
    h.sim.faults().fail_next(aptix::sim::Fault::Status { status: 503 }, 2);
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "hello")).await;
    // The first attempt went through `P.delay.500`, whose expiry the broker records in death
    // headers: the letter is still the invoke stage's, from the invoke queue.
    let listed = until_listed(&h, 1).await;
    let letter = &listed[0];
    let invoke = h.topology.stage_queue(aptix::broker::StageName::new("invoke"));
    assert_eq!(letter["stage"], "invoke", "{letter}");
    assert_eq!(letter["original_queue"], invoke.as_str(), "{letter}");
    assert_eq!(letter["original_type"], "turn", "{letter}");
    assert!(letter["reason"].as_str().unwrap().starts_with("retries exhausted"), "{letter}");
    let id = letter["id"].as_str().unwrap().to_owned();
    // The give-up ended the turn (its client has `llm.unavailable`): a replay would call the
    // provider for a turn no one waits for, and is refused, the letter kept.
    let replies = h.replies(&s, 1, Duration::from_secs(60)).await;
    assert_eq!(replies[0].body["Errors"][0]["Code"], "llm.unavailable", "{}", replies[0].body);
    h.stop_consumers().await;
    let (code, out) = h.aptix(&["dead", "replay", &id]);
    assert_eq!(code, 1, "{out}");
    let refused: String = sqlx::query_scalar(
        "SELECT detail->>'refused' FROM operator_actions WHERE outcome = 'refused'",
    )
    .fetch_one(h.deps.store.pool())
    .await
    .unwrap();
    assert!(refused.starts_with("its turn is failed at step"), "{refused}");
    until_listed(&h, 1).await;
    // As if the give-up could not end the turn (the database failed under it): the turn still
    // runs the letter's step, and the replay goes where the letter came from. Two operators
    // replay it at once: one holds the letter while the other looks, so one copy goes.
    let turn = format!("session_id = '{s}' AND turn_id = 't1'");
    sql(&h, &format!("UPDATE turns SET state = 'running', step = 0 WHERE {turn}")).await;
    let a = h.spawn_child(&["dead", "replay", &id]);
    let b = h.spawn_child(&["dead", "replay", &id]);
    let codes = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()]
        .map(|o| o.status.code().unwrap_or(-1));
    let mut sorted = codes;
    sorted.sort();
    assert_eq!(sorted, [0, 1], "exactly one replay went through: {codes:?}");
    let (_, status) = h.aptix(&["status", "--json"]);
    let queues: Vec<Value> = serde_json::from_str(&status).unwrap();
    let at = queues.iter().find(|q| q["stage"] == "invoke").unwrap();
    assert_eq!(at["ready"], 1, "one copy reached the invoke queue: {status}");
    // The turn ends before the copy is handled (it is then a late copy): invoke drops it
    // without calling the provider or making another letter.
    sql(&h, &format!("UPDATE turns SET state = 'failed' WHERE {turn}")).await;
    let calls = h.sim.request_bodies().len();
    let invoke = aptix::broker::StageName::new("invoke");
    let handler = aptix::pipeline::handler(&h.deps, invoke).unwrap();
    let settings = aptix::pipeline::runtime_settings(&h.deps.settings, invoke);
    let handled = aptix::broker::process_one(invoke, &*handler, &h.conn, &h.publisher, &settings);
    assert!(handled.await.unwrap(), "the replayed copy was in the invoke queue");
    assert_eq!(h.sim.request_bodies().len(), calls, "the provider was called again");
    assert!(h.dead_letters().await.is_empty(), "another dead letter was made");
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_clients_own_death_headers_neither_describe_nor_route_its_dead_letter() {
    let h = Harness::start(1).await;
    let s = new_session();
    let retrieve = h.topology.stage_queue(aptix::broker::StageName::new("retrieve"));
    h.topology.declare_client_queue(h.publisher.channel(), &s.parse().unwrap()).await.unwrap();
    // Admission fails (as after a database fault), so the request is dead-lettered; it came
    // with the headers the broker and the pipeline write on a dead letter, naming retrieve.
    sql(&h, "ALTER TABLE turns RENAME TO turns_away").await;
    let body = serde_json::to_vec(&user_turn(&s, "t1", "hello")).unwrap();
    let forged = h
        .topology
        .request(&s, "forged-death".into(), body)
        .header("x-first-death-queue", retrieve.as_str())
        .header("x-first-death-reason", "rejected")
        .header("x-aptix-original-queue", retrieve.as_str())
        .header("x-aptix-stage", "retrieve")
        .header("x-aptix-mac", "00");
    h.publisher.publish(&forged).await.unwrap();
    let listed = until_listed(&h, 1).await;
    sql(&h, "ALTER TABLE turns_away RENAME TO turns").await;
    let letter = &listed[0];
    assert_eq!(letter["original_queue"], h.topology.requests().as_str(), "{letter}");
    assert_eq!(letter["stage"], "validate", "{letter}");
    assert_eq!(letter["original_type"], "request", "{letter}");
    let headers = letter["headers"].as_object().unwrap();
    for forged in ["x-first-death-queue", "x-first-death-reason", "x-aptix-mac"] {
        assert!(!headers.contains_key(forged), "{forged} kept: {letter}");
    }
    // The replay goes back to the ingress, where the turn is admitted as any request.
    let (code, out) = h.aptix(&["dead", "replay", "forged-death"]);
    assert_eq!(code, 0, "{out}");
    let replies = h.replies(&s, 2, Duration::from_secs(60)).await;
    let last = replies.iter().rfind(|r| r.is_final).unwrap();
    assert_eq!(last.body["Successful"], true, "{}", last.body);
    h.teardown().await;
}

/// Polls `aptix dead list --json` until it lists `n` dead letters.
async fn until_listed(h: &Harness, n: usize) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (code, out) = h.aptix(&["dead", "list", "--json"]);
        assert_eq!(code, 0, "{out}");
        let listed: Vec<Value> = serde_json::from_str(&out).unwrap();
        if listed.len() == n {
            return listed;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} dead letters, not {n}: {out}",
            listed.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn sql(h: &Harness, statement: &str) {
    sqlx::query(statement).execute(h.deps.store.pool()).await.unwrap();
}

async fn actions(h: &Harness) -> Vec<(String, String, String, String)> {
    sqlx::query_as("SELECT actor, action, message_id, outcome FROM operator_actions ORDER BY id")
        .fetch_all(h.deps.store.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_letter_named_with_its_queue_is_the_one_acted_on_when_two_share_an_id() {
    let h = Harness::start(1).await;
    // A client chooses message ids: the shared queue and a tenant's each hold a letter `same`.
    let mut settings = (*h.settings).clone();
    let tenant = aptix::config::Tenant {
        users: vec!["acme-user".into()],
        agent_contexts: vec!["default".into()],
        conversation_contexts: vec!["default".into()],
        limits: Default::default(),
    };
    settings.tenants.insert("acme".into(), tenant);
    let [shared, own] = [h.topology.dead(), h.topology.dead_of(Some(&"acme".parse().unwrap()))];
    let ch = h.conn.create_channel().await.unwrap();
    let durable = lapin::options::QueueDeclareOptions { durable: true, ..Default::default() };
    ch.queue_declare(own.as_str().into(), durable, Default::default()).await.unwrap();
    for (queue, body) in [(&shared, "the shared one"), (&own, "acme's")] {
        let (id, body) = ("same".to_owned(), body.as_bytes().to_vec());
        let msg = aptix::broker::OutMessage::to_queue(queue.clone(), "turn", id, body);
        h.publisher.publish(&msg).await.unwrap();
    }
    let discard = |queue: Option<String>| {
        let (settings, publisher, store) = (&settings, &h.publisher, &h.deps.store);
        async move {
            let which = ("same", queue.as_deref());
            let action = aptix::broker::DeadAction::Discard;
            aptix::dead::settle(settings, publisher, store, which, action, "test").await.unwrap()
        }
    };
    // Named with its queue, the tenant's letter goes; the shared one, read first, stays.
    match discard(Some(own.clone())).await.settled {
        aptix::dead::Settled::Done(letter) => assert_eq!(letter.body, b"acme's"),
        other => panic!("{other:?}"),
    }
    assert_eq!((h.peek_count(&shared).await, h.peek_count(&own).await), (1, 0));
    // A queue that is not one of the deployment's dead-letter queues holds no letter of its.
    let stage = h.topology.stage_queue(aptix::broker::StageName::new("retrieve"));
    assert!(matches!(discard(Some(stage)).await.settled, aptix::dead::Settled::NotFound));
    assert_eq!(h.peek_count(&shared).await, 1);
    h.teardown().await;
}
