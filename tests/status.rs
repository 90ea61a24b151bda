//! `aptix status` against a running pipeline (issue 20, point 5): every stage's queue with its
//! consumers and depth, the dead letters, and an exit code a script can use.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Harness;
use serde_json::Value;

fn status(h: &Harness, args: &[&str]) -> (i32, String) {
    h.aptix(&[&["status"], args].concat())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_shows_consumers_depths_and_dead_letters() {
    let mut h = Harness::start(1).await;
    // A request that names no session is dead-lettered.
    h.publish_raw(b"{\"Instruction\": \"no session\"}".to_vec()).await;
    let prefix = h.topology.prefix().to_owned();
    let dead = format!("{prefix}.dead");
    // Consumers attach and the message is dead-lettered within moments of the start.
    let (mut code, mut states) = (-1, Value::Null);
    for _ in 0..100 {
        let out;
        (code, out) = status(&h, &["--json"]);
        states = serde_json::from_str(&out).unwrap();
        let list = states.as_array().unwrap();
        let ready = &list.iter().find(|q| q["queue"] == dead.as_str()).unwrap()["ready"];
        if code == 0 && *ready == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(code, 0, "every stage has a consumer: {states}");
    let list = states.as_array().unwrap();
    for stage in ["retrieve", "assemble", "invoke", "persist"] {
        let q = list.iter().find(|q| q["queue"] == format!("{prefix}.{stage}")).unwrap();
        assert_eq!((q["stage"].as_str(), q["consumers"].as_u64()), (Some(stage), Some(1)), "{q}");
    }
    let dead_q = list.iter().find(|q| q["queue"] == dead.as_str()).unwrap();
    assert_eq!(dead_q["ready"], 1, "{states}");

    h.stop_consumers().await;
    let (code, out) = status(&h, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("warning: no consumer on {prefix}.invoke")), "{out}");
    assert!(out.contains("dead letters waiting: 1"), "{out}");
    h.teardown().await;
}
