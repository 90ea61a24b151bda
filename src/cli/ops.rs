//! Operator and backend commands over the running system: `worker`, `run`, `migrate`,
//! `submit` and `session show`.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures_util::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;

use crate::broker::{connect, Publisher, StageName};
use crate::config::Settings;
use crate::contracts::SessionId;
use crate::pipeline;
use crate::store::Store;

/// Runs an async command on a fresh multi-threaded runtime.
pub fn block_on<F: std::future::Future<Output = anyhow::Result<ExitCode>>>(f: F) -> anyhow::Result<ExitCode> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(f)
}

/// `aptix worker STAGE` / `aptix run`: consume until SIGINT or SIGTERM.
pub fn run_stages(settings: Settings, stages: &[StageName], copies: usize) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let shutdown = pipeline::shutdown_on_signals();
        let deps = pipeline::build_deps_patiently(Arc::new(settings), &shutdown)
            .await
            .context("starting the pipeline")?;
        let Some(deps) = deps else { return Ok(ExitCode::SUCCESS) };
        let otlp = deps.settings.telemetry.otlp_endpoint.expose().to_owned();
        if !otlp.is_empty() {
            let service = match stages {
                [one] => format!("aptix-{}", one.as_str()),
                _ => "aptix".to_owned(),
            };
            crate::otlp::install(&otlp, &service).context("starting OTLP export")?;
        }
        let listen = deps.settings.telemetry.metrics_listen.clone();
        if !listen.is_empty() {
            tokio::spawn(crate::metrics::serve(listen, Some(deps.store.clone()), shutdown.clone()));
        }
        pipeline::run(Arc::new(deps), stages, copies, shutdown).await;
        crate::otlp::flush().await;
        Ok(ExitCode::SUCCESS)
    })
}

/// `aptix migrate`: create the database if needed and apply migrations.
pub fn migrate(settings: Settings) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let url = settings.database.url.expose();
        Store::create_database(url)
            .await
            .with_context(|| format!("creating the database at {}", settings.database.url))?;
        Store::connect(url, 1)?.migrate().await.context("applying migrations")?;
        println!("database {} is migrated", settings.database.url);
        Ok(ExitCode::SUCCESS)
    })
}

/// `aptix session show ID`: the session, its turns and records as JSON.
pub fn session_show(settings: Settings, id: &str) -> anyhow::Result<ExitCode> {
    let session: SessionId = id.parse().map_err(|(_, m): (_, String)| anyhow::anyhow!(m))?;
    block_on(async move {
        let store = Store::connect(settings.database.url.expose(), 1)?;
        match store.session_view(&session).await? {
            Some(view) => {
                println!("{}", serde_json::to_string_pretty(&view)?);
                Ok(ExitCode::SUCCESS)
            }
            None => {
                eprintln!("no session {session}");
                Ok(ExitCode::from(1))
            }
        }
    })
}

/// `aptix submit FILE [--wait] [--timeout SECS]`: publish a request; with `--wait`, print each
/// reply message of that turn as one JSON line until the final one. Exit 0 on success, 1 on an
/// error reply, 2 on timeout.
pub fn submit(settings: Settings, file: &Path, wait: bool, timeout: Duration) -> anyhow::Result<ExitCode> {
    let body = super::read_input(file).with_context(|| format!("reading {}", file.display()))?;
    let (session, turn) = crate::validate::turn_hint(&body);
    block_on(async move {
        let topology = pipeline::topology(&settings);
        let conn = connect(settings.amqp.url.expose()).await.with_context(|| {
            format!(
                "connecting to RabbitMQ at {} (is it running? `docker compose up -d rabbitmq postgres`)",
                settings.amqp.url
            )
        })?;
        let publisher = Publisher::connect(settings.amqp.url.expose()).await?;
        topology.declare(publisher.channel()).await?;
        let waiting = match (wait, session) {
            (true, Some(s)) => Some(s),
            (true, None) => anyhow::bail!("--wait needs a request with a valid SessionId"),
            (false, _) => None,
        };
        if let Some(s) = &waiting {
            // Declared before publishing so no reply can arrive before its queue exists.
            topology.declare_client_queue(publisher.channel(), s).await?;
        }
        let id = format!("submit:{}", uuid::Uuid::new_v4());
        let key = session.map_or_else(|| "-".to_owned(), |s| s.to_string());
        publisher.publish(&topology.request(&key, id, body)).await?;
        let Some(session) = waiting else {
            eprintln!("published to exchange {}", topology.requests_exchange());
            return Ok(ExitCode::SUCCESS);
        };
        let queue = topology.session_queue(&session);
        match tokio::time::timeout(timeout, follow(&conn, &queue, turn.as_deref())).await {
            Ok(result) => result,
            Err(_) => {
                eprintln!("no final reply within {} s", timeout.as_secs());
                Ok(ExitCode::from(2))
            }
        }
    })
}

async fn follow(conn: &lapin::Connection, queue: &str, turn: Option<&str>) -> anyhow::Result<ExitCode> {
    let ch = conn.create_channel().await?;
    // Replies of other turns are left unacked and go back to the queue when we disconnect.
    ch.basic_qos(256, BasicQosOptions::default()).await?;
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "aptix-submit".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    while let Some(delivery) = consumer.next().await {
        let delivery = delivery?;
        let header = |k: &str| crate::broker::header_text(delivery.properties.headers().as_ref(), k);
        if turn.is_some() && header("x-aptix-turn-id").as_deref() != turn {
            continue;
        }
        println!("{}", String::from_utf8_lossy(&delivery.data));
        delivery.ack(BasicAckOptions::default()).await?;
        // Any reply (not a delta) ends the wait: a tool-call reply asks the caller to act.
        if header("x-aptix-kind").as_deref() == Some("reply") {
            let reply: serde_json::Value = serde_json::from_slice(&delivery.data).unwrap_or_default();
            let ok = reply.get("Successful").and_then(serde_json::Value::as_bool) == Some(true);
            return Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) });
        }
    }
    anyhow::bail!("the reply queue consumer stopped")
}
