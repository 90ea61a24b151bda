//! Streamed turns: ordered delta messages on the session's reply queue as tokens arrive, marked
//! as deltas, then the final InvokeResult whose text is the deltas joined.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::{new_session, user_turn, Harness};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streamed_turn_publishes_ordered_deltas_then_the_final_reply() {
    let h = Harness::start(1).await;
    let s = new_session();
    let mut request =
        user_turn(&s, "t1", "Stream me a long answer about send_invoice_email please");
    request["Stream"] = serde_json::json!(true);
    h.submit(&request).await;
    let messages = h.replies(&s, 1, Duration::from_secs(60)).await;
    let (last, deltas) = messages.split_last().expect("messages");
    assert!(last.is_final, "the final reply comes last: {messages:?}");
    assert!(deltas.len() >= 3, "expected several deltas, got {}", deltas.len());
    let mut text = String::new();
    for (i, d) in deltas.iter().enumerate() {
        assert!(!d.is_final);
        assert_eq!(d.body["Delta"], true);
        assert_eq!(d.body["TurnId"], "t1");
        assert_eq!(d.body["Seq"], i as u64, "deltas arrive in order without gaps");
        assert_eq!(d.turn_id, "t1");
        if d.body["Event"]["Type"] == "OutputText" {
            text.push_str(d.body["Event"]["Text"].as_str().unwrap());
        }
    }
    let final_text = last.body["Result"]["PrimaryOutputText"].as_str().unwrap();
    assert_eq!(text, final_text);
    // A client that ignores deltas still gets a complete, ordinary reply.
    assert_eq!(last.body["Successful"], true);
    assert_eq!(h.sim.request_bodies()[0]["stream"], true);
    h.teardown().await;
}
