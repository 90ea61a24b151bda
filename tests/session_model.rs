//! The session model of Session Architecture §2.3 (issue 19, point 4): a session's name comes
//! from its first instruction and can be changed with `aptix session rename`; it expires the
//! retention after its last turn, extended by each new one; `aptix session show` shows both.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::{new_session, user_turn, Harness};
use serde_json::Value;

fn aptix(h: &Harness, args: &[&str]) -> (i32, String) {
    h.aptix(args)
}

fn shown(h: &Harness, s: &str) -> Value {
    let (code, out) = aptix(h, &["session", "show", s]);
    assert_eq!(code, 0, "{out}");
    serde_json::from_str::<Value>(&out).unwrap()["session"].clone()
}

fn expiry(session: &Value) -> chrono::DateTime<chrono::Utc> {
    session["expires_at"].as_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_session_is_named_by_its_first_instruction_renamed_and_expires_after_its_last_turn() {
    let h = Harness::start(1).await;
    let s = new_session();
    let long = "x".repeat(200);
    h.submit(&user_turn(&s, "t1", &format!("\n   Fix the invoice mail {long}\nand more"))).await;
    let replies = h.replies(&s, 1, Duration::from_secs(20)).await;
    assert_eq!(replies.len(), 1);
    let first = shown(&h, &s);
    let name = first["name"].as_str().unwrap();
    assert!(name.starts_with("Fix the invoice mail x") && name.chars().count() == 80, "{name}");
    // The reply carries both as headers (AGN-033 fixes its body).
    assert_eq!(replies[0].headers["x-aptix-session-name"], name);
    let sent: chrono::DateTime<chrono::Utc> =
        replies[0].headers["x-aptix-session-expires"].parse().unwrap();
    assert!((sent - expiry(&first)).num_seconds().abs() <= 1, "{sent} vs {}", expiry(&first));
    let days = (expiry(&first) - chrono::Utc::now()).num_hours();
    assert!((29 * 24..=30 * 24).contains(&days), "expires in 30 days: {days} h");

    h.submit(&user_turn(&s, "t2", "Second line only matters for the first turn")).await;
    assert_eq!(h.replies(&s, 1, Duration::from_secs(20)).await.len(), 1);
    let second = shown(&h, &s);
    assert_eq!(second["name"], first["name"], "a later turn does not rename");
    assert!(expiry(&second) > expiry(&first), "each turn extends the expiry");

    assert_eq!(aptix(&h, &["session", "rename", &s, "Invoice mail"]).0, 0);
    assert_eq!(shown(&h, &s)["name"], "Invoice mail");
    h.submit(&user_turn(&s, "t3", "after the rename")).await;
    let renamed = h.replies(&s, 1, Duration::from_secs(20)).await;
    assert_eq!(renamed[0].headers["x-aptix-session-name"], "Invoice mail");
    assert_eq!(aptix(&h, &["session", "rename", &s, " "]).0, 2, "an empty name is refused");
    assert_eq!(aptix(&h, &["session", "rename", &new_session(), "x"]).0, 1, "unknown session");
    h.teardown().await;
}
