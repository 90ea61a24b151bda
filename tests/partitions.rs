//! Partitioned ingress (`amqp.ingress_partitions` > 1): validate workers as separate processes,
//! started, SIGKILLed and stopped while requests arrive. Every session's turns are admitted in
//! publish order, every turn gets one record and one final reply, and the partitions end up
//! consumed once each.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeSet;
use std::process::Child;
use std::time::{Duration, Instant};

use aptix::balance::share;
use common::{new_session, terminate, user_turn, Harness};
use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;

const PARTITIONS: u16 = 8;
const SESSIONS: usize = 24;
const TURNS: usize = 6;

fn setup_broker() {
    // Enables the consistent-hash exchange plugin (and the users and policies), as a
    // deployment's set-up does.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/rabbitmq/setup.sh");
    let status = std::process::Command::new("bash").arg(script).arg("--dev").status().unwrap();
    assert!(status.success(), "deploy/rabbitmq/setup.sh failed");
}

#[test]
fn shares_cover_every_partition_once_and_differ_by_at_most_one() {
    for members in 1..=9usize {
        let names: Vec<String> = (0..members).map(|i| format!("w{i}")).collect();
        let shares: Vec<BTreeSet<u16>> = names.iter().map(|m| share(16, &names, m)).collect();
        let all: Vec<u16> = shares.iter().flatten().copied().collect();
        assert_eq!(all.len(), 16, "{members} members: {shares:?}");
        assert_eq!(all.iter().collect::<BTreeSet<_>>().len(), 16, "{shares:?}");
        let sizes: Vec<usize> = shares.iter().map(BTreeSet::len).collect();
        let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        assert!(max - min <= 1, "{members} members: sizes {sizes:?}");
    }
    assert!(share(16, &["a".into()], "not-a-member").is_empty());
}

/// Consumers on each of `queues`.
async fn consumers(h: &Harness, queues: &[String]) -> Vec<u32> {
    let ch = h.conn.create_channel().await.unwrap();
    let mut out = Vec::new();
    for q in queues {
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        let d = ch.queue_declare(q.as_str().into(), passive, FieldTable::default()).await.unwrap();
        out.push(d.consumer_count());
    }
    let _ = ch.close(200, "done".into()).await;
    out
}

/// How long until every partition has exactly one consumer again.
async fn until_each_partition_has_one_consumer(h: &Harness, limit: Duration) -> Duration {
    let queues = h.topology.ingress_queues();
    let waited = until_one_consumer_each(h, &queues, limit).await;
    waited.unwrap_or_else(|counts| panic!("partitions not rebalanced: consumers {counts:?}"))
}

/// How long until each of `queues` has exactly one consumer, or the last counts seen once
/// `limit` has passed.
async fn until_one_consumer_each(
    h: &Harness,
    queues: &[String],
    limit: Duration,
) -> Result<Duration, Vec<u32>> {
    let started = Instant::now();
    loop {
        let counts = consumers(h, queues).await;
        if counts.iter().all(|&c| c == 1) {
            return Ok(started.elapsed());
        }
        if started.elapsed() >= limit {
            return Err(counts);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn validate_worker(h: &Harness) -> Child {
    h.spawn_child(&["worker", "validate"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_stay_in_order_while_validate_workers_come_and_go() {
    setup_broker();
    let mut h = Harness::start_with(0, |s| s.amqp.ingress_partitions = PARTITIONS).await;
    let (deps, token) = (h.deps.clone(), h.shutdown.clone());
    let others: Vec<_> = aptix::stages::names().into_iter().skip(1).collect();
    h.running =
        Some(tokio::spawn(async move { aptix::pipeline::run(deps, &others, 2, token).await }));
    let mut workers = vec![validate_worker(&h), validate_worker(&h)];
    let first = until_each_partition_has_one_consumer(&h, Duration::from_secs(60)).await;
    eprintln!("two workers took all {PARTITIONS} partitions {first:?} after start");

    let sessions: Vec<String> = (0..SESSIONS).map(|_| new_session()).collect();
    let mut takeovers = Vec::new();
    for round in 0..TURNS {
        for s in &sessions {
            h.submit(&user_turn(s, &format!("t{round}"), &format!("turn {round}"))).await;
        }
        match round {
            1 => workers.push(validate_worker(&h)), // joins mid-load
            2 => {
                workers[0].kill().unwrap(); // SIGKILL mid-load
                workers[0].wait().unwrap();
                let t = until_each_partition_has_one_consumer(&h, Duration::from_secs(30)).await;
                takeovers.push(t);
            }
            3 => workers.push(validate_worker(&h)),
            4 => {
                let status = terminate(&mut workers[1]); // SIGTERM mid-load
                assert!(status.success(), "{status:?}");
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    eprintln!("partitions consumed again {takeovers:?} after a SIGKILLed validate worker");

    for s in &sessions {
        let replies = h.replies(s, TURNS, Duration::from_secs(120)).await;
        let mut seen = BTreeSet::new();
        let finals: Vec<String> = replies
            .iter()
            .filter(|r| r.is_final && seen.insert(r.message_id.clone()))
            .map(|r| r.turn_id.clone())
            .collect();
        let expected: Vec<String> = (0..TURNS).map(|t| format!("t{t}")).collect();
        // Where an order breaks first: admission, then execution (records), then replies.
        assert_eq!(admitted_order(&h, s).await, expected, "session {s}: admitted out of order");
        let records = h.records(s).await;
        let ran: Vec<&str> = records.iter().filter_map(|r| r["turn_id"].as_str()).collect();
        assert_eq!(ran, expected, "session {s}: one record per turn, in admission order");
        let ids: Vec<&str> = replies.iter().map(|r| r.message_id.as_str()).collect();
        assert_eq!(finals, expected, "session {s}: final replies out of order or missing: {ids:?}");
    }
    // Two workers remain (the 2nd and 3rd started); they share the partitions.
    until_each_partition_has_one_consumer(&h, Duration::from_secs(30)).await;
    for mut w in workers {
        if w.try_wait().unwrap().is_none() {
            assert!(terminate(&mut w).success());
        }
    }
    assert!(h.dead_letters().await.is_empty());
    h.teardown().await;
}

/// `aptix` with this test's environment and `ingress_partitions` = `partitions`, its log (at
/// info) kept in [`log_of`] so a failure can show what the process said.
fn aptix(h: &Harness, partitions: u16, args: &[&str]) -> std::process::Command {
    let log = std::fs::File::create(log_of(h, args)).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_aptix"));
    cmd.args(args)
        .env_remove("APTIX_CONFIG")
        .envs(h.child_env())
        .env("APTIX__AMQP__INGRESS_PARTITIONS", partitions.to_string())
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(log);
    cmd
}

fn log_of(h: &Harness, args: &[&str]) -> std::path::PathBuf {
    h.dir.join(format!("{}.log", args.join("-")))
}

/// The last lines `aptix ARGS` logged.
fn tail_of_log(h: &Harness, args: &[&str]) -> String {
    let text = std::fs::read_to_string(log_of(h, args)).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

async fn admitted_order(h: &Harness, session: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT turn_id FROM turns WHERE session_id = $1::uuid ORDER BY seq")
        .bind(session)
        .fetch_all(h.deps.store.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repartition_moves_waiting_requests_without_reordering_a_session() {
    setup_broker();
    // One partition, and no validate worker yet: requests wait in the single ingress queue.
    let mut h = Harness::start(0).await;
    let (deps, token) = (h.deps.clone(), h.shutdown.clone());
    let others: Vec<_> = aptix::stages::names().into_iter().skip(1).collect();
    h.running =
        Some(tokio::spawn(async move { aptix::pipeline::run(deps, &others, 2, token).await }));
    let sessions: Vec<String> = (0..8).map(|_| new_session()).collect();
    for round in 0..3 {
        for s in &sessions {
            h.submit(&user_turn(s, &format!("t{round}"), "before the move")).await;
        }
    }
    let move_args = ["repartition", "--from", "1"];
    let mut mover = aptix(&h, 4, &move_args).spawn().unwrap();
    // Published while the move runs: these land in the new layout, behind the old requests.
    for round in 3..6 {
        for s in &sessions {
            h.submit(&user_turn(s, &format!("t{round}"), "during the move")).await;
        }
    }
    let status = mover.wait().unwrap();
    assert!(status.success(), "aptix repartition: {status}\n{}", tail_of_log(&h, &move_args));
    let old = h.topology.ingress_queues_of(1);
    assert_eq!(h.topology.ingress_depth_of(&h.publisher, 1).await.unwrap(), 0);
    let ch = h.conn.create_channel().await.unwrap();
    let passive = QueueDeclareOptions { passive: true, ..Default::default() };
    let gone = ch.queue_declare(old[0].as_str().into(), passive, FieldTable::default()).await;
    assert!(gone.is_err(), "the old ingress queue should be deleted");

    let worker_args = ["worker", "validate"];
    let mut worker = aptix(&h, 4, &worker_args).spawn().unwrap();
    // Up before anything is asked of it: the move may have admitted every request already, and
    // a SIGTERM before the worker has started is not the shutdown this test checks.
    let new = h.topology.ingress_queues_of(4);
    if let Err(counts) = until_one_consumer_each(&h, &new, Duration::from_secs(60)).await {
        panic!("the worker never consumed: {counts:?}\n{}", tail_of_log(&h, &worker_args));
    }
    let expected: Vec<String> = (0..6).map(|t| format!("t{t}")).collect();
    for s in &sessions {
        let replies = h.replies(s, 6, Duration::from_secs(120)).await;
        assert_eq!(replies.iter().filter(|r| r.is_final).count(), 6, "session {s}");
        assert_eq!(admitted_order(&h, s).await, expected, "session {s}: order changed");
    }
    let status = terminate(&mut worker);
    let said = tail_of_log(&h, &worker_args);
    eprintln!("WORKERLOG {status}\n{said}");
    assert!(status.success(), "the validate worker ended with {status} on SIGTERM:\n{said}");
    let ch = h.conn.create_channel().await.unwrap();
    for q in h.topology.ingress_queues_of(4) {
        let _ = ch.queue_delete(q.as_str().into(), Default::default()).await;
    }
    let _ = ch
        .exchange_delete(h.topology.partition_exchange(4).as_str().into(), Default::default())
        .await;
    h.teardown().await;
}

/// A request without a readable SessionId that comes back redelivered (its worker died holding
/// it) ends as a dead letter on a partitioned ingress too. Its counted copy went to
/// `P.requests`, which a partitioned ingress does not have: unroutable, nacked, redelivered, for
/// ever on classic queues, holding a validate permit each time round.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redelivered_request_without_a_session_ends_on_a_partitioned_ingress() {
    setup_broker();
    let mut h = Harness::start_with(0, |s| s.amqp.ingress_partitions = 4).await;
    h.publish_raw(b"{not json".to_vec()).await;
    // Taken and let go unacked, as by a worker that died holding it: back, redelivered.
    let ch = h.conn.create_channel().await.unwrap();
    let mut taken = false;
    for queue in h.topology.ingress_queues() {
        let got = ch.basic_get(queue.as_str().into(), BasicGetOptions::default()).await.unwrap();
        if got.is_some() {
            taken = true;
            break;
        }
    }
    assert!(taken, "the request is in one of the partitions");
    ch.close(200, "died holding it".into()).await.unwrap();
    h.run(1);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut dead = Vec::new();
    while dead.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(300)).await;
        dead = h.dead_letters().await;
    }
    assert_eq!(dead.len(), 1, "the redelivered request was never given up: {dead:?}");
    assert!(dead[0].0["x-aptix-reason"].contains("SessionId"), "{:?}", dead[0].0);

    // `aptix submit` run with the defaults (one partition) against this ingress binds nothing:
    // its request is answered, and no single `P.requests` collects copies of every request.
    let s = new_session();
    let file = h.dir.join("request.json");
    std::fs::write(&file, user_turn(&s, "t1", "from the command line").to_string()).unwrap();
    let args = ["submit", "request.json", "--wait", "--timeout", "60"];
    let status = aptix(&h, 1, &args).current_dir(&h.dir).status().unwrap();
    assert!(status.success(), "aptix submit: {status}\n{}", tail_of_log(&h, &args));
    let ch = h.conn.create_channel().await.unwrap();
    let passive = QueueDeclareOptions { passive: true, ..Default::default() };
    let single = h.topology.ingress_queues_of(1);
    let declared = ch.queue_declare(single[0].as_str().into(), passive, FieldTable::default());
    assert!(declared.await.is_err(), "a client bound `{}` to the entry exchange", single[0]);

    // A repartition from a layout that is not there, or still consumed, binds nothing.
    for (from, why) in [(2, "no ingress of 2"), (4, "consumer(s) still read")] {
        let args = ["repartition", "--from", &from.to_string()];
        let args: Vec<&str> = args.iter().map(|a| a.as_ref()).collect();
        let status = aptix(&h, 8, &args).status().unwrap();
        let said = tail_of_log(&h, &args);
        assert!(!status.success() && said.contains(why), "repartition --from {from}: {said}");
    }
    let ch = h.conn.create_channel().await.unwrap();
    let eight = h.topology.ingress_queues_of(8);
    let declared = ch.queue_declare(eight[0].as_str().into(), passive, FieldTable::default());
    assert!(declared.await.is_err(), "a refused repartition declared the new layout");
    h.teardown().await;
}
