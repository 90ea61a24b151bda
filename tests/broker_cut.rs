//! Every connection of the pipeline reset at once, again and again, under load, through a relay
//! in front of the broker (`broker_cut/proxy.rs`): what a broker node's death does to the
//! connections on it, without a cluster. One copy of each stage runs, so nothing covers for a
//! stage that is slow to let its dead connection go: after each cut every turn in flight and the
//! next round must be answered within `MAX_RECOVERY`, each once and in order.
//!
//! A stage that waited on the dead connection (closing a channel whose state lapin had not yet
//! marked broken, which it does one channel after another) held validate's ingress partitions
//! for 20 s: the cluster test's failures of 2026-11-27, -28 and -30 (docs/reliability.md).

#[path = "broker_cut/proxy.rs"]
mod proxy;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use aptix::broker::{connect, Publisher};
use aptix::config::ConnectionUrl;

use crate::common::{new_session, user_turn, Harness, ReplyMsg, AMQP};
use proxy::CutProxy;

const SESSIONS: usize = 8;
const CUTS: usize = 6;
/// Longest a round may take from the cut that follows its publishing to its last final reply:
/// a reconnect's back-off is 200 ms, and a stage that waits on a dead connection waits 20 s.
const MAX_RECOVERY: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cut_connections_are_let_go_at_once() {
    let proxy = CutProxy::start("127.0.0.1:5672".parse().unwrap()).await;
    let url = proxy.url();
    let mut h = Harness::start_with(0, |s| {
        s.amqp.url = ConnectionUrl::new(url);
        s.amqp.ingress_partitions = 4;
    })
    .await;
    // The test's own connections go straight to the broker: only the pipeline's are cut.
    h.conn = connect(AMQP).await.unwrap();
    h.publisher = Publisher::connect(AMQP).await.unwrap();
    h.run(1);
    let sessions: Vec<String> = (0..SESSIONS).map(|_| new_session()).collect();
    for s in &sessions {
        let id = s.parse().unwrap();
        h.topology.declare_client_queue(h.publisher.channel(), &id).await.unwrap();
        h.sessions.lock().unwrap().insert(id);
    }
    let mut finals: Vec<Vec<ReplyMsg>> = vec![vec![]; SESSIONS];
    let mut took = Vec::new();
    for round in 0..=CUTS {
        let turn = format!("t{round}");
        for s in &sessions {
            let body = user_turn(s, &turn, &format!("turn {round}"));
            h.publish_raw(serde_json::to_vec(&body).unwrap()).await;
        }
        // The first round runs uncut; each later one is cut with its turns in flight.
        tokio::time::sleep(Duration::from_millis(20 * round as u64)).await;
        if round > 0 {
            proxy.cut();
        }
        let since = Instant::now();
        for (i, s) in sessions.iter().enumerate() {
            let wanted = |got: &[ReplyMsg]| got.iter().any(|r| r.is_final && r.turn_id == turn);
            let got = h.read_until(s, Duration::from_secs(40), wanted).await;
            finals[i].extend(got.into_iter().filter(|r| r.is_final));
        }
        took.push(since.elapsed());
    }
    eprintln!("each round, from its cut to its last final reply: {took:?}");
    for (i, s) in sessions.iter().enumerate() {
        let mut seen = BTreeSet::new();
        let order: Vec<&str> = finals[i]
            .iter()
            .filter(|r| seen.insert(r.message_id.clone()))
            .map(|r| r.turn_id.as_str())
            .collect();
        let expected: Vec<String> = (0..=CUTS).map(|t| format!("t{t}")).collect();
        assert_eq!(order, expected, "session {s}: finals missing, repeated or out of order");
        assert_eq!(h.records(s).await.len(), CUTS + 1, "session {s}: one record per turn");
    }
    let slowest = took.iter().skip(1).max().copied().unwrap_or_default();
    assert!(slowest < MAX_RECOVERY, "a round took {slowest:?} after its cut: {took:?}");
    assert!(h.dead_letters().await.is_empty(), "nothing is given up for a cut connection");
    h.teardown().await;
}
