//! The `aptix` command line: one binary gathering the operator's and backend's entry points.

mod bench;
mod budgets;
mod check_request;
mod dead;
mod demo;
mod eval;
mod ops;
mod render_context;
mod repartition;
mod reprocess;
mod sim;
mod status;

use crate::telemetry::DEFAULT_FILTER;
pub use crate::worker::{block_on, load_settings};

pub mod eval_retrieval;
pub mod index;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::telemetry::LogFormat;

/// Aptix Orchestrator.
#[derive(Debug, Parser)]
#[command(name = "aptix", version, about)]
pub struct Cli {
    /// Configuration file (else APTIX_CONFIG, else built-in defaults).
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Log format (overrides telemetry.format).
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormat>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate an AgentExecuteRequest (FILE or - for stdin); prints the InvokeResult.
    /// Exit 0 valid, 1 invalid, 2 unreadable input.
    Validate {
        /// Request file, or - for standard input.
        file: PathBuf,
    },
    /// Print the effective configuration (secrets redacted) after validating it.
    Config,
    /// Print a JSON Schema: `request` (AgentExecuteRequest), `response` (the InvokeResult of a
    /// reply) or `delta` (the body of a stream delta).
    Schema {
        /// Which schema.
        #[arg(value_parser = ["request", "response", "delta"])]
        which: String,
    },
    /// Run the OpenAI Responses API simulator (tests, benchmarks, offline demo) until Ctrl-C.
    Sim(sim::SimArgs),
    /// Print the AGN-002 [CONTEXT] block for a JSON array of chunks (FILE or - for stdin).
    /// Exit 0 printed, 1 not a chunk array, 2 unreadable input.
    RenderContext {
        /// Chunks file, or - for standard input.
        file: PathBuf,
    },
    /// Index a repository into the vector store (idempotent: unchanged chunks are kept).
    Index(index::IndexArgs),
    /// Index a source tree and report recall@k and MRR for a JSONL query set.
    EvalRetrieval(eval_retrieval::EvalArgs),
    /// Run one pipeline stage until SIGTERM (scale a stage by starting more copies).
    Worker {
        /// The stage, by name (`validate`, `retrieve`, `assemble`, `invoke`, `persist`).
        stage: String,
        /// Consumers of the stage in this process.
        #[arg(long, default_value_t = 1)]
        copies: usize,
    },
    /// Run every stage of the pipeline in one process until SIGTERM.
    Run {
        /// Consumers of each stage in this process.
        #[arg(long, default_value_t = 1)]
        copies: usize,
    },
    /// Create the database if needed and apply migrations.
    Migrate,
    /// Move the ingress from --from partitions to amqp.ingress_partitions, keeping every
    /// session's order (run it while no validate worker runs; docs/deploy.md).
    Repartition {
        /// The number of ingress partitions requests went to until now.
        #[arg(long)]
        from: u16,
    },
    /// Publish a request; with --wait print each reply of the turn as a JSON line until the
    /// final one. Exit 0 success, 1 error reply, 2 timeout, 3 could not run.
    Submit {
        /// Request file, or - for standard input.
        file: PathBuf,
        /// Wait for the turn's replies.
        #[arg(long)]
        wait: bool,
        /// Seconds to wait for the final reply.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
        /// Publish for this tenant (docs/tenancy.md): connect with `amqp.url` as one of its
        /// users, set `user_id`, use its reply queue `<prefix>.session.<tenant>.<SessionId>`.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Inspect stored sessions.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Dead letters: list, show, replay or discard them while the pipeline runs. Exit 0 done,
    /// 1 no such dead letter or refused, 2 RabbitMQ or PostgreSQL cannot be reached.
    #[command(subcommand)]
    Dead(dead::DeadCommand),
    /// Serve the web console until Ctrl-C or SIGTERM: sessions, turns, queues, dead letters.
    /// Every page needs a sign-in (`console.admin_token`, `viewer_token`, `tenant_tokens` or
    /// `trusted_scope_header`); replay and discard need `admin` (docs/deploy.md, "Console").
    Console {
        /// Where to listen (overrides console.listen).
        #[arg(long)]
        listen: Option<String>,
    },
    /// The pipeline's queues: messages ready and consumers per stage, dead letters. Exit 0 when
    /// every stage has a consumer, 1 when one has none, 2 when RabbitMQ cannot be reached.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run everything on this machine and play a conversation through it (the README's main job).
    /// Prints the conversation alone; the pipeline's logs show from WARN (`-v`: INFO; `RUST_LOG`
    /// wins over both).
    Demo {
        /// Show the pipeline's INFO logs too.
        #[arg(short, long)]
        verbose: bool,
    },
    /// Run stored turns again (optionally with another model or conversation context) into new
    /// records linked to the originals; nothing is published. Exit 0 all done, 1 some failed or
    /// left (resume with the same --run), 2 bad options, 3 could not run.
    Reprocess(reprocess::ReprocessArgs),
    /// Replay stored turns on several arms (models, ConversationContexts), score and compare them
    /// (README, "Evaluation").
    Eval(eval::EvalArgs),
    /// Run a benchmark: `aptix bench ceiling --runs 3`, `aptix bench overhead`, ... (every
    /// argument goes to the `aptix-bench` binary beside this one, which `cargo build --release
    /// -p aptix-bench` builds, or run `cargo aptix-bench ...` from a checkout; `aptix bench
    /// --help` lists them; figures in docs/benchmarks.md).
    #[command(disable_help_flag = true)]
    Bench {
        /// The benchmark and its options.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

/// `aptix session ...`
#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Print a session, its turns and its records as JSON.
    Show {
        /// The SessionId.
        session_id: String,
    },
    /// Rename a session (its name is the first line of its first instruction until then).
    Rename {
        /// The SessionId.
        session_id: String,
        /// The new name: 1-80 characters, no control characters.
        name: String,
    },
}

impl Cli {
    /// The exit code for a command that could not run at all (its configuration unreadable,
    /// PostgreSQL or RabbitMQ unreachable): 3 where the command gives 2 a meaning of its own
    /// (a timeout, bad options, a bad name), so that a script never reads a failure as one; 2
    /// elsewhere (for `status` and `dead`, 2 is that failure).
    pub fn failure_code(&self) -> u8 {
        match &self.command {
            Command::Submit { .. }
            | Command::Reprocess(_)
            | Command::Eval(_)
            | Command::Session(SessionCommand::Rename { .. }) => 3,
            _ => 2,
        }
    }
}

/// The exit status of a command line that does not parse (`error`, from `args`): 0 for
/// `--help` and `--version`, 3 for `submit`, whose 2 is a timeout (a mistyped flag must not read
/// as one), and clap's 2 elsewhere (for `reprocess` and `eval`, 2 is "bad options" anyway).
pub fn usage_code(error: &clap::Error, args: &[std::ffi::OsString]) -> u8 {
    if !error.use_stderr() {
        return 0;
    }
    // Parsed again, leniently, only to learn which command was meant.
    let meant =
        <Cli as clap::CommandFactory>::command().ignore_errors(true).try_get_matches_from(args);
    match meant.ok().as_ref().and_then(clap::ArgMatches::subcommand_name) {
        Some("submit") => 3,
        _ => 2,
    }
}

/// Runs the parsed command line; the returned code is the process exit status.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let settings = || load_settings(cli.config.as_deref(), cli.log_format);
    match cli.command {
        Command::Worker { stage, copies } => {
            let service = format!("aptix-{stage}");
            let (path, format) = (cli.config.as_deref(), cli.log_format);
            let settings =
                crate::worker::load_settings_with(path, format, DEFAULT_FILTER, &service)?;
            crate::worker::run(settings, &[stage], copies)
        }
        Command::Run { copies } => crate::worker::run(settings()?, &[], copies),
        Command::Migrate => ops::migrate(settings()?),
        Command::Repartition { from } => repartition::run(settings()?, from),
        Command::Submit { file, wait, timeout, tenant } => {
            let tenant = tenant.map(|t| t.parse()).transpose().map_err(anyhow::Error::msg)?;
            let timeout = std::time::Duration::from_secs(timeout);
            ops::submit(settings()?, &file, wait, timeout, tenant)
        }
        Command::Status { json } => status::run(settings()?, json),
        Command::Dead(command) => dead::run(settings()?, command),
        Command::Console { listen } => {
            let mut settings = settings()?;
            if let Some(listen) = listen {
                settings.console.listen = listen;
            }
            console(settings)
        }
        Command::Session(SessionCommand::Show { session_id }) => {
            ops::session_show(settings()?, &session_id)
        }
        Command::Session(SessionCommand::Rename { session_id, name }) => {
            ops::session_rename(settings()?, &session_id, &name)
        }
        Command::Demo { verbose } => {
            // The narrative is the output; logs only when something is wrong, or when asked.
            let filter = if verbose { DEFAULT_FILTER } else { "warn,qdrant_edge=error" };
            let path = cli.config.as_deref();
            demo::run(crate::worker::load_settings_with(path, cli.log_format, filter, "aptix")?)
        }
        Command::Reprocess(args) => reprocess::run(args, settings()?),
        Command::Eval(args) => eval::run(args, settings()?),
        Command::Bench { args } => bench::run(args, cli.config.as_deref()),
        Command::Index(args) => {
            let settings = load_settings(cli.config.as_deref(), cli.log_format)?;
            index::run(args, &settings)
        }
        Command::EvalRetrieval(args) => {
            let settings = load_settings(cli.config.as_deref(), cli.log_format)?;
            eval_retrieval::run(args, &settings)
        }
        Command::Sim(args) => sim::run(args, cli.log_format),
        Command::RenderContext { file } => Ok(render_context::run(&file)),
        Command::Validate { file } => {
            let settings = load_settings(cli.config.as_deref(), cli.log_format)?;
            Ok(check_request::run(&file, &settings.limits))
        }
        Command::Config => {
            let settings = load_settings(cli.config.as_deref(), cli.log_format)?;
            // What a worker checks at start too: per-stage tables name stages of the pipeline.
            crate::worker::stages(&settings, &[])?;
            println!("{}", toml::to_string_pretty(&settings)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Schema { which } => match crate::schema::named(&which) {
            Some(file) => {
                print!("{}", crate::schema::render(&file.schema));
                Ok(ExitCode::SUCCESS)
            }
            None => anyhow::bail!("no schema named `{which}`"),
        },
    }
}

pub use crate::contracts::ids::printable;

/// Reads a file, or standard input for `-`.
pub fn read_input(path: &Path) -> std::io::Result<Vec<u8>> {
    if path == Path::new("-") {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf)?;
        Ok(buf)
    } else {
        std::fs::read(path)
    }
}

fn console(settings: crate::config::Settings) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let listener = tokio::net::TcpListener::bind(&settings.console.listen).await?;
        println!("console at http://{}/", listener.local_addr()?);
        let c = &settings.console;
        // An empty token signs no one in (compose passes unset ones as empty).
        let unset = |t: Option<&crate::config::Secret>| t.is_none_or(|t| t.expose().is_empty());
        let none = unset(c.admin_token.as_ref())
            && unset(c.viewer_token.as_ref())
            && c.tenant_tokens.values().all(|t| unset(Some(t)))
            && c.trusted_scope_header.trim().is_empty();
        if none {
            eprintln!("warning: no sign-in is configured (console.admin_token, viewer_token, tenant_tokens or trusted_scope_header): every page but /healthz answers 401");
        }
        let console = crate::console::Console::connect(settings).await?;
        let shutdown = crate::pipeline::shutdown_on_signals();
        crate::console::serve(console, listener, shutdown).await?;
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod printable_tests {
    use super::printable;

    #[test]
    fn client_text_cannot_drive_the_terminal() {
        assert_eq!(printable("plain id-1"), "plain id-1");
        assert_eq!(printable("\u{1b}[2Jgone"), "\\u{1b}[2Jgone");
        assert_eq!(printable("a\u{202e}b\u{200b}c\0"), "a\\u{202e}b\\u{200b}c\\u{0}");
        assert_eq!(printable("line\nbreak\u{9b}"), "line\\u{a}break\\u{9b}");
    }
}
