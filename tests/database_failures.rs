//! PostgreSQL failing the way a failover makes it fail: a node that answers read-only for a
//! while (25006, a demoted primary or a standby behind a switched address), and a database that
//! cannot take the replies a client's queue refused. Each is the pipeline's own failure, to be
//! waited out: no turn fails for it and no reply is lost.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::{Duration, Instant};

use crate::client_queues::{declare_refusing_queue, mend_queue};
use common::{new_session, user_turn, Harness};

/// Makes every write to `table` fail with `code` until [`mend`] (a trigger, as a database that
/// refuses them would).
async fn refuse_writes(h: &Harness, table: &str, code: &str) {
    let pool = h.deps.store.pool();
    let function = format!(
        "CREATE OR REPLACE FUNCTION test_refuse() RETURNS trigger AS $$ BEGIN
           RAISE EXCEPTION 'refused by the test' USING ERRCODE = '{code}'; END $$ LANGUAGE plpgsql"
    );
    sqlx::raw_sql(&function).execute(pool).await.unwrap();
    let trigger = format!(
        "CREATE TRIGGER test_refuse BEFORE INSERT OR UPDATE ON {table}
         FOR EACH ROW EXECUTE FUNCTION test_refuse()"
    );
    sqlx::raw_sql(&trigger).execute(pool).await.unwrap();
}

/// Waits up to `wait` for a reply to be parked; how many are.
async fn until_parked(h: &Harness, wait: Duration) -> i64 {
    let deadline = Instant::now() + wait;
    while h.deps.store.parked_len().await.unwrap() == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    h.deps.store.parked_len().await.unwrap()
}

async fn mend(h: &Harness, table: &str) {
    let drop = format!("DROP TRIGGER test_refuse ON {table}");
    sqlx::raw_sql(&drop).execute(h.deps.store.pool()).await.unwrap();
}

/// A database that answers read-only for a few seconds delays a turn; it does not fail it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_only_database_for_a_while_delays_a_turn_and_fails_none() {
    let h = Harness::start(1).await;
    let s = new_session();
    refuse_writes(&h, "turns", "25006").await;
    h.submit(&user_turn(&s, "t1", "hello")).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    mend(&h, "turns").await;
    let replies = h.replies(&s, 1, Duration::from_secs(60)).await;
    let last = replies.iter().rfind(|r| r.is_final).expect("a final reply");
    assert_eq!(last.body["Successful"], true, "{}", last.body);
    assert!(h.dead_letters().await.is_empty(), "a read-only database gave a turn up");
    h.teardown().await;
}

/// A reply its queue refused while the database cannot park it is not sent to the unrouted
/// queue, where its client would never get it: the delivery is handled again until it parks,
/// and the reply arrives once the queue takes messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_reply_the_database_cannot_park_waits_and_arrives() {
    let h = Harness::start(1).await;
    let s = new_session();
    let queue = declare_refusing_queue(&h, &s).await;
    refuse_writes(&h, "undelivered", "25006").await;
    h.publish_raw(serde_json::to_vec(&user_turn(&s, "t1", "hello")).unwrap()).await;
    // The turn completes; its reply is refused by the queue and not parked.
    let deadline = Instant::now() + Duration::from_secs(60);
    while h.records(&s).await.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(h.deps.store.parked_len().await.unwrap(), 0);
    mend(&h, "undelivered").await;
    assert_eq!(until_parked(&h, Duration::from_secs(60)).await, 1, "the reply was never parked");
    // The client mends its queue: the reply arrives, once.
    mend_queue(&h, &queue).await;
    let replies = h.replies(&s, 1, Duration::from_secs(60)).await;
    let finals: Vec<_> = replies.iter().filter(|r| r.is_final).collect();
    assert_eq!(finals.len(), 1, "{replies:?}");
    assert_eq!(finals[0].body["Successful"], true);
    assert!(h.dead_letters().await.is_empty(), "no message was given up");
    assert_eq!(h.records(&s).await.len(), 1, "one record");
    h.teardown().await;
}

/// A refusal that repeats a NUL a client put in its message id (as its correlation id) parks:
/// `jsonb` holds no NUL, and the refusal's park failed for ever, holding validate's slot and the
/// session's lane while it was tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refusal_repeating_a_nul_of_its_client_parks_and_holds_nothing() {
    let h = Harness::start(1).await;
    let s = new_session();
    let queue = declare_refusing_queue(&h, &s).await;
    // No TurnId: refused, and the refusal names the message id.
    let body = serde_json::to_vec(&serde_json::json!({"SessionId": s, "Instruction": "x"}));
    let request = h.topology.request(&s, "hostile\0id".into(), body.unwrap());
    h.publisher.publish(&request).await.unwrap();
    assert_eq!(until_parked(&h, Duration::from_secs(30)).await, 1, "the refusal never parked");
    // The same session's next request is answered once its queue takes messages.
    mend_queue(&h, &queue).await;
    h.submit(&user_turn(&s, "t1", "and now?")).await;
    let replies = h.replies(&s, 2, Duration::from_secs(60)).await;
    let outcomes: Vec<_> = replies.iter().map(|r| r.body["Successful"].clone()).collect();
    assert_eq!(outcomes, [false, true], "the refusal, then the turn's answer");
    h.teardown().await;
}
