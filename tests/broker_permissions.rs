//! RabbitMQ itself keeps the internal queues to the workers (issue 13, point 6), with the users
//! of the shipped configuration on the real local broker: the client user `aptix-client` may
//! publish to the entry exchange `<prefix>.requests` and declare and consume its reply queues
//! `<prefix>.session.*`, and nothing else (a forged `turn.persist/v1` published into a stage
//! queue closes the channel with 403 ACCESS_REFUSED); the worker user `aptix-worker` may do all
//! of it, starting with declaring the whole topology.
//!
//! The users come from the shipped deploy/rabbitmq/setup.sh, run once per test binary with its
//! local-machine default (every prefix), rather than from test-only users: the test then proves
//! what the script operators run grants. Each test uses its own random `t-<12 hex>` prefix and
//! deletes its queues and exchanges (as guest) afterwards, passed or failed.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::sync::OnceLock;

use aptix::broker::{connect, StageName, Topology, RETRY_TIERS_MS};
use aptix::contracts::SessionId;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Confirmation, Connection};

const ADMIN: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const WORKER: &str = "aptix-worker";
const CLIENT: &str = "aptix-client";
const MONITOR: &str = "aptix-monitor";
const CONSOLE: &str = "aptix-console";

/// Runs deploy/rabbitmq/setup.sh once for this test binary.
fn ensure_users() {
    static SETUP: OnceLock<()> = OnceLock::new();
    SETUP.get_or_init(|| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/rabbitmq/setup.sh");
        let out = std::process::Command::new("bash")
            .arg(script)
            .arg("--dev")
            .output()
            .unwrap_or_else(|e| panic!("running {script}: {e}"));
        assert!(
            out.status.success(),
            "{script} failed (rabbitmqctl must reach the local node):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// The broker URL of `user`, with the password setup.sh gave it (from the same environment
/// variable or file, or its dev default).
fn url(user: &str) -> String {
    let (var, default) = match user {
        WORKER => ("APTIX_WORKER_PASSWORD", "aptix-worker-dev"),
        MONITOR => ("APTIX_MONITOR_PASSWORD", "aptix-monitor-dev"),
        CONSOLE => ("APTIX_CONSOLE_PASSWORD", "aptix-console-dev"),
        _ => ("APTIX_CLIENT_PASSWORD", "aptix-client-dev"),
    };
    let password = match std::env::var(format!("{var}_FILE")) {
        Ok(file) if !file.is_empty() => {
            std::fs::read_to_string(&file).unwrap().trim_end_matches('\n').to_owned()
        }
        _ => {
            std::env::var(var).ok().filter(|p| !p.is_empty()).unwrap_or_else(|| default.to_owned())
        }
    };
    let escaped: String = password
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    format!("amqp://{user}:{escaped}@127.0.0.1:5672/%2f")
}

/// Runs `body` with a fresh prefix and session, then deletes what it may have created, and
/// re-raises the body's panic, if any.
async fn with_prefix<F, Fut>(body: F)
where
    F: FnOnce(Topology, SessionId) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    ensure_users();
    let topology =
        Topology::new(&format!("t-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]))
            .with_stages(&aptix::stages::names())
            .with_stage_partitions(2);
    let session = SessionId::new(uuid::Uuid::new_v4());
    let outcome = tokio::spawn(body(topology.clone(), session)).await;
    cleanup(&topology, &session).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn cleanup(topology: &Topology, session: &SessionId) {
    let admin = connect(ADMIN).await.unwrap();
    let mut queues: Vec<String> =
        aptix::stages::names().iter().flat_map(|&s| topology.consumed_queues(s)).collect();
    queues.extend([topology.dead(), topology.unrouted(), topology.session_queue(session)]);
    let mut exchanges = vec![topology.requests_exchange(), topology.replies_exchange()];
    exchanges
        .extend(aptix::stages::names().into_iter().skip(1).map(|s| topology.stage_exchange(s)));
    for tier in RETRY_TIERS_MS {
        queues.push(topology.delay_exchange(tier));
        exchanges.push(topology.delay_exchange(tier));
    }
    // A fresh channel each: a name that was never declared must not stop the rest.
    for q in queues {
        if let Ok(ch) = admin.create_channel().await {
            let _ = ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default()).await;
        }
    }
    for x in exchanges {
        if let Ok(ch) = admin.create_channel().await {
            let _ = ch.exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default()).await;
        }
    }
    let _ = admin.close(200, "done".into()).await;
}

/// Publishes as a client does (persistent JSON, mandatory, confirmed) on a new channel; `Ok` only
/// when the broker confirmed and routed it.
async fn publish(
    conn: &Connection,
    exchange: &str,
    key: &str,
    body: &[u8],
) -> Result<(), lapin::Error> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let props = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_message_id(uuid::Uuid::new_v4().to_string().into());
    let options = BasicPublishOptions { mandatory: true, ..Default::default() };
    let confirmation =
        ch.basic_publish(exchange.into(), key.into(), options, body, props).await?.await?;
    assert!(
        matches!(confirmation, Confirmation::Ack(None)),
        "{exchange:?}/{key}: {confirmation:?}"
    );
    Ok(())
}

/// Declares a session's reply queue as a client does (durable, no arguments) and consumes it.
async fn open_reply_queue(conn: &Connection, queue: &str) -> Result<(), lapin::Error> {
    let ch = conn.create_channel().await?;
    let options = QueueDeclareOptions { durable: true, ..Default::default() };
    ch.queue_declare(queue.into(), options, FieldTable::default()).await?;
    consume(conn, queue).await
}

async fn consume(conn: &Connection, queue: &str) -> Result<(), lapin::Error> {
    let ch = conn.create_channel().await?;
    let options = BasicConsumeOptions::default();
    ch.basic_consume(queue.into(), "perm-test".into(), options, FieldTable::default())
        .await
        .map(|_| ())
}

async fn bind_session(
    conn: &Connection,
    topology: &Topology,
    session: &SessionId,
) -> Result<(), lapin::Error> {
    let ch = conn.create_channel().await?;
    ch.queue_bind(
        topology.session_queue(session).as_str().into(),
        topology.replies_exchange().as_str().into(),
        session.to_string().as_str().into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
}

/// Asserts the broker refused the operation with 403 ACCESS_REFUSED.
fn assert_refused(what: &str, result: Result<(), lapin::Error>) {
    match result {
        Ok(()) => panic!("{what}: allowed, expected 403 ACCESS_REFUSED"),
        Err(e) => match e.kind() {
            lapin::ErrorKind::ProtocolError(amqp) => {
                assert_eq!(amqp.get_id(), 403, "{what}: {amqp}");
                assert!(amqp.to_string().contains("ACCESS_REFUSED"), "{what}: {amqp}");
            }
            other => panic!("{what}: expected 403 ACCESS_REFUSED, got {other:?}"),
        },
    }
}

/// Messages waiting in `queue`, counted as the worker.
async fn depth(worker: &Connection, queue: &str) -> u32 {
    let ch = worker.create_channel().await.unwrap();
    let options = QueueDeclareOptions { passive: true, ..Default::default() };
    ch.queue_declare(queue.into(), options, FieldTable::default()).await.unwrap().message_count()
}

/// A persist message as a forger would write it: the real message kind, a made-up turn.
fn forged_persist(session: &SessionId) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "Kind": "turn.persist/v1",
        "job": {"key": {"SessionId": session.to_string(), "TurnId": "forged"}},
    }))
    .unwrap()
}

#[tokio::test]
async fn the_client_user_reaches_only_the_entry_exchange_and_its_reply_queues() {
    with_prefix(|topology, session| async move {
        let worker = connect(&url(WORKER)).await.unwrap();
        topology.declare(&worker.create_channel().await.unwrap()).await.unwrap();
        let client = connect(&url(CLIENT)).await.unwrap();
        let entry = topology.requests_exchange();
        let requests = topology.requests();
        let persist = topology.stage_queue(StageName::new("persist"));
        let reply_queue = topology.session_queue(&session);

        // What protocol v2 lets a client do.
        publish(&client, &entry, &session.to_string(), b"{}").await.unwrap();
        assert_eq!(depth(&worker, &requests).await, 1, "the request reached the ingress queue");
        open_reply_queue(&client, &reply_queue).await.unwrap();

        // A forged stage message through the default exchange: refused, never delivered.
        let forged = forged_persist(&session);
        assert_refused(
            "client publishes into persist",
            publish(&client, "", &persist, &forged).await,
        );
        assert_eq!(depth(&worker, &persist).await, 0, "the forged message never arrived");
        // Nor into any other internal queue, nor the ingress queue behind the exchange's back.
        let mut internal: Vec<String> =
            aptix::stages::names().iter().flat_map(|&s| topology.consumed_queues(s)).collect();
        internal.extend([topology.dead(), topology.unrouted()]);
        for queue in &internal {
            let what = format!("client publishes to {queue} through the default exchange");
            assert_refused(&what, publish(&client, "", queue, &forged).await);
        }
        let mut exchanges = vec![topology.replies_exchange()];
        exchanges.extend(RETRY_TIERS_MS.map(|t| topology.delay_exchange(t)));
        // The stage partitions' hash exchanges (this topology has 2 partitions per stage).
        let inner = aptix::stages::names().into_iter().skip(1);
        exchanges.extend(inner.map(|s| topology.stage_exchange(s)));
        for exchange in &exchanges {
            let what = format!("client publishes to the exchange {exchange}");
            assert_refused(&what, publish(&client, exchange, &persist, &forged).await);
        }

        // Reading or removing internal queues, or binding to the replies exchange: refused.
        assert_refused("client consumes persist", consume(&client, &persist).await);
        assert_refused("client consumes dead", consume(&client, &topology.dead()).await);
        let delete = async {
            let ch = client.create_channel().await?;
            ch.queue_delete(persist.as_str().into(), QueueDeleteOptions::default())
                .await
                .map(|_| ())
        };
        assert_refused("client deletes persist", delete.await);
        assert_refused("client binds to replies", bind_session(&client, &topology, &session).await);
        assert_eq!(depth(&worker, &requests).await, 1, "nothing else reached the ingress queue");
    })
    .await;
}

#[tokio::test]
async fn the_worker_user_may_do_all_of_it() {
    with_prefix(|topology, session| async move {
        // The whole topology, delay queues dead-lettering into the default exchange included.
        let worker = connect(&url(WORKER)).await.unwrap();
        topology.declare(&worker.create_channel().await.unwrap()).await.unwrap();
        let persist = topology.stage_queue(StageName::new("persist"));

        publish(&worker, &topology.requests_exchange(), &session.to_string(), b"{}").await.unwrap();
        assert_eq!(depth(&worker, &topology.requests()).await, 1);
        publish(&worker, "", &persist, &forged_persist(&session)).await.unwrap();
        assert_eq!(depth(&worker, &persist).await, 1, "workers publish stage messages this way");
        publish(&worker, "", &topology.dead(), b"{}").await.unwrap();

        open_reply_queue(&worker, &topology.session_queue(&session)).await.unwrap();
        bind_session(&worker, &topology, &session).await.unwrap();
        publish(&worker, &topology.replies_exchange(), &session.to_string(), b"{}").await.unwrap();
        consume(&worker, &persist).await.unwrap();
        consume(&worker, &topology.dead()).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn the_monitor_reads_depths_only_and_the_console_dead_letters_and_replays_only() {
    with_prefix(|topology, _session| async move {
        let worker = connect(&url(WORKER)).await.unwrap();
        topology.declare(&worker.create_channel().await.unwrap()).await.unwrap();
        let retrieve = topology.stage_queue(StageName::new("retrieve"));
        let (entry, dead) = (topology.requests_exchange(), topology.dead());

        // KEDA's user: a queue's depth, nothing else.
        let monitor = connect(&url(MONITOR)).await.unwrap();
        assert_eq!(depth(&monitor, &retrieve).await, 0, "the monitor reads a depth");
        assert_refused("monitor consumes a stage queue", consume(&monitor, &retrieve).await);
        assert_refused("monitor reads dead letters", consume(&monitor, &dead).await);
        let body = br#"{"SessionId":"x"}"#;
        assert_refused("monitor publishes a request", publish(&monitor, &entry, "x", body).await);
        assert_refused(
            "monitor publishes into a stage queue",
            publish(&monitor, "", &retrieve, body).await,
        );

        // The console's user: take dead letters and publish replays; nothing else.
        let console = connect(&url(CONSOLE)).await.unwrap();
        consume(&console, &dead).await.expect("the console reads dead letters");
        assert_refused("console consumes a stage queue", consume(&console, &retrieve).await);
        let declare = async {
            let ch = console.create_channel().await?;
            let options = QueueDeclareOptions { durable: true, ..Default::default() };
            ch.queue_declare(
                format!("{}.x", topology.prefix()).as_str().into(),
                options,
                FieldTable::default(),
            )
            .await
            .map(|_| ())
        };
        assert_refused("console declares a queue", declare.await);
        publish(&console, "", &retrieve, body).await.expect("a replay into a stage queue");
        assert_eq!(depth(&worker, &retrieve).await, 1);
    })
    .await;
}
