//! Broker failover on a real 3-node RabbitMQ cluster, started beside the service node (which is
//! never touched) by `tests/cluster/rabbitmq-cluster.sh`. The pipeline runs on quorum queues with
//! partitioned ingress and stage queues and the nodes' URLs as its broker list; under load the node
//! leading most of the pipeline's queues is SIGKILLed, then restarted. One backend is connected to
//! a survivor, another to the node that dies (its reply queues die with it: `cluster/backend.rs`).
//! Every turn must get exactly one record and one delivered final reply, in per-session order, with
//! no dead letter; the pipeline must answer the survivor's sessions without a pause over
//! `MAX_SILENCE`, and the other backend's once its node is back.
//!
//! Ignored by plain `cargo test` (it needs about a minute and three extra Erlang nodes);
//! `.ci/run` runs it: `cargo test --test testsuite -- --ignored cluster::`.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

#[path = "cluster/backend.rs"]
mod backend;
use crate::common;
#[path = "cluster/timeline.rs"]
mod timeline;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::Command;
use std::time::{Duration, Instant};

use aptix::broker::{connect, Publisher};
use aptix::config::{ConnectionUrl, QueueType};
use aptix::sim::Latency;
use common::{new_session, user_turn, Harness, ReplyMsg};
use lapin::options::BasicConsumeOptions;
use lapin::types::FieldTable;
use timeline::{longest_silence, node_log_excerpt, Timeline};

const SESSIONS: usize = 16;
/// Sessions of a second backend, connected to the node that is killed: their reply queues live
/// there and are gone with it until it is back.
const ON_VICTIM: usize = 8;
const TURNS: usize = 10;
/// The round after which the node is killed, and the one after which it is restarted.
const KILL_AFTER: usize = 3;
const RESTART_AFTER: usize = 6;
/// Longest the pipeline may answer nothing after the kill.
const MAX_SILENCE: Duration = Duration::from_secs(15);

/// The cluster, stopped and removed on drop (also when the test fails).
struct Cluster {
    dir: std::path::PathBuf,
    urls: Vec<String>,
}

impl Cluster {
    fn script(&self, args: &[&str]) -> String {
        run_script(&self.dir, args)
    }

    fn start() -> Cluster {
        let dir = std::env::temp_dir().join(format!("aptix-cluster-{}", std::process::id()));
        let out = run_script(&dir, &["start"]);
        let urls: Vec<String> =
            out.lines().filter(|l| l.starts_with("amqp://")).map(str::to_owned).collect();
        assert_eq!(urls.len(), 3, "cluster start printed {out:?}");
        Cluster { dir, urls }
    }

    /// The node (1..=3) leading the quorum queue `queue`.
    fn leader(&self, queue: &str) -> usize {
        let out = self.script(&["leader", queue]);
        out.trim().parse().unwrap_or_else(|_| panic!("leader of {queue}: {out:?}"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ =
            Command::new("bash").arg(script_path()).arg("stop").env(DIR_ENV, &self.dir).status();
    }
}

const DIR_ENV: &str = "APTIX_CLUSTER_DIR";

fn script_path() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cluster/rabbitmq-cluster.sh")
}

fn run_script(dir: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("bash").arg(script_path()).args(args).env(DIR_ENV, dir).output();
    let out = out.expect("run tests/cluster/rabbitmq-cluster.sh");
    assert!(
        out.status.success(),
        "rabbitmq-cluster.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Replies of every session, read on the client's node while the test runs.
type Inbox = std::sync::Arc<std::sync::Mutex<BTreeMap<String, Vec<(Instant, ReplyMsg)>>>>;

async fn read_replies(h: &Harness, sessions: &[String], inbox: Inbox) {
    for s in sessions {
        let ch = h.conn.create_channel().await.unwrap();
        let queue = format!("{}.session.{s}", h.topology.prefix());
        let options = BasicConsumeOptions::default();
        let consume =
            ch.basic_consume(queue.as_str().into(), "".into(), options, FieldTable::default());
        let consumer = consume.await.unwrap();
        backend::collect(ch, consumer, s.clone(), inbox.clone());
    }
}

/// Final replies per session, first copy of each message id only (as the protocol says).
fn finals(inbox: &Inbox) -> BTreeMap<String, Vec<(Instant, String)>> {
    let inbox = inbox.lock().unwrap();
    inbox
        .iter()
        .map(|(s, replies)| {
            let mut seen = BTreeSet::new();
            let f = replies
                .iter()
                .filter(|(_, r)| r.is_final && seen.insert(r.message_id.clone()))
                .map(|(at, r)| (*at, r.turn_id.clone()))
                .collect();
            (s.clone(), f)
        })
        .collect()
}

fn delivered(inbox: &Inbox) -> usize {
    finals(inbox).values().map(Vec::len).sum()
}

/// The node leading most of the pipeline's quorum queues, and how many each node leads.
fn busiest_leader(cluster: &Cluster, h: &Harness) -> (usize, HashMap<usize, usize>) {
    let mut queues: Vec<String> = h.topology.ingress_queues();
    let inner = aptix::stages::names().into_iter().skip(1);
    queues.extend(inner.flat_map(|s| h.topology.consumed_queues(s)));
    let mut led = HashMap::new();
    for q in &queues {
        *led.entry(cluster.leader(q)).or_insert(0) += 1;
    }
    let victim = led.iter().max_by_key(|(node, n)| (**n, **node)).map(|(node, _)| *node).unwrap();
    (victim, led)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "starts a 3-node RabbitMQ cluster (about a minute); .ci/run runs it"]
async fn a_killed_broker_node_loses_no_turn() {
    let t0 = Instant::now();
    let cluster = Cluster::start();
    eprintln!("cluster up in {:?}", t0.elapsed());
    let urls = cluster.urls.join(",");
    let mut h = Harness::start_with(0, |s| {
        s.amqp.url = ConnectionUrl::new(urls.clone());
        s.amqp.queue_type = QueueType::Quorum;
        s.amqp.ingress_partitions = 4;
        s.amqp.stage_partitions = 2;
    })
    .await;
    // LLM calls of 200-500 ms: turns are in flight at every stage when the node dies.
    h.sim.set_latency(Latency { fixed_ms: 200, jitter_ms: 300, per_event_ms: 0 });
    h.run(2);
    // Leaders are where the declaring connections were; the client stays off the victim, so
    // its classic reply queues (one node each, by design) survive the kill.
    let (victim, led) = busiest_leader(&cluster, &h);
    let client = cluster.urls[victim % 3].clone();
    h.conn = connect(&client).await.unwrap();
    h.publisher = Publisher::connect(&client).await.unwrap();
    eprintln!("queues led per node {led:?}; killing node {victim}, client on {client}");

    let sessions: Vec<String> = (0..SESSIONS).map(|_| new_session()).collect();
    for s in &sessions {
        let id = s.parse().unwrap();
        h.topology.declare_client_queue(h.publisher.channel(), &id).await.unwrap();
        h.sessions.lock().unwrap().insert(id);
    }
    let inbox = Inbox::default();
    read_replies(&h, &sessions, inbox.clone()).await;
    // The second backend's queues are declared on the victim before anything is published.
    let doomed: Vec<String> = (0..ON_VICTIM).map(|_| new_session()).collect();
    let on_victim = connect(&cluster.urls[victim - 1]).await.unwrap();
    let ch = on_victim.create_channel().await.unwrap();
    for s in &doomed {
        let id = s.parse().unwrap();
        h.topology.declare_client_queue(&ch, &id).await.unwrap();
        h.sessions.lock().unwrap().insert(id);
    }
    drop((ch, on_victim));
    let urls = cluster.urls.clone();
    backend::spawn(urls, victim - 1, h.topology.clone(), doomed.clone(), inbox.clone());
    let everyone: Vec<String> = sessions.iter().chain(&doomed).cloned().collect();

    let mut marks = Timeline::default();
    let mut killed_at = None;
    let mut restart = None;
    for round in 0..TURNS {
        let started = Instant::now();
        for s in &everyone {
            let turn = user_turn(s, &format!("t{round}"), &format!("turn {round}"));
            h.publish_raw(serde_json::to_vec(&turn).unwrap()).await;
        }
        marks.mark_at(started, format!("round t{round} published in {:?}", started.elapsed()));
        tokio::time::sleep(Duration::from_millis(300)).await;
        if round + 1 == KILL_AFTER {
            cluster.script(&["kill", &victim.to_string()]);
            killed_at = Some(marks.mark(format!("node {victim} SIGKILLed")));
            let published = (SESSIONS + ON_VICTIM) * KILL_AFTER;
            eprintln!(
                "node {victim} SIGKILLed, {} of {published} turns answered",
                delivered(&inbox)
            );
        }
        if round + 1 == RESTART_AFTER {
            // In the background: publishing goes on while the node boots.
            let (dir, node) = (cluster.dir.clone(), victim.to_string());
            let begun = marks.mark(format!("node {victim} restart begins"));
            restart = Some((
                begun,
                std::thread::spawn(move || {
                    run_script(&dir, &["restart", &node]);
                    begun.elapsed()
                }),
            ));
        }
    }
    let expected: Vec<String> = (0..TURNS).map(|t| format!("t{t}")).collect();
    let total = (SESSIONS + ON_VICTIM) * TURNS;
    let deadline = Instant::now() + Duration::from_secs(150);
    while delivered(&inbox) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    marks.mark(format!("{} of {total} turns answered", delivered(&inbox)));
    // Late duplicates, if any, would arrive now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (begun, restart) = restart.unwrap();
    let restarted_in = restart.join().unwrap();
    marks.mark_at(begun + restarted_in, format!("node {victim} back (await_startup returned)"));
    eprintln!("node {victim} restarted in {restarted_in:?} (start command to await_startup)");

    let finals = finals(&inbox);
    let killed_at = killed_at.unwrap();
    // The pipeline's pause is measured on the sessions whose queues survived: the others'
    // replies cannot arrive before their node is back.
    let all: Vec<Instant> =
        sessions.iter().filter_map(|s| finals.get(s)).flatten().map(|(at, _)| *at).collect();
    let (gap, silent_from) = longest_silence(&all, killed_at, Duration::from_secs(30));
    marks.mark_at(silent_from, format!("longest silence begins ({gap:?})"));
    let complete = everyone.iter().all(|s| finals.get(s).is_some_and(|f| f.len() == TURNS));
    if gap >= MAX_SILENCE || !complete {
        // Before the timeline: CI keeps the end of a failed test's output.
        eprintln!("{}", node_log_excerpt(&cluster.dir, timeline::wall(killed_at), 25));
    }
    eprintln!("{}", marks.report(killed_at, &all));
    let copies = |side: &[String]| -> usize {
        let inbox = inbox.lock().unwrap();
        let finals = side.iter().filter_map(|s| inbox.get(s)).flatten();
        finals.filter(|(_, r)| r.is_final).count().saturating_sub(side.len() * TURNS)
    };
    eprintln!(
        "{} turns answered; longest silence after the kill {gap:?}; duplicate final copies dropped by message_id: {} on the survivor's queues, {} on the killed node's",
        all.len() + doomed.len() * TURNS,
        copies(&sessions),
        copies(&doomed),
    );
    for s in &everyone {
        let turns: Vec<String> =
            finals.get(s).map(|f| f.iter().map(|(_, t)| t.clone()).collect()).unwrap_or_default();
        let side = if doomed.contains(s) { "on the killed node" } else { "on a survivor" };
        assert_eq!(
            turns, expected,
            "session {s} ({side}): finals missing, repeated or out of order"
        );
        assert_eq!(h.records(s).await.len(), TURNS, "session {s}: one record per turn");
    }
    assert!(gap < MAX_SILENCE, "the pipeline stalled {gap:?} after the kill");
    // Copies of invoke messages ran beside their originals (a killed connection's stage goes on
    // with what it holds while the broker delivers it again): each turn's call was made once.
    let calls = h.sim.stats().requests;
    assert_eq!(calls, total as u64, "provider calls: one per turn, none twice");
    let dead = h.dead_letters().await;
    let reasons: Vec<String> =
        dead.iter().map(|(hd, _)| hd.get("x-aptix-reason").cloned().unwrap_or_default()).collect();
    assert!(dead.is_empty(), "no message is given up for a lost node: {reasons:?}");
    assert_eq!(h.deps.store.parked_len().await.unwrap(), 0, "every parked reply was delivered");
    h.teardown().await;
    drop(cluster);
    eprintln!("whole run {:?}", t0.elapsed());
}
