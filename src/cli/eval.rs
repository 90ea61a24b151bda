//! `aptix eval`: stored turns replayed on several arms, scored and compared (see
//! [`crate::eval`]). Exit 0 when every arm replayed every selected turn, 1 when some were left
//! (run the same `--run` again to finish), 2 on bad options, 3 when it could not run.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use chrono::Utc;
use clap::Args;

use super::reprocess::{finish, rate, SelectionArgs};
use crate::config::Settings;
use crate::eval::{self, Arm, EvalOptions, EvalReport, Judge, Scorers};
use crate::llm::HttpLlmClient;
use crate::reprocess::ReprocessError;
use crate::store::Store;

/// Options of `aptix eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Which stored turns.
    #[command(flatten)]
    pub select: SelectionArgs,
    /// An arm: `NAME`, `NAME:model=M`, `NAME:context=C` or `NAME:model=M:context=C`. Repeat for
    /// each arm; `original` (the stored records) is always there.
    #[arg(long = "arm", value_name = "ARM", required = true)]
    pub arms: Vec<String>,
    /// The arm the others are compared with.
    #[arg(long, value_name = "ARM", default_value = eval::ORIGINAL)]
    pub baseline: String,
    /// Score each final answer by whether it matches this regular expression (the primary
    /// scorer then; `exact` otherwise).
    #[arg(long, value_name = "REGEX")]
    pub expect_regex: Option<String>,
    /// Score each final answer with an LLM judge by the rubric in FILE (plain text: what a good
    /// answer does), through the configured Responses endpoint.
    #[arg(long, value_name = "FILE", requires = "judge_model")]
    pub judge_rubric: Option<std::path::PathBuf>,
    /// The judge's model.
    #[arg(long, value_name = "MODEL")]
    pub judge_model: Option<String>,
    /// The most the judge may spend, in USD (its model needs a price in [[telemetry.prices]]).
    #[arg(long, value_name = "USD")]
    pub judge_budget_usd: Option<f64>,
    /// Evaluation id; arm A runs as reprocess run `<run>.A`. Give an earlier one to resume it.
    #[arg(long, value_name = "NAME")]
    pub run: Option<String>,
    /// Turns started per second per arm at most (0 for no limit).
    #[arg(long, value_name = "TURNS_PER_SEC", default_value_t = 2.0)]
    pub rate: f64,
    /// Turns in flight at once per arm.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: u16,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

impl EvalArgs {
    /// The library options these arguments ask for.
    pub fn options(&self) -> Result<EvalOptions, ReprocessError> {
        let bad = ReprocessError::Options;
        let arms =
            self.arms.iter().map(|a| a.parse::<Arm>().map_err(bad)).collect::<Result<_, _>>()?;
        let expect = match &self.expect_regex {
            Some(re) => {
                Some(regex::Regex::new(re).map_err(|e| bad(format!("--expect-regex: {e}")))?)
            }
            None => None,
        };
        let run = self.run.clone().unwrap_or_else(|| {
            format!("ev-{}-{:04x}", Utc::now().format("%Y%m%dT%H%M%SZ"), rand::random::<u16>())
        });
        let judge = match (&self.judge_rubric, &self.judge_model) {
            (Some(path), Some(model)) => {
                let rubric = std::fs::read_to_string(path).map_err(|e| {
                    bad(format!("--judge-rubric: cannot read {}: {e}", path.display()))
                })?;
                let budget = self.judge_budget_usd;
                if budget.is_some_and(|b| !b.is_finite() || b <= 0.0) {
                    return Err(bad("--judge-budget-usd must be a positive amount".into()));
                }
                Some(Judge { rubric, model: model.clone(), budget_usd: budget })
            }
            _ => None,
        };
        Ok(EvalOptions {
            judge,
            selection: self.select.selection()?,
            run,
            arms,
            baseline: self.baseline.clone(),
            scorers: Scorers { expect },
            rate: rate(self.rate)?,
            concurrency: usize::from(self.concurrency),
        })
    }
}

/// Runs the command.
pub fn run(args: EvalArgs, settings: Settings) -> anyhow::Result<ExitCode> {
    let opts = match args.options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    if args.run.is_none() {
        eprintln!("eval run: {} (resume with --run {})", opts.run, opts.run);
    }
    crate::worker::block_on(async move {
        let settings = Arc::new(settings);
        let store =
            Store::connect(settings.database.url.expose(), settings.database.max_connections)?;
        let llm = Arc::new(HttpLlmClient::new(&settings.llm).context("building the LLM client")?);
        let cancel = crate::pipeline::shutdown_on_signals();
        let report = eval::run(&store, settings, llm, &opts, &cancel).await;
        finish(report, args.json, |r: &EvalReport| {
            if r.interrupted || r.arms.iter().any(|a| a.turns_not_done > 0) {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        })
    })
}
