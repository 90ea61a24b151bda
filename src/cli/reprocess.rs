//! `aptix reprocess`: run stored turns again (another model or ConversationContext, or the same
//! to measure drift) into new records linked to the originals; see [`crate::reprocess`].
//! Exit 0 when every selected turn is done or skipped, 1 when some failed or were left (run the
//! same `--run` again to finish), 2 on bad options.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use chrono::Utc;
use clap::Args;

use crate::config::Settings;
use crate::contracts::SessionId;
use crate::llm::HttpLlmClient;
use crate::reprocess::{self, Options, ReprocessError, Reprocessor, Selection};
use crate::store::Store;

/// Which stored turns: the selection flags `aptix reprocess` and `aptix eval` share.
#[derive(Debug, Args)]
pub struct SelectionArgs {
    /// Only turns of this session.
    #[arg(long, value_name = "SESSION_ID")]
    pub session: Option<String>,
    /// Only turns first answered at or after this time (RFC 3339, or a date).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Only turns first answered before this time (RFC 3339, or a date).
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// Only the turns listed in FILE: `SESSION_ID TURN_ID` per line, or JSON lines
    /// `{"SessionId":…,"TurnId":…}`.
    #[arg(long, value_name = "FILE")]
    pub turns: Option<PathBuf>,
    /// Every stored turn (required when no other selector is given).
    #[arg(long)]
    pub all: bool,
}

impl SelectionArgs {
    /// The selection these flags make.
    pub fn selection(&self) -> Result<Selection, ReprocessError> {
        let bad = ReprocessError::Options;
        let session = match &self.session {
            Some(s) => {
                Some(s.parse::<SessionId>().map_err(|(_, m)| bad(format!("--session: {m}")))?)
            }
            None => None,
        };
        let time = |flag: &str, v: &Option<String>| match v {
            Some(t) => reprocess::parse_time(t).map(Some).map_err(|m| bad(format!("{flag}: {m}"))),
            None => Ok(None),
        };
        let turns = match &self.turns {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| bad(format!("--turns: cannot read {}: {e}", path.display())))?;
                Some(reprocess::parse_turn_list(&text)?)
            }
            None => None,
        };
        Ok(Selection {
            session,
            since: time("--since", &self.since)?,
            until: time("--until", &self.until)?,
            turns,
            all: self.all,
        })
    }
}

/// `--rate` checked: turns per second, `None` for no limit.
pub fn rate(rate: f64) -> Result<Option<f64>, ReprocessError> {
    // A rate so low that one turn's interval is no Duration (over about 584 billion years)
    // would panic the pacing instead of being refused.
    if !rate.is_finite() || rate < 0.0 || (rate > 0.0 && rate < 1e-9) {
        return Err(ReprocessError::Options(format!(
            "--rate {rate} must be 0 (no limit) or a number of turns per second from 1e-9"
        )));
    }
    Ok((rate > 0.0).then_some(rate))
}

/// Options of `aptix reprocess`.
#[derive(Debug, Args)]
pub struct ReprocessArgs {
    /// Which stored turns.
    #[command(flatten)]
    pub select: SelectionArgs,
    /// Run id stored as `reprocess_run`; give an earlier run's id to resume it. Default: generated
    /// and printed.
    #[arg(long, value_name = "NAME")]
    pub run: Option<String>,
    /// Model to use instead of the ConversationContext's.
    #[arg(long)]
    pub model: Option<String>,
    /// ConversationContext to use instead of each turn's own.
    #[arg(long, value_name = "ID")]
    pub conversation_context: Option<String>,
    /// Turns started per second at most (0 for no limit).
    #[arg(long, value_name = "TURNS_PER_SEC", default_value_t = 2.0)]
    pub rate: f64,
    /// Turns in flight at once.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: u16,
    /// Stop after reprocessing this many turns (the rest stays for a later run).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Show what would run and the estimated token volume; call and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the report (or the dry-run plan) as JSON.
    #[arg(long)]
    pub json: bool,
}

impl ReprocessArgs {
    /// The library options these arguments ask for.
    pub fn options(&self) -> Result<Options, ReprocessError> {
        let selection = self.select.selection()?;
        let rate = rate(self.rate)?;
        let run = self.run.clone().unwrap_or_else(|| reprocess::generate_run_id(Utc::now()));
        Ok(Options {
            selection,
            run,
            model: self.model.clone(),
            conversation_context: self.conversation_context.clone(),
            rate,
            concurrency: usize::from(self.concurrency),
            limit: self.limit,
        })
    }
}

/// Runs the command.
pub fn run(args: ReprocessArgs, settings: Settings) -> anyhow::Result<ExitCode> {
    let opts = match args.options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    crate::worker::block_on(async move {
        let settings = Arc::new(settings);
        let store =
            Store::connect(settings.database.url.expose(), settings.database.max_connections)?;
        if !store.ping().await {
            anyhow::bail!(
                "cannot reach PostgreSQL at {} (is it running? `docker compose up -d`)",
                settings.database.url
            );
        }
        let llm = Arc::new(HttpLlmClient::new(&settings.llm).context("building the LLM client")?);
        let reprocessor = Reprocessor::new(store, settings, llm);
        if args.dry_run {
            return finish(reprocessor.dry_run(&opts).await, args.json, |_| ExitCode::SUCCESS);
        }
        if args.run.is_none() {
            eprintln!("run id: {} (resume with --run {})", opts.run, opts.run);
        }
        let progress = progress_bar();
        let cancel = crate::pipeline::shutdown_on_signals();
        let report = reprocessor.run(&opts, &progress, &cancel).await;
        progress.finish_and_clear();
        finish(report, args.json, |r| {
            if r.failed > 0 || r.left > 0 {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        })
    })
}

/// Prints a result (text or JSON) and chooses the exit code.
pub(super) fn finish<T: std::fmt::Display + serde::Serialize>(
    result: Result<T, ReprocessError>,
    json: bool,
    code: impl Fn(&T) -> ExitCode,
) -> anyhow::Result<ExitCode> {
    match result {
        Ok(value) => {
            if json {
                println!("{}", serde_json::to_string_pretty(&value)?);
            } else {
                print!("{value}");
            }
            Ok(code(&value))
        }
        Err(ReprocessError::Store(e)) => Err(e.into()),
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::from(2))
        }
    }
}

/// A progress bar on a terminal, nothing otherwise.
fn progress_bar() -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(0);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} turns {msg} ({eta})",
    ) {
        bar.set_style(style);
    }
    bar
}
