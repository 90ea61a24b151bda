//! Operator and backend commands over the running system: `migrate`, `submit` and
//! `session show`.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use crate::broker::client::SessionClient;
use crate::config::Settings;
use crate::contracts::{SessionId, TenantName};
use crate::pipeline;
use crate::store::Store;
use crate::worker::block_on;
use anyhow::Context as _;

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

/// `aptix session rename ID NAME`: exit 0 renamed, 1 no such session, 2 a bad name.
pub fn session_rename(settings: Settings, id: &str, name: &str) -> anyhow::Result<ExitCode> {
    let session: SessionId = id.parse().map_err(|(_, m): (_, String)| anyhow::anyhow!(m))?;
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 80 || name.chars().any(char::is_control) {
        eprintln!("a session name is 1-80 characters without control characters");
        return Ok(ExitCode::from(2));
    }
    block_on(async move {
        let store = Store::connect(settings.database.url.expose(), 1)?;
        if store.rename_session(&session, name).await? {
            println!("session {session} is now called {name:?}");
            Ok(ExitCode::SUCCESS)
        } else {
            eprintln!("no session {session}");
            Ok(ExitCode::from(1))
        }
    })
}

/// `aptix submit FILE [--wait] [--timeout SECS]`: publish a request; with `--wait`, print each
/// reply message of that turn as one JSON line until the final one. Exit 0 on success, 1 on an
/// error reply, 2 on timeout.
pub fn submit(
    settings: Settings,
    file: &Path,
    wait: bool,
    timeout: Duration,
    tenant: Option<TenantName>,
) -> anyhow::Result<ExitCode> {
    let body = super::read_input(file).with_context(|| format!("reading {}", file.display()))?;
    let (session, turn) = crate::rules::turn_hint(&body);
    block_on(async move {
        let topology = pipeline::topology(&settings);
        let url = settings.amqp.url.expose();
        let connected = match tenant {
            Some(t) => SessionClient::connect_as(url, topology, t).await,
            None => SessionClient::connect(url, topology).await,
        };
        let client = connected.with_context(|| {
                format!(
                    "connecting to RabbitMQ at {} (is it running? `docker compose up -d rabbitmq postgres`)",
                    settings.amqp.url
                )
            })?;
        let waiting = match (wait, session) {
            (true, Some(s)) => Some(s),
            (true, None) => anyhow::bail!("--wait needs a request with a valid SessionId"),
            (false, _) => None,
        };
        if let Some(s) = &waiting {
            // Declared before publishing so no reply can arrive before its queue exists.
            client.open_session(s).await?;
        }
        let id = format!("submit:{}", uuid::Uuid::new_v4());
        let key = session.map_or_else(|| "-".to_owned(), |s| s.to_string());
        client.submit(&key, id, body).await?;
        let Some(session) = waiting else {
            eprintln!("published to exchange {}", client.requests_exchange());
            return Ok(ExitCode::SUCCESS);
        };
        match tokio::time::timeout(timeout, follow(&client, &session, turn.as_deref())).await {
            Ok(result) => result,
            Err(_) => {
                eprintln!("no final reply within {} s", timeout.as_secs());
                Ok(ExitCode::from(2))
            }
        }
    })
}

async fn follow(
    client: &SessionClient,
    session: &SessionId,
    turn: Option<&str>,
) -> anyhow::Result<ExitCode> {
    // Replies of other turns are left unacked and go back to the queue when we disconnect.
    let mut replies = client.replies(session, 256).await?;
    while let Some(message) = replies.next().await {
        let message = message?;
        if turn.is_some() && message.header("x-aptix-turn-id") != turn {
            continue;
        }
        println!("{}", String::from_utf8_lossy(&message.body));
        message.ack().await?;
        // Any reply (not a delta) ends the wait: a tool-call reply asks the caller to act.
        if message.is_reply() {
            let reply: serde_json::Value =
                serde_json::from_slice(&message.body).unwrap_or_default();
            let ok = reply.get("Successful").and_then(serde_json::Value::as_bool) == Some(true);
            return Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) });
        }
    }
    anyhow::bail!("the reply queue consumer stopped")
}
