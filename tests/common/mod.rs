//! Harness for pipeline integration tests against the real RabbitMQ and PostgreSQL: a random
//! queue prefix and a fresh database per test, the Responses simulator in-process, an embedded
//! vector store in a temp dir with a small indexed fixture repository.
#![allow(dead_code)]
// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use aptix::broker::{connect, Publisher, Topology};
use aptix::config::{ConnectionUrl, Settings};
use aptix::contracts::SessionId;
use aptix::index::{index_repository, IndexOptions};
use aptix::pipeline;
use aptix::sim::{SimConfig, SimHandle};
use aptix::stages::Deps;
use aptix::store::Store;
use futures_util::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicGetOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// One message read from a session's reply queue.
#[derive(Debug, Clone)]
pub struct ReplyMsg {
    pub turn_id: String,
    pub message_id: String,
    /// A reply, not a delta: it ends a step (`x-aptix-final` says whether the turn ended too).
    pub is_final: bool,
    pub body: Value,
    pub headers: HashMap<String, String>,
    /// The request it answers, for replies that answer one submission (refusals).
    pub correlation_id: Option<String>,
}

pub struct Harness {
    pub id: String,
    pub settings: Arc<Settings>,
    pub deps: Arc<Deps>,
    pub sim: SimHandle,
    pub shutdown: CancellationToken,
    pub running: Option<tokio::task::JoinHandle<()>>,
    pub conn: lapin::Connection,
    pub publisher: Publisher,
    pub topology: Topology,
    pub dir: std::path::PathBuf,
    /// Sessions whose reply queues this test declared: deleted at teardown, since queues
    /// declared the documented way (no arguments) expire only by an operator's policy.
    pub sessions: std::sync::Mutex<std::collections::HashSet<SessionId>>,
}

/// Settings for a test: its own prefix, database and data directory; the simulator as LLM.
pub fn test_settings(id: &str, sim_url: &str, data_dir: &Path) -> Settings {
    let mut s = Settings::load(None).expect("default settings");
    s.amqp.url = ConnectionUrl::new(AMQP);
    s.amqp.prefix = format!("t-{id}");
    s.database.url = ConnectionUrl::new(format!("postgres://postgres@127.0.0.1:5432/aptix_t_{id}"));
    s.database.max_connections = 8;
    s.llm.base_url = ConnectionUrl::new(sim_url);
    s.llm.request_timeout_ms = 10_000;
    s.vector.data_dir = data_dir.join("vectors");
    s.pipeline.confirm_timeout_ms = 10_000;
    s
}

impl Harness {
    /// Starts everything, with `copies` consumers per stage.
    pub async fn start(copies: usize) -> Harness {
        Self::start_with(copies, |_| {}).await
    }

    pub async fn start_with(copies: usize, tweak: impl FnOnce(&mut Settings)) -> Harness {
        aptix::telemetry::init(aptix::telemetry::LogFormat::Pretty);
        let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        // Kept on drop: a failed test unwinds before its consumers stop, and the embedded
        // store flushes when the last of them lets go. `teardown` removes it.
        let dir = tempfile::tempdir().unwrap().keep();
        let sim = aptix::sim::start(SimConfig::default()).await.unwrap();
        let mut settings = test_settings(&id, &sim.base_url(), &dir);
        tweak(&mut settings);
        Store::create_database(settings.database.url.expose()).await.unwrap();
        let settings = Arc::new(settings);
        let deps = Arc::new(pipeline::build_deps(settings.clone(), None).await.unwrap());
        let repo = dir.join("repo");
        aptix::index::write_sample_repo(&repo).unwrap();
        let mut opts = IndexOptions::new(&repo, "fixture");
        opts.progress = false;
        let collection = settings.agent_context(None).unwrap().collection.clone();
        index_repository(&deps.retrieval, &collection, &opts).await.unwrap();
        // The configured broker (a cluster's node list in tests/cluster.rs).
        let conn = connect(settings.amqp.url.expose()).await.unwrap();
        let publisher = Publisher::connect(settings.amqp.url.expose()).await.unwrap();
        let topology = pipeline::topology(&settings);
        topology.declare(publisher.channel()).await.unwrap();
        let mut h = Harness {
            id,
            settings,
            deps,
            sim,
            shutdown: CancellationToken::new(),
            running: None,
            conn,
            publisher,
            topology,
            dir,
            sessions: Default::default(),
        };
        if copies > 0 {
            h.run(copies);
        }
        h
    }

    /// Starts `copies` consumers of every stage in this process.
    pub fn run(&mut self, copies: usize) {
        self.shutdown = CancellationToken::new();
        let (deps, token) = (self.deps.clone(), self.shutdown.clone());
        self.running = Some(tokio::spawn(async move {
            pipeline::run(deps, &aptix::stages::names(), copies, token).await
        }));
    }

    /// Starts `copies` consumers of every stage of `chain` (a pipeline with a stage of its own)
    /// in this process.
    #[allow(dead_code)]
    pub fn run_chain(&mut self, chain: aptix::stage::Chain<Deps>, copies: usize) {
        self.shutdown = CancellationToken::new();
        let (deps, token) = (self.deps.clone(), self.shutdown.clone());
        self.running = Some(tokio::spawn(async move {
            let names = chain.names();
            pipeline::run_chain(&chain, deps, &names, copies, token).await
        }));
    }

    /// Takes one message of `stage`'s queues and handles it as its worker would; false when
    /// they were empty.
    pub async fn drive(&self, stage: &'static str) -> bool {
        let stage = aptix::broker::StageName::new(stage);
        let handler = pipeline::handler(&self.deps, stage).unwrap();
        let settings = pipeline::runtime_settings(&self.settings, stage);
        let conn = (&self.conn, &self.publisher);
        aptix::broker::process_one(stage, &*handler, conn.0, conn.1, &settings).await.unwrap()
    }

    /// Stops the in-process consumers and waits for them.
    pub async fn stop_consumers(&mut self) {
        self.shutdown.cancel();
        if let Some(r) = self.running.take() {
            let _ = r.await;
        }
    }

    /// Publishes raw bytes to the entry exchange, routing key = the SessionId it names (if any).
    pub async fn publish_raw(&self, body: Vec<u8>) {
        let (session, _) = aptix::rules::turn_hint(&body);
        let key = session.map_or_else(|| "-".to_owned(), |s| s.to_string());
        let msg = self.topology.request(&key, uuid::Uuid::new_v4().to_string(), body);
        self.publisher.publish(&msg).await.unwrap();
    }

    /// Declares the session's reply queue as a client does (durable, no arguments; the server
    /// binds it), then publishes the request.
    /// Publishes a cancel of turn `t` of session `s` the documented way (`type` = `turn.cancel`).
    /// The session's current mode (`sessions.conversation_context_id`).
    pub async fn session_mode(&self, s: &str) -> Option<String> {
        sqlx::query_scalar("SELECT conversation_context_id FROM sessions WHERE id = $1::uuid")
            .bind(s)
            .fetch_one(self.deps.store.pool())
            .await
            .unwrap()
    }

    pub async fn cancel(&self, s: &str, t: &str) {
        let body = serde_json::to_vec(&serde_json::json!({"SessionId": s, "TurnId": t})).unwrap();
        let mut msg = self.topology.request(s, uuid::Uuid::new_v4().to_string(), body);
        msg.kind = "turn.cancel".into();
        self.publisher.publish(&msg).await.unwrap();
    }

    pub async fn submit(&self, request: &Value) {
        if let Some(s) = request
            .get("SessionId")
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<SessionId>().ok())
        {
            self.topology.declare_client_queue(self.publisher.channel(), &s).await.unwrap();
            self.sessions.lock().unwrap().insert(s);
        }
        self.publish_raw(serde_json::to_vec(request).unwrap()).await;
    }

    /// A consumer of the session's reply queue (manual acks), on a channel of its own.
    pub async fn consume_replies(&self, session: &str) -> (lapin::Channel, lapin::Consumer) {
        let ch = self.conn.create_channel().await.unwrap();
        let queue = format!("{}.session.{session}", self.topology.prefix());
        let consumer = ch
            .basic_consume(
                queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        (ch, consumer)
    }

    /// Reads the session's reply queue until `finals` final replies arrived (or the timeout).
    pub async fn replies(&self, session: &str, finals: usize, timeout: Duration) -> Vec<ReplyMsg> {
        let enough = |got: &[ReplyMsg]| got.iter().filter(|r| r.is_final).count() >= finals;
        self.read_until(session, timeout, enough).await
    }

    /// Reads (and acks) the session's reply queue until `done` holds for what was read, or the
    /// timeout.
    pub async fn read_until(
        &self,
        session: &str,
        timeout: Duration,
        done: impl Fn(&[ReplyMsg]) -> bool,
    ) -> Vec<ReplyMsg> {
        let (ch, mut consumer) = self.consume_replies(session).await;
        let mut out = Vec::new();
        let deadline = tokio::time::Instant::now() + timeout;
        while !done(&out) {
            let next = tokio::time::timeout_at(deadline, consumer.next()).await;
            let Ok(Some(Ok(d))) = next else { break };
            d.ack(BasicAckOptions::default()).await.unwrap();
            out.push(reply_of(&d));
        }
        let _ = ch.close(200, "done".into()).await;
        out
    }

    /// Messages in the dead-letter queues (the shared one, then each tenant's), with their
    /// headers, taken.
    pub async fn dead_letters(&self) -> Vec<(HashMap<String, String>, Vec<u8>)> {
        let mut out = Vec::new();
        for queue in aptix::dead::queues(&self.settings) {
            out.extend(self.take_all(&queue).await);
        }
        out
    }

    /// Every message of `queue`, taken, with its headers; none when it does not exist.
    pub async fn take_all(&self, queue: &str) -> Vec<(HashMap<String, String>, Vec<u8>)> {
        // A queue that does not exist closes the channel it was asked on.
        let ch = self.conn.create_channel().await.unwrap();
        let mut out = Vec::new();
        loop {
            match ch.basic_get(queue.into(), BasicGetOptions { no_ack: true }).await {
                Ok(Some(m)) => out.push((headers(&m.delivery), m.delivery.data.clone())),
                Ok(None) => break,
                Err(e) if e.to_string().contains("NOT_FOUND") => break,
                Err(e) => panic!("basic.get {queue}: {e}"),
            }
        }
        out
    }

    /// Messages ready in `queue` (0 when it does not exist), read with a passive declare.
    pub async fn peek_count(&self, queue: &str) -> u32 {
        let ch = self.conn.create_channel().await.unwrap();
        let options = lapin::options::QueueDeclareOptions { passive: true, ..Default::default() };
        match ch.queue_declare(queue.into(), options, Default::default()).await {
            Ok(q) => q.message_count(),
            Err(_) => 0,
        }
    }

    /// The records of a session, oldest first, as the store reads them (`aptix session show`):
    /// what was written, with anything kept by reference read back in place.
    pub async fn records(&self, session: &str) -> Vec<Value> {
        let id: aptix::contracts::SessionId = session.parse().unwrap();
        let view = self.deps.store.session_view(&id).await.unwrap();
        view.map(|v| v.records).unwrap_or_default()
    }

    /// Tears down: consumers, queues and exchanges of the prefix, the database, the simulator.
    pub async fn teardown(mut self) {
        self.stop_consumers().await;
        let ch = self.conn.create_channel().await.unwrap();
        let sessions: Vec<SessionId> = self.sessions.lock().unwrap().drain().collect();
        delete_topology(&ch, &self.topology, &sessions).await;
        delete_leftovers(&self.conn, self.topology.prefix()).await;
        self.deps.store.close().await;
        let url = self
            .settings
            .database
            .url
            .expose()
            .replace(&format!("aptix_t_{}", self.id), "postgres");
        if let Ok(pool) = sqlx::PgPool::connect(&url).await {
            let _ =
                sqlx::query(&format!("DROP DATABASE IF EXISTS aptix_t_{} WITH (FORCE)", self.id))
                    .execute(&pool)
                    .await;
        }
        self.sim.shutdown().await;
        drop(self.deps);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn headers(d: &lapin::message::Delivery) -> HashMap<String, String> {
    d.properties
        .headers()
        .as_ref()
        .map(|t| {
            t.inner()
                .iter()
                .filter_map(|(k, v)| {
                    use lapin::types::AMQPValue;
                    let text = match v {
                        AMQPValue::LongString(s) => s.to_string(),
                        AMQPValue::Boolean(b) => b.to_string(),
                        AMQPValue::LongLongInt(i) => i.to_string(),
                        AMQPValue::LongInt(i) => i.to_string(),
                        _ => return None,
                    };
                    Some((k.to_string(), text))
                })
                .collect()
        })
        .unwrap_or_default()
}

pub fn reply_of(d: &lapin::message::Delivery) -> ReplyMsg {
    let h = headers(d);
    ReplyMsg {
        turn_id: h.get("x-aptix-turn-id").cloned().unwrap_or_default(),
        message_id: d.properties.message_id().as_ref().map(|m| m.to_string()).unwrap_or_default(),
        is_final: h.get("x-aptix-kind").map(String::as_str) == Some("reply"),
        body: serde_json::from_slice(&d.data).unwrap_or(Value::Null),
        headers: h.clone(),
        correlation_id: d.properties.correlation_id().as_ref().map(|c| c.to_string()),
    }
}

/// A user turn request.
pub fn user_turn(session: &str, turn: &str, instruction: &str) -> Value {
    serde_json::json!({"SessionId": session, "TurnId": turn, "Instruction": instruction})
}

pub fn new_session() -> String {
    uuid::Uuid::new_v4().to_string()
}

impl Harness {
    /// Environment for an `aptix` child process that joins this test's pipeline. The child gets
    /// its own vector directory: the embedded store is locked by the process that opens it.
    pub fn child_env(&self) -> Vec<(String, String)> {
        let s = &self.settings;
        vec![
            ("APTIX__AMQP__PREFIX".into(), s.amqp.prefix.clone()),
            ("APTIX__AMQP__URL".into(), s.amqp.url.expose().to_owned()),
            ("APTIX__AMQP__INGRESS_PARTITIONS".into(), s.amqp.ingress_partitions.to_string()),
            ("APTIX__AMQP__STAGE_PARTITIONS".into(), s.amqp.stage_partitions.to_string()),
            ("APTIX__AMQP__QUEUE_TYPE".into(), format!("{:?}", s.amqp.queue_type).to_lowercase()),
            ("APTIX__DATABASE__URL".into(), s.database.url.expose().to_owned()),
            ("APTIX__LLM__BASE_URL".into(), s.llm.base_url.expose().to_owned()),
            (
                "APTIX__VECTOR__DATA_DIR".into(),
                self.dir.join("child-vectors").display().to_string(),
            ),
            ("APTIX__TELEMETRY__METRICS_LISTEN".into(), "127.0.0.1:0".into()),
            ("RUST_LOG".into(), "warn".into()),
        ]
    }

    /// Runs `aptix ARGS` against this pipeline to its end: its exit code and stdout.
    #[allow(dead_code)]
    pub fn aptix(&self, args: &[&str]) -> (i32, String) {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_aptix"))
            .args(args)
            .env_remove("APTIX_CONFIG")
            .envs(self.child_env())
            .output()
            .expect("run aptix");
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts `aptix ARGS` as a child process of this pipeline.
    pub fn spawn_child(&self, args: &[&str]) -> std::process::Child {
        std::process::Command::new(env!("CARGO_BIN_EXE_aptix"))
            .args(args)
            .env_remove("APTIX_CONFIG")
            .envs(self.child_env())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn aptix")
    }
}

/// A fresh prefix's pipeline topology with `layout` (ingress partitions, queue type), declared,
/// and `ids` published to its first ingress queue; for tests that drive the broker runtime
/// without a [`Harness`].
pub struct Declared {
    pub topology: Topology,
    pub publisher: Publisher,
    pub conn: lapin::Connection,
    /// The first ingress queue, holding the published `ids`.
    pub ingress: String,
}

pub async fn declared(layout: (u16, aptix::config::QueueType), ids: &[&str]) -> Declared {
    let prefix = format!("t-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let topology =
        Topology::new(&prefix).with_stages(&aptix::stages::names()).with_layout(layout.0, layout.1);
    let publisher = Publisher::connect(AMQP).await.unwrap();
    topology.declare(publisher.channel()).await.unwrap();
    let conn = connect(AMQP).await.unwrap();
    let ingress = topology.ingress_queues()[0].clone();
    publish_ids(&conn, &ingress, ids).await;
    Declared { topology, publisher, conn, ingress }
}

/// Runtime settings for a stage consuming `topology` from the test broker.
pub fn runtime_settings(topology: &Topology) -> aptix::broker::RuntimeSettings {
    aptix::broker::RuntimeSettings {
        amqp_url: AMQP.to_owned(),
        topology: topology.clone(),
        prefetch: 1,
        max_attempts: 3,
        max_redeliveries: 3,
        confirm_timeout: Duration::from_secs(10),
        max_message_bytes: 16 << 20,
        keys: None,
    }
}

/// Publishes one empty JSON message with each of `ids` (as message id) to `queue`, confirmed.
pub async fn publish_ids(conn: &lapin::Connection, queue: &str, ids: &[&str]) {
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(Default::default()).await.unwrap();
    for id in ids {
        let props = lapin::BasicProperties::default().with_message_id((*id).into());
        let options = lapin::options::BasicPublishOptions::default();
        let confirm = ch.basic_publish("".into(), queue.into(), options, b"{}", props);
        assert!(confirm.await.unwrap().await.unwrap().is_ack());
    }
    let _ = ch.close(200, "published".into()).await;
}

/// Deletes what declaring `topology` made, and the reply queues of `sessions`.
pub async fn delete_topology(ch: &lapin::Channel, topology: &Topology, sessions: &[SessionId]) {
    let mut queues: Vec<String> =
        aptix::stages::names().iter().flat_map(|s| topology.consumed_queues(*s)).collect();
    queues.extend(topology.ingress_queues());
    queues.push(topology.dead());
    queues.push(topology.unrouted());
    queues.extend(aptix::broker::RETRY_TIERS_MS.iter().map(|t| topology.delay_exchange(*t)));
    queues.extend(sessions.iter().map(|s| topology.session_queue(s)));
    for q in queues {
        let _ = ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default()).await;
    }
    let mut exchanges = vec![topology.requests_exchange(), topology.replies_exchange()];
    if topology.partitions() > 1 {
        exchanges.push(topology.partition_exchange(topology.partitions()));
    }
    for stage in aptix::stages::names() {
        exchanges.extend(topology.stage_layouts(stage).into_iter().map(|l| l.exchange));
    }
    exchanges.extend(aptix::broker::RETRY_TIERS_MS.iter().map(|t| topology.delay_exchange(*t)));
    for e in exchanges {
        let _ = ch.exchange_delete(e.as_str().into(), Default::default()).await;
    }
}

/// Deletes every queue of `prefix` the broker still has (tenants' reply queues, queues a test
/// declared as a client would), as RabbitMQ's management API lists them: a test leaves the
/// broker as it found it. Without the API (a broker without the plugin) nothing more is done.
pub async fn delete_leftovers(conn: &lapin::Connection, prefix: &str) {
    let api = "http://guest:guest@127.0.0.1:15672/api/queues/%2f?columns=name";
    let client = aptix::http::client().timeout(Duration::from_secs(5)).build().unwrap();
    let Ok(listed) = client.get(api).send().await else { return };
    let Ok(queues) = listed.json::<Vec<Value>>().await else { return };
    let ours = format!("{prefix}.");
    for q in queues.iter().filter_map(|q| q["name"].as_str()).filter(|n| n.starts_with(&ours)) {
        if let Ok(ch) = conn.create_channel().await {
            let _ = ch.queue_delete(q.into(), QueueDeleteOptions::default()).await;
        }
    }
}

/// Sends SIGTERM and waits for the process to exit.
pub fn terminate(child: &mut std::process::Child) -> std::process::ExitStatus {
    let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    child.wait().expect("wait")
}
