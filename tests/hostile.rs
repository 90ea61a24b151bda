//! Issue 40's soak: two tenants on one pipeline. Tenant `tb` runs closed-loop turns on 8
//! sessions, first alone, then while tenant `ta` runs the attacks a tenant can make, all at once:
//! a reply queue that refuses every message (`reject-publish`, `x-max-length = 0`) with invalid
//! requests and valid turns for it, requests carrying forged death and `x-aptix-*` headers,
//! bodies over the request limit that name no session, and streamed turns cancelled at once.
//! `tb`'s throughput and p99 are printed for both phases (docs/reliability.md, "Containment"),
//! and a dead letter of `tb` must survive the flood.
//!
//! Ignored by plain `cargo test` (two phases of `APTIX_SOAK_SECS`, default 300 s each):
//! `cargo test --test testsuite -- --ignored --nocapture hostile::`.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::tenant_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aptix::config::{Settings, Tenant};
use common::{new_session, user_turn, Harness};
use futures_util::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use serde_json::json;
use tenant_support::{create_user, delete_user, TenantClient};

const VICTIM_SESSIONS: usize = 8;

fn soak() -> Duration {
    let secs = std::env::var("APTIX_SOAK_SECS").ok().and_then(|s| s.parse().ok());
    Duration::from_secs(secs.unwrap_or(300))
}

/// `ta` (the attacker) with the `default` agent context, `tb` with `bctx` (an agent context's
/// key and collection serve one tenant).
fn tenants(s: &mut Settings) {
    let prefix = s.amqp.prefix.clone();
    let b: aptix::config::AgentContext =
        serde_json::from_value(json!({"collection": "bcol", "llm_api_key": "sk-tenant-b-0042"}))
            .unwrap();
    s.agent_contexts.insert("bctx".into(), b);
    let tenant = |user: String, agent: &str| Tenant {
        users: vec![user],
        agent_contexts: vec![agent.into()],
        conversation_contexts: vec!["default".into()],
        limits: Default::default(),
    };
    s.tenants = BTreeMap::from([
        ("ta".into(), tenant(format!("{prefix}-a"), "default")),
        ("tb".into(), tenant(format!("{prefix}-b"), "bctx")),
    ]);
    s.validate().unwrap();
}

/// The victim's figures for one phase.
#[derive(Debug, serde::Serialize)]
struct Phase {
    turns: usize,
    turns_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn phase(mut latencies: Vec<Duration>, took: Duration) -> Phase {
    latencies.sort();
    let at = |q: f64| {
        let i = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len().max(1));
        latencies.get(i - 1).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Phase {
        turns: latencies.len(),
        turns_per_s: latencies.len() as f64 / took.as_secs_f64(),
        p50_ms: at(0.5),
        p99_ms: at(0.99),
    }
}

/// One victim session: a turn, its final reply, the next, until `until`; the latencies.
async fn victim_session(b: Arc<TenantClient>, session: String, until: Instant) -> Vec<Duration> {
    b.declare(&session).await;
    let ch = b.conn.create_channel().await.unwrap();
    let queue = b.queue(&session);
    let consume = ch.basic_consume(
        queue.as_str().into(),
        "".into(),
        BasicConsumeOptions::default(),
        FieldTable::default(),
    );
    let mut consumer = consume.await.unwrap();
    let mut out = Vec::new();
    let mut n = 0;
    while Instant::now() < until {
        let turn = format!("t{n}");
        n += 1;
        let started = Instant::now();
        b.publish_as(&user_turn(&session, &turn, "what does the invoice module do"), Some(&b.user))
            .await;
        loop {
            let next = tokio::time::timeout(Duration::from_secs(60), consumer.next()).await;
            let Ok(Some(Ok(d))) = next else { panic!("victim {session}: no reply for {turn}") };
            d.ack(BasicAckOptions::default()).await.unwrap();
            let reply = common::reply_of(&d);
            if reply.is_final && reply.turn_id == turn {
                assert_eq!(reply.body["Successful"], true, "{}", reply.body);
                break;
            }
        }
        out.push(started.elapsed());
    }
    out
}

async fn victim(b: Arc<TenantClient>, sessions: &[String], for_: Duration) -> Phase {
    let until = Instant::now() + for_;
    let began = Instant::now();
    let tasks: Vec<_> = sessions
        .iter()
        .map(|s| tokio::spawn(victim_session(b.clone(), s.clone(), until)))
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    phase(all, began.elapsed())
}

/// Every attack at once until `stop`; how many messages each sent.
async fn attack(a: Arc<TenantClient>, stop: Arc<AtomicBool>) -> BTreeMap<&'static str, u64> {
    let counts: Arc<BTreeMap<&'static str, AtomicU64>> = Arc::new(
        ["refused_refusals", "parked_turns", "forged_headers", "oversized", "cancelled_streams"]
            .into_iter()
            .map(|k| (k, AtomicU64::new(0)))
            .collect(),
    );
    // A reply queue that takes nothing.
    let hostile = new_session();
    let mut args = FieldTable::default();
    args.insert("x-overflow".into(), AMQPValue::LongString("reject-publish".into()));
    args.insert("x-max-length".into(), AMQPValue::LongLongInt(0));
    let options = QueueDeclareOptions { durable: true, ..Default::default() };
    a.ch.queue_declare(a.queue(&hostile).as_str().into(), options, args).await.unwrap();
    let mut tasks = Vec::new();
    let every = |what: &'static str,
                 pause: Duration,
                 send: Arc<dyn Fn(u64) -> serde_json::Value + Send + Sync>| {
        let (a, stop, counts) = (a.clone(), stop.clone(), counts.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                a.publish_as(&send(i), Some(&a.user)).await;
                counts[what].fetch_add(1, Ordering::Relaxed);
                i += 1;
                tokio::time::sleep(pause).await;
            }
        })
    };
    let h = hostile.clone();
    tasks.push(every(
        "refused_refusals",
        Duration::from_millis(50),
        Arc::new(move |_| json!({"SessionId": h, "Instruction": "no turn id"})),
    ));
    let h = hostile.clone();
    tasks.push(every(
        "parked_turns",
        Duration::from_millis(500),
        Arc::new(move |i| user_turn(&h, &format!("p{i}"), "a reply nobody can take")),
    ));
    // Streamed turns on sessions of its own, each cancelled right after it was sent.
    {
        let (a, stop, counts) = (a.clone(), stop.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let s = new_session();
                a.declare(&s).await;
                let mut turn = user_turn(&s, "c", "stream a long answer");
                turn["Stream"] = json!(true);
                a.publish_as(&turn, Some(&a.user)).await;
                a.cancel(&s, "c").await;
                counts["cancelled_streams"].fetch_add(1, Ordering::Relaxed);
                i += 1;
                let _ = i;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }));
    }
    // Forged headers, and bodies over the request limit that name no session.
    {
        let (a, stop, counts) = (a.clone(), stop.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            let big = vec![b'A'; 4 * 1024 * 1024 + 1];
            while !stop.load(Ordering::Relaxed) {
                let s = new_session();
                a.declare(&s).await;
                a.publish_forged(&user_turn(&s, "f", "forged headers")).await;
                counts["forged_headers"].fetch_add(1, Ordering::Relaxed);
                a.publish_raw(&big).await;
                counts["oversized"].fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(1000)).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    counts.iter().map(|(k, v)| (*k, v.load(Ordering::Relaxed))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "two soak phases of APTIX_SOAK_SECS (300 s) each; run by hand for the figures"]
async fn a_hostile_tenant_leaves_the_other_tenants_throughput_and_latency_alone() {
    let h = Harness::start_with(2, tenants).await;
    let prefix = h.topology.prefix().to_owned();
    let mut clients = Vec::new();
    for (t, tenant) in [("a", "ta"), ("b", "tb")] {
        let user = format!("{prefix}-{t}");
        create_user(&user, "pw-test", &prefix, tenant);
        clients.push(Arc::new(TenantClient::connect(&user, "pw-test", tenant, &prefix).await));
    }
    let (b, a) = (clients.pop().unwrap(), clients.pop().unwrap());
    // One dead letter of the victim's (a body naming no session), which the flood must not evict.
    b.publish_raw(b"{\"not\": \"a request of any session\"}").await;
    let sessions: Vec<String> = (0..VICTIM_SESSIONS).map(|_| new_session()).collect();
    let for_ = soak();
    // Warm-up, not measured: the sessions' first turns start their chains.
    let warm = victim(b.clone(), &sessions, (for_ / 5).min(Duration::from_secs(30))).await;
    eprintln!("warm-up: {warm:?}");

    let alone = victim(b.clone(), &sessions, for_).await;
    eprintln!("victim alone: {alone:?}");
    let stop = Arc::new(AtomicBool::new(false));
    let attacker = tokio::spawn(attack(a.clone(), stop.clone()));
    let attacked = victim(b.clone(), &sessions, for_).await;
    stop.store(true, Ordering::Relaxed);
    let sent = attacker.await.unwrap();
    eprintln!("victim under attack: {attacked:?}");
    let dead = h.dead_letters().await;
    let victims_letter = dead.iter().any(|(_, body)| body.starts_with(b"{\"not\""));
    let largest = dead.iter().map(|(_, body)| body.len()).max().unwrap_or(0);
    let report = json!({
        "soak_secs": for_.as_secs(), "victim_sessions": VICTIM_SESSIONS,
        "alone": alone, "attacked": attacked, "attacks_sent": sent,
        "throughput_ratio": attacked.turns_per_s / alone.turns_per_s,
        "p99_ratio": attacked.p99_ms / alone.p99_ms,
        "dead_letters": dead.len(), "largest_dead_letter_bytes": largest,
        "parked_replies": h.deps.store.parked_len().await.unwrap(),
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    assert!(victims_letter, "the victim's dead letter survived the flood");
    assert!(largest <= 64 * 1024 + 1024, "no flooded body is kept whole: {largest}");
    // The figures against issue 40's 10 % are in docs/reliability.md; the test holds a bound
    // a 2-core machine shared with the attacker's own load keeps.
    assert!(attacked.turns_per_s >= 0.5 * alone.turns_per_s, "{report}");
    let users = [a.user.clone(), b.user.clone()];
    drop((a, b));
    h.teardown().await;
    users.iter().for_each(|u| delete_user(u));
}
