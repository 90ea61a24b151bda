//! The load driver: publishes real `AgentExecuteRequest` JSON to `<prefix>.requests` and reads
//! each session's reply queue, as a backend would. The same driver feeds the relay and the
//! pipeline, so both are measured through identical client code.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use lapin::options::BasicConsumeOptions;
use lapin::types::FieldTable;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::requests::Bodies;
use aptix::broker::{Publisher, Topology};
use aptix::contracts::{SessionId, TenantName};

/// How one turn ended, as the client saw it.
#[derive(Debug, Clone)]
pub struct TurnSample {
    /// Its session.
    pub session: SessionId,
    /// The benchmark turn id.
    pub turn_id: String,
    /// `start` as wall-clock time, to compare with database timestamps.
    pub wall_start: chrono::DateTime<chrono::Utc>,
    /// When it was published (open loop: when it was scheduled to be).
    pub start: Instant,
    /// When its final reply arrived (`None`: no reply before the timeout).
    pub end: Option<Instant>,
    /// How long after `start` the driver began to publish it: in the open loop, the load
    /// generator's own lateness (its timer's millisecond ticks, its task's wake-up), which
    /// the latency from the scheduled time includes for the relay and the pipeline alike.
    pub late: Duration,
    /// Whether the reply was `Successful`.
    pub ok: bool,
    /// The reply's `Usage`: input tokens, and those the provider's cache served.
    pub tokens: Tokens,
}

/// Input tokens of a turn, and how many of them were cached.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tokens {
    /// `Usage.InputTokens`.
    pub input: u64,
    /// `Usage.CachedInputTokens`.
    pub cached: u64,
}

impl TurnSample {
    /// Publish-to-final-reply time.
    pub fn latency(&self) -> Option<Duration> {
        self.end.map(|e| e.saturating_duration_since(self.start))
    }
}

/// A final reply as the driver records it.
#[derive(Debug, Clone, Copy)]
pub struct ReplyInfo {
    /// Arrival.
    pub at: Instant,
    /// `Successful` in the body.
    pub ok: bool,
    /// Body size.
    pub bytes: usize,
    /// Its `Usage`.
    pub tokens: Tokens,
}

type Waiters = Arc<Mutex<HashMap<String, oneshot::Sender<ReplyInfo>>>>;

/// Publisher plus reply consumers for a set of sessions.
pub struct Driver {
    publisher: Publisher,
    topology: Topology,
    waiters: Waiters,
    channels: Vec<lapin::Channel>,
    tasks: Vec<JoinHandle<()>>,
    /// Sent as `user_id` (a tenant's driver).
    user_id: Option<String>,
    /// Request bodies (with the active file each carries, if any).
    bodies: Bodies,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("prefix", &self.topology.prefix()).finish_non_exhaustive()
    }
}

#[derive(serde::Deserialize)]
struct Outcome {
    #[serde(rename = "Successful", default)]
    successful: bool,
    #[serde(rename = "Result", default)]
    result: Option<OutcomeResult>,
}

#[derive(serde::Deserialize)]
struct OutcomeResult {
    #[serde(rename = "Usage", default)]
    usage: Option<OutcomeUsage>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct OutcomeUsage {
    input_tokens: u64,
    cached_input_tokens: u64,
}

impl Outcome {
    fn tokens(&self) -> Tokens {
        let usage = self.result.as_ref().and_then(|r| r.usage.as_ref());
        usage.map_or_else(Tokens::default, |u| Tokens {
            input: u.input_tokens,
            cached: u.cached_input_tokens,
        })
    }
}

impl Driver {
    /// Declares every session's reply queue (as a client must before publishing) and consumes
    /// them (automatic acks: the client's own bookkeeping is not what is measured).
    pub async fn new(
        conn: &lapin::Connection,
        amqp_url: &str,
        topology: &Topology,
        sessions: &[SessionId],
    ) -> anyhow::Result<Driver> {
        Self::new_as(conn, amqp_url, topology, sessions, None).await
    }

    /// Like [`Driver::new`], for a tenant: its reply queues, and `user_id` (the user of
    /// `amqp_url`) on every request.
    pub async fn new_as(
        conn: &lapin::Connection,
        amqp_url: &str,
        topology: &Topology,
        sessions: &[SessionId],
        tenant: Option<TenantName>,
    ) -> anyhow::Result<Driver> {
        let publisher = Publisher::connect(amqp_url).await?;
        let user_id = tenant.as_ref().map(|_| aptix::broker::client::url_user(amqp_url));
        let waiters: Waiters = Arc::new(Mutex::new(HashMap::new()));
        let mut channels = Vec::new();
        let mut tasks = Vec::new();
        for group in sessions.chunks(250) {
            let ch = conn.create_channel().await?;
            for s in group {
                topology.declare_session_of(&ch, tenant.as_ref(), s).await?;
                let queue = topology.session_queue_of(tenant.as_ref(), s);
                let mut consumer = ch
                    .basic_consume(
                        queue.as_str().into(),
                        "".into(),
                        BasicConsumeOptions { no_ack: true, ..Default::default() },
                        FieldTable::default(),
                    )
                    .await?;
                let waiters = waiters.clone();
                tasks.push(tokio::spawn(async move {
                    while let Some(Ok(d)) = consumer.next().await {
                        let at = Instant::now();
                        let header = |k: &str| {
                            aptix::broker::header_text(d.properties.headers().as_ref(), k)
                        };
                        if header("x-aptix-final").as_deref() != Some("true") {
                            continue;
                        }
                        let Some(turn) = header("x-aptix-turn-id") else { continue };
                        let outcome = serde_json::from_slice::<Outcome>(&d.data).ok();
                        let ok = outcome.as_ref().is_some_and(|o| o.successful);
                        let tokens = outcome.as_ref().map(Outcome::tokens).unwrap_or_default();
                        let waiter = waiters.lock().ok().and_then(|mut w| w.remove(&turn));
                        if let Some(tx) = waiter {
                            let _ = tx.send(ReplyInfo { at, ok, bytes: d.data.len(), tokens });
                        }
                    }
                }));
            }
            channels.push(ch);
        }
        let topology = topology.clone();
        Ok(Driver {
            publisher,
            topology,
            waiters,
            channels,
            tasks,
            user_id,
            bodies: Bodies::default(),
        })
    }

    /// Every request carries an active file of `bytes` bytes from now on.
    pub fn with_file(mut self, bytes: usize) -> Driver {
        self.bodies = Bodies::with_file(bytes);
        self
    }

    /// Publishes one request (with confirm) and returns where its final reply will arrive.
    pub async fn submit(
        &self,
        session: &SessionId,
        turn_id: &str,
        body: Vec<u8>,
    ) -> anyhow::Result<oneshot::Receiver<ReplyInfo>> {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut w) = self.waiters.lock() {
            w.insert(turn_id.to_owned(), tx);
        }
        // To the entry exchange, as clients publish (whatever the ingress layout behind it). The
        // ids travel as headers too, so the relay can route without parsing the body; the
        // pipeline ignores them (validate reads the body).
        let id = format!("bench:{turn_id}");
        let mut msg = self
            .topology
            .request(&session.to_string(), id, body)
            .header("x-aptix-session-id", session.to_string())
            .header("x-aptix-turn-id", turn_id);
        msg.user_id.clone_from(&self.user_id);
        self.publisher.publish(&msg).await?;
        Ok(rx)
    }

    /// Publishes one turn and waits for its final reply.
    pub async fn turn(
        &self,
        session: &SessionId,
        turn_id: &str,
        start: Instant,
        timeout: Duration,
    ) -> TurnSample {
        let late = Instant::now().saturating_duration_since(start);
        let since_start = chrono::Duration::from_std(late).unwrap_or_default();
        let wall_start = chrono::Utc::now() - since_start;
        let body = self.bodies.request(session, turn_id);
        let reply = match self.submit(session, turn_id, body).await {
            Ok(rx) => tokio::time::timeout(timeout, rx).await.ok().and_then(Result::ok),
            Err(error) => {
                tracing::warn!(%error, turn = turn_id, "publish failed");
                None
            }
        };
        if reply.is_none() {
            if let Ok(mut w) = self.waiters.lock() {
                w.remove(turn_id);
            }
        }
        TurnSample {
            session: *session,
            turn_id: turn_id.to_owned(),
            wall_start,
            start,
            end: reply.map(|r| r.at),
            late,
            ok: reply.is_some_and(|r| r.ok),
            tokens: reply.map(|r| r.tokens).unwrap_or_default(),
        }
    }

    /// Stops consuming.
    pub async fn close(self) {
        for ch in &self.channels {
            let _ = ch.close(200, "bench done".into()).await;
        }
        let _ = self.publisher.channel().close(200, "bench done".into()).await;
        for t in self.tasks {
            t.abort();
        }
    }
}

/// New random session ids.
pub fn sessions(n: usize) -> Vec<SessionId> {
    (0..n).map(|_| SessionId::new(uuid::Uuid::new_v4())).collect()
}

/// Turn ids unique within an environment.
#[derive(Debug, Default)]
pub struct TurnIds(std::sync::atomic::AtomicU64);

impl TurnIds {
    /// The next id, `b000001`, `b000002`, ...
    pub fn next(&self) -> String {
        format!("b{:06}", self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1)
    }
}

/// Closed loop: every session sends a turn, waits for its final reply, sends the next, until
/// `duration` has passed since the start (turns in flight then are still awaited). Session `i`
/// of `n` sends its first turn at `i/n × ramp`, so a fixed LLM latency does not keep all
/// sessions in lockstep.
pub async fn closed_loop(
    driver: &Arc<Driver>,
    sessions: &[SessionId],
    ids: &Arc<TurnIds>,
    duration: Duration,
    ramp: Duration,
    timeout: Duration,
) -> (Instant, Vec<TurnSample>) {
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::with_capacity(sessions.len());
    let n = sessions.len().max(1) as f64;
    for (i, s) in sessions.iter().enumerate() {
        let (driver, ids, s) = (driver.clone(), ids.clone(), *s);
        let first = start + ramp.mul_f64(i as f64 / n);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(first).await;
            let mut out = Vec::new();
            while Instant::now() < deadline {
                let id = ids.next();
                let sample = driver.turn(&s, &id, Instant::now(), timeout).await;
                let failed = sample.end.is_none();
                out.push(sample);
                if failed {
                    break;
                }
            }
            out
        }));
    }
    let mut samples = Vec::new();
    for t in tasks {
        if let Ok(mut s) = t.await {
            samples.append(&mut s);
        }
    }
    (start, samples)
}

/// Open loop: `rate` turns per second for `duration`, round-robin over `sessions`, each
/// published at its scheduled time whatever happened to earlier ones; latency is measured from
/// the scheduled time (no coordinated omission).
///
/// The schedule is kept by a blocking thread's `sleep`, not tokio's timer: the timer fires on
/// the first whole-millisecond tick after a deadline, which put the driver about 1 ms behind
/// the schedule at the median, and that lateness is counted in every turn's latency.
pub async fn open_loop(
    driver: &Arc<Driver>,
    sessions: &[SessionId],
    ids: &Arc<TurnIds>,
    rate: f64,
    duration: Duration,
    timeout: Duration,
) -> (Instant, Vec<TurnSample>) {
    let total = (rate * duration.as_secs_f64()).round() as usize;
    let start = Instant::now() + Duration::from_millis(50);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (driver, sessions, ids) = (driver.clone(), sessions.to_vec(), ids.clone());
    let runtime = tokio::runtime::Handle::current();
    let pacer = tokio::task::spawn_blocking(move || {
        for i in 0..total {
            let at = start + Duration::from_secs_f64(i as f64 / rate.max(1e-3));
            sleep_until(at);
            if tx.is_closed() {
                return; // the run was dropped: start nothing more
            }
            let (driver, s, id) = (driver.clone(), sessions[i % sessions.len().max(1)], ids.next());
            let task = runtime.spawn(async move { driver.turn(&s, &id, at, timeout).await });
            if tx.send(task).is_err() {
                return;
            }
        }
    });
    let mut samples = Vec::with_capacity(total);
    while let Some(task) = rx.recv().await {
        if let Ok(s) = task.await {
            samples.push(s);
        }
    }
    if let Err(e) = pacer.await {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    (start, samples)
}

/// Blocks the thread until `at`.
fn sleep_until(at: Instant) {
    let wait = at.saturating_duration_since(Instant::now());
    if !wait.is_zero() {
        std::thread::sleep(wait);
    }
}

/// Completed turns per second among replies that arrived in `[from, to]`.
pub fn throughput(samples: &[TurnSample], from: Instant, to: Instant) -> f64 {
    let n = samples.iter().filter(|s| s.ok && s.end.is_some_and(|e| e >= from && e <= to)).count();
    n as f64 / to.saturating_duration_since(from).as_secs_f64().max(1e-9)
}
