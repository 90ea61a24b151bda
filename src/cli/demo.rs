//! `aptix demo`: the whole system on one machine, as a newcomer's first command. It migrates a
//! fresh database, indexes this repository's source into the embedded vector store, starts all
//! five stages and the Responses simulator (or uses OpenAI when `OPENAI_API_KEY` is set), then
//! plays a conversation through RabbitMQ like a backend would: a question, a follow-up with a
//! file, a client tool round trip, and a streamed turn; finally it shows what was stored.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::broker::client::SessionClient;
use crate::config::{ConnectionUrl, Settings};
use crate::contracts::SessionId;
use crate::index::{index_repository, IndexOptions};
use crate::pipeline;
use crate::store::Store;

/// Runs the demo; exit 0 when every turn got its reply.
pub fn run(settings: Settings) -> anyhow::Result<ExitCode> {
    let runtime = crate::worker::pipeline_runtime(settings.pipeline.worker_threads)?;
    runtime.block_on(demo(settings))
}

async fn demo(mut settings: Settings) -> anyhow::Result<ExitCode> {
    if let Some(problem) = unreachable(&settings).await {
        eprintln!("{problem}");
        return Ok(ExitCode::from(2));
    }
    let work = std::env::temp_dir().join(format!("aptix-demo-{}", std::process::id()));
    let sim = prepare(&mut settings, &work).await?;
    let settings = Arc::new(settings);
    let deps = Arc::new(
        pipeline::build_deps(settings.clone(), None).await.context("starting the pipeline")?,
    );
    let source = Path::new("src");
    if source.is_dir() {
        let mut opts = IndexOptions::new(source, "aptix");
        opts.progress = false;
        let collection =
            settings.agent_context(None).map(|a| a.collection.clone()).unwrap_or_default();
        let summary = index_repository(&deps.retrieval, &collection, &opts).await?;
        println!("== indexed ./src into the embedded vector store\n{summary}\n");
    }
    let shutdown = CancellationToken::new();
    let listen = settings.telemetry.metrics_listen.clone();
    if !listen.is_empty() {
        // Serves the files that server tools write, where their FileRef URLs point.
        let files = Some(crate::files::router(deps.store.clone(), deps.settings.pipeline.keys()));
        tokio::spawn(crate::metrics::serve(listen, None, files, shutdown.clone()));
    }
    let (stages, d, token) = (crate::stages::names(), deps.clone(), shutdown.clone());
    let running = tokio::spawn(async move { pipeline::run(d, &stages, 1, token).await });
    let client = Client::connect(&settings).await?;
    let session = SessionId::random();
    println!("== session {session}\n");
    let mut tally = Tally::default();
    let ok = conversation(&client, &session, &mut tally).await;
    tally.print(settings.assemble.prompt_cache_key);
    shutdown.cancel();
    let _ = running.await;
    show_stored(&deps.store, &session).await?;
    if let Some(sim) = sim {
        sim.shutdown().await;
    }
    // The embedded store flushes when the last handle drops: before its directory goes.
    drop(deps);
    let _ = std::fs::remove_dir_all(&work);
    // Commands to paste: the demo's database, not the configured one, and a sign-in for the
    // console, which serves nothing without one.
    let token = format!("{:032x}", rand::random::<u128>());
    println!(
        "\nInspect it again with:\n  APTIX__DATABASE__URL='{}' aptix session show {session}",
        settings.database.url
    );
    println!(
        "Or look at it in the console:\n  APTIX__DATABASE__URL='{}' APTIX__AMQP__PREFIX={} APTIX__CONSOLE__VIEWER_TOKEN={token} aptix console\n  then open http://{}/sessions/{session} and sign in as `viewer` with {token}",
        settings.database.url, settings.amqp.prefix, settings.console.listen
    );
    Ok(if ok? { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Says which dependency cannot be reached, where it looked, and how to start it.
async fn unreachable(settings: &Settings) -> Option<String> {
    let checks = [
        ("RabbitMQ", settings.amqp.url.expose(), 5672),
        ("PostgreSQL", settings.database.url.expose(), 5432),
    ];
    for (name, url, default_port) in checks {
        let addr = host_port(url, default_port);
        let connected =
            tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect(&addr))
                .await;
        if !matches!(connected, Ok(Ok(_))) {
            return Some(format!(
                "cannot reach {name} at {addr} ({}).\nStart it with `docker compose up -d rabbitmq postgres` from the repository root, \
                 or as a local service (PostgreSQL: `pg_ctlcluster $(ls /etc/postgresql) main start`; \
                 RabbitMQ: `rabbitmq-server -detached`), then run the demo again.",
                ConnectionUrl::new(url)
            ));
        }
    }
    None
}

fn host_port(url: &str, default_port: u16) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if hostport.contains(':') {
        hostport.to_owned()
    } else {
        format!("{hostport}:{default_port}")
    }
}

/// Points the settings at demo resources: a fresh database, its own queue prefix and vector
/// directory, and the simulator unless an OpenAI key is configured.
async fn prepare(
    settings: &mut Settings,
    work: &Path,
) -> anyhow::Result<Option<crate::sim::SimHandle>> {
    let db = settings.database.url.expose().to_owned();
    let base = db.rsplit_once('/').map_or(db.as_str(), |(b, _)| b).to_owned();
    let admin = sqlx::PgPool::connect(&format!("{base}/postgres"))
        .await
        .context("connecting to PostgreSQL")?;
    sqlx::query("DROP DATABASE IF EXISTS aptix_demo WITH (FORCE)").execute(&admin).await?;
    admin.close().await;
    settings.database.url = ConnectionUrl::new(format!("{base}/aptix_demo"));
    Store::create_database(settings.database.url.expose()).await?;
    settings.pipeline.migrate_on_start = true;
    settings.amqp.prefix = "aptix-demo".into();
    settings.vector.data_dir = work.join("vectors");
    let sim = if settings.llm.api_key.is_some() {
        println!("== using the LLM at {} (OPENAI_API_KEY is set)\n", settings.llm.base_url);
        None
    } else {
        let sim = crate::sim::start(crate::sim::SimConfig::default()).await?;
        settings.llm.base_url = ConnectionUrl::new(sim.base_url());
        println!(
            "== using the Responses simulator at {} (set OPENAI_API_KEY to use OpenAI)\n",
            sim.base_url()
        );
        Some(sim)
    };
    Ok(sim)
}

/// A backend's view: publish requests, read the session's reply queue.
struct Client {
    inner: SessionClient,
}

impl Client {
    async fn connect(settings: &Settings) -> anyhow::Result<Client> {
        let inner = SessionClient::connect_declaring(
            settings.amqp.url.expose(),
            pipeline::topology(settings),
        )
        .await?;
        Ok(Client { inner })
    }

    /// Sends a request and prints its replies until the final one, which it returns.
    async fn turn(&self, session: &SessionId, request: Value) -> anyhow::Result<Value> {
        let turn = request["TurnId"].as_str().unwrap_or_default().to_owned();
        self.inner.open_session(session).await?;
        let body = serde_json::to_vec(&request)?;
        let id = format!("demo:{session}:{turn}:{}", uuid::Uuid::new_v4());
        self.inner.submit(&session.to_string(), id, body).await?;
        let mut replies = self.inner.replies(session, 64).await?;
        let mut streamed = false;
        let reply = loop {
            let next = tokio::time::timeout(Duration::from_secs(120), replies.next()).await;
            let message =
                next.context("no reply within 120 s")?.context("reply queue closed")??;
            message.ack().await?;
            let body: Value = serde_json::from_slice(&message.body).unwrap_or(Value::Null);
            if body["Delta"] == true {
                if let Some(text) =
                    body["Event"]["Text"].as_str().filter(|_| body["Event"]["Type"] == "OutputText")
                {
                    if !streamed {
                        print!("   (streaming) ");
                        streamed = true;
                    }
                    print!("{text}");
                    use std::io::Write as _;
                    let _ = std::io::stdout().flush();
                }
                continue;
            }
            break body;
        };
        if streamed {
            println!("\n");
        }
        replies.close().await;
        print_reply(&turn, &reply, streamed);
        Ok(reply)
    }
}

/// Input tokens of the conversation's calls and how many of them the provider's cache served.
#[derive(Default)]
struct Tally {
    input: u64,
    cached: u64,
}

impl Tally {
    fn add(&mut self, reply: &Value) {
        let usage = &reply["Result"]["Usage"];
        let n = |k: &str| usage[k].as_u64().unwrap_or(0);
        self.input += n("InputTokens");
        self.cached += n("CachedInputTokens");
    }

    fn print(&self, key: crate::config::PromptCacheKey) {
        let (input, cached) = (self.input, self.cached);
        let share = if input == 0 { 0.0 } else { cached as f64 * 100.0 / input as f64 };
        let key = serde_json::to_value(key).unwrap_or_default();
        println!(
            "== prompt cache: {cached} of {input} input tokens were cached ({share:.0} %), [assemble] prompt_cache_key = {key}\n"
        );
    }
}

async fn conversation(
    client: &Client,
    session: &SessionId,
    tally: &mut Tally,
) -> anyhow::Result<bool> {
    let s = session.to_string();
    let mut ok = true;
    let steps = [
        json!({"SessionId": s, "TurnId": "turn-1", "Repo": "aptix",
               "Instruction": "How does the validate stage admit a turn, and where is the session lock taken?",
               "SolutionContextText": "Rust workspace: the Aptix Orchestrator itself."}),
        json!({"SessionId": s, "TurnId": "turn-2", "Repo": "aptix",
               "Instruction": "Here is the file I am editing. What would you change in it?",
               "InputArtifacts": [artifact("src/chunk.rs")]}),
        json!({"SessionId": s, "TurnId": "turn-3",
               "Instruction": "Read src/lib.rs with your tool before answering. @call(read_file, {\"path\": \"src/lib.rs\"})"}),
        json!({"SessionId": s, "TurnId": "turn-4",
               "Instruction": format!("Search the code for the chunker yourself, then write a note. {SERVER_TOOLS}")}),
    ];
    for request in steps {
        let reply = client.turn(session, request.clone()).await?;
        tally.add(&reply);
        ok &= reply["Successful"] == true;
        ok &= fetch_files(&reply["Result"]["Files"]).await;
        if reply["Result"]["Kind"] == "client_tool_continuation" {
            let results = run_tools(&reply["Result"]["ToolCalls"]);
            println!(
                "   the client ran {} tool call(s) and sends the results back\n",
                results.len()
            );
            let continuation =
                json!({"SessionId": s, "TurnId": request["TurnId"], "ToolResults": results});
            let reply = client.turn(session, continuation).await?;
            tally.add(&reply);
            ok &= reply["Successful"] == true;
        }
    }
    let streamed = json!({"SessionId": s, "TurnId": "turn-5", "Stream": true,
        "Instruction": "Summarise this conversation in a few sentences, streaming the answer."});
    let reply = client.turn(session, streamed).await?;
    tally.add(&reply);
    ok &= reply["Successful"] == true;
    Ok(ok)
}

/// What turn-4 asks the simulator to call: both server tools, which the pipeline runs itself.
const SERVER_TOOLS: &str = r##"@call(search_code, {"query": "split a file into chunks", "path_prefix": "index", "language": "rust"}) @call(write_file, {"path": "notes/chunking.md", "content": "# Chunking\n\nFiles are cut into line-exact chunks before indexing.\n", "mime_type": null})"##;

/// Fetches each FileRef's URL as a client would, and checks the bytes against `ContentHash`.
async fn fetch_files(files: &Value) -> bool {
    let mut ok = true;
    for f in files.as_array().into_iter().flatten() {
        let url = f["Url"].as_str().unwrap_or_default();
        let got = match crate::http::get(url).await {
            Ok(r) if r.status().is_success() => r.bytes().await.ok(),
            _ => None,
        };
        let hash = got.as_ref().map(|b| format!("sha256:{}", crate::assemble::sha256_hex(b)));
        let same = hash.as_deref() == f["ContentHash"].as_str();
        let how = if same { "the bytes match ContentHash" } else { "NOT served as promised" };
        println!("   fetched {url}: {how}\n");
        ok &= same;
    }
    ok
}

fn artifact(path: &str) -> Value {
    let contents =
        std::fs::read_to_string(path).unwrap_or_else(|_| "// (file not found)\n".to_owned());
    json!({"RelativePath": path, "FileName": Path::new(path).file_name().and_then(|f| f.to_str()).unwrap_or(path),
           "Contents": contents, "Origin": "ide", "Language": "rust"})
}

/// The client side of the tools in the default ConversationContext.
fn run_tools(calls: &Value) -> Vec<Value> {
    let calls = calls.as_array().cloned().unwrap_or_default();
    calls
        .iter()
        .map(|call| {
            let started = std::time::Instant::now();
            let args: Value =
                serde_json::from_str(call["ArgumentsJson"].as_str().unwrap_or("{}")).unwrap_or(Value::Null);
            let outcome = match call["Name"].as_str() {
                Some("read_file") => {
                    let path = PathBuf::from(args["path"].as_str().unwrap_or_default());
                    match std::fs::read_to_string(&path) {
                        Ok(text) => {
                            Ok(json!({"path": path, "contents": text.chars().take(4000).collect::<String>()}))
                        }
                        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
                    }
                }
                Some(other) => Err(format!("the demo client does not implement `{other}`")),
                None => Err("the call has no name".to_owned()),
            };
            let ms = started.elapsed().as_millis() as u64;
            match outcome {
                Ok(v) => {
                    json!({"ToolCallId": call["ToolCallId"], "ExecutionMs": ms, "ResultJson": v.to_string()})
                }
                Err(e) => json!({"ToolCallId": call["ToolCallId"], "ExecutionMs": ms, "ErrorMessage": e}),
            }
        })
        .collect()
}

fn print_reply(turn: &str, reply: &Value, streamed: bool) {
    let result = &reply["Result"];
    if reply["Successful"] != true {
        println!("-- {turn}: error");
        for e in reply["Errors"].as_array().into_iter().flatten() {
            println!(
                "   {}: {}",
                e["Code"].as_str().unwrap_or("?"),
                e["Message"].as_str().unwrap_or("")
            );
        }
        return;
    }
    println!(
        "-- {turn}: {} ({})",
        result["Kind"].as_str().unwrap_or("?"),
        result["ModeDisplayName"].as_str().unwrap_or("")
    );
    if streamed {
        println!("   (the final reply repeats the streamed text in PrimaryOutputText)");
    } else if let Some(text) = result["PrimaryOutputText"].as_str() {
        for line in text.lines() {
            println!("   | {line}");
        }
    }
    for call in result["ToolCalls"].as_array().into_iter().flatten() {
        println!(
            "   tool call {} {}({})",
            call["ToolCallId"].as_str().unwrap_or(""),
            call["Name"].as_str().unwrap_or(""),
            call["ArgumentsJson"].as_str().unwrap_or("")
        );
    }
    for r in result["ToolResults"].as_array().into_iter().flatten() {
        let outcome = r.get("ErrorMessage").map_or("ok", |_| "failed");
        let size = r["ResultJson"].as_str().map_or(0, str::len);
        println!(
            "   the server ran {} ({outcome}, {} ms, {size} bytes of result)",
            r["Name"].as_str().unwrap_or("?"),
            r["ExecutionMs"]
        );
    }
    for f in result["Files"].as_array().into_iter().flatten() {
        println!(
            "   file {} ({}, {} bytes) at {}",
            f["Name"].as_str().unwrap_or(""),
            f["MimeType"].as_str().unwrap_or(""),
            f["SizeBytes"],
            f["Url"].as_str().unwrap_or("")
        );
    }
    for w in result["UserWarnings"].as_array().into_iter().flatten() {
        println!(
            "   warning {}: {}",
            w["Code"].as_str().unwrap_or(""),
            w["Message"].as_str().unwrap_or("")
        );
    }
    if let Some(u) = result.get("Usage") {
        println!(
            "   usage: {} in ({} cached), {} out",
            u["InputTokens"], u["CachedInputTokens"], u["OutputTokens"]
        );
    }
    println!();
}

async fn show_stored(store: &Store, session: &SessionId) -> anyhow::Result<()> {
    let Some(view) = store.session_view(session).await? else { return Ok(()) };
    println!(
        "== stored in PostgreSQL: {} turns, {} immutable records",
        view.turns.len(),
        view.records.len()
    );
    for r in &view.records {
        let chunks = r["retrieved_chunks"].as_array().map_or(0, Vec::len);
        let files = r["active_files"].as_array().map_or(0, Vec::len);
        println!(
            "   {} step {} {:<25} chain={:<10} provider_id={} chunks={} files={}",
            r["turn_id"].as_str().unwrap_or(""),
            r["step"],
            r["kind"].as_str().unwrap_or(""),
            r["chain"]["status"].as_str().unwrap_or("-"),
            r["provider_response_id"].as_str().unwrap_or("-"),
            chunks,
            files
        );
    }
    Ok(())
}
