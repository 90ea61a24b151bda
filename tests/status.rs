//! `aptix status` against a running pipeline (issue 20, point 5): every stage's queue with its
//! consumers and depth, the dead letters, and an exit code a script can use.
#![allow(clippy::unwrap_used)]

use crate::common;

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

/// RabbitMQ's management API on this machine (deploy/rabbitmq/setup.sh enables the plugin).
const MANAGEMENT: &str = "http://guest:guest@127.0.0.1:15672";

fn management_answers() -> bool {
    std::net::TcpStream::connect("127.0.0.1:15672").is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_management_api_status_shows_rates_and_each_stages_workers() {
    if !management_answers() {
        assert!(
            std::env::var("APTIX_REQUIRE_MANAGEMENT").is_err(),
            "APTIX_REQUIRE_MANAGEMENT is set and nothing answers on 127.0.0.1:15672"
        );
        eprintln!(
            "SKIPPED: no management API on 127.0.0.1:15672 (deploy/rabbitmq/setup.sh enables it)"
        );
        return;
    }
    let h = Harness::start(1).await;
    let prefix = h.topology.prefix().to_owned();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_aptix"))
            .arg("status")
            .args(args)
            .env_remove("APTIX_CONFIG")
            .envs(h.child_env())
            .env("APTIX__AMQP__MANAGEMENT_URL", MANAGEMENT)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    // Turns keep flowing while we look: RabbitMQ samples rates every few seconds.
    // Consumers attach within moments of the start (exit 1 until every stage has one).
    let persist = format!("{prefix}.persist");
    let (mut code, mut seen) = (None, Value::Null);
    for i in 0..150 {
        let s = common::new_session();
        h.submit(&common::user_turn(&s, "t1", &format!("turn {i}"))).await;
        let out;
        (code, out) = run(&["--json"]);
        seen = serde_json::from_str(&out).unwrap();
        let q = seen.as_array().unwrap().iter().find(|q| q["queue"] == persist.as_str()).unwrap();
        let rate = |name: &str| q["activity"][name].as_f64().unwrap_or_default() > 0.0;
        // Rates and consumer details refresh every few seconds (the management stats interval),
        // and the publish and ack rates of one queue are not sampled together: wait for both.
        let moving = rate("ack_per_s") && rate("publish_per_s");
        if code == Some(0) && moving && STAGES.iter().all(|s| one_worker(&seen, &prefix, s)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(code, Some(0), "{seen}");
    let list = seen.as_array().unwrap();
    let persist_q = list.iter().find(|q| q["queue"] == persist.as_str()).unwrap();
    assert!(persist_q["activity"]["ack_per_s"].as_f64().unwrap() > 0.0, "{persist_q}");
    assert!(persist_q["activity"]["publish_per_s"].as_f64().unwrap() > 0.0, "{persist_q}");
    for stage in STAGES {
        assert!(one_worker(&seen, &prefix, stage), "{stage}: {seen}");
    }
    let (_, text) = run(&[]);
    let me = "worker  invoke     aptix invoke worker on ";
    assert!(text.contains(me) && text.contains(&format!("(consuming {prefix}.invoke)")), "{text}");
    h.teardown().await;
}

const STAGES: [&str; 4] = ["retrieve", "assemble", "invoke", "persist"];

/// Whether `stage`'s queue in `--json` output has exactly one consumer, this process's worker
/// of that stage by the name it gave its connection.
fn one_worker(states: &Value, prefix: &str, stage: &str) -> bool {
    let list = states.as_array().map(Vec::as_slice).unwrap_or_default();
    let Some(q) = list.iter().find(|q| q["queue"] == format!("{prefix}.{stage}")) else {
        return false;
    };
    let workers = q["activity"]["workers"].as_array().map(Vec::as_slice).unwrap_or_default();
    let (me, pid) = (format!("aptix {stage} worker on "), format!(" pid {}", std::process::id()));
    matches!(workers, [w] if w.as_str().is_some_and(|n| n.starts_with(&me) && n.ends_with(&pid)))
}
