//! `aptix eval`: stored turns replayed on several arms (another model, another
//! ConversationContext — a context version kept under its own id), scored, and compared.
//!
//! Each arm is a reprocess run of its own (`<run>.<arm>`, see [`crate::reprocess`]): concurrent
//! within a rate, resumable (running the same `--run` again finishes what is left and calls
//! nothing twice), and each result an immutable record linked to its original. The report
//! gives each arm's mean per scorer with a 95 % interval, each arm against the baseline arm on
//! the same round trips (mean difference, interval, sign test), and the worst regressions with
//! both records' ids and the console's page of their turn. A turn an arm never ran (it was
//! never started) is left out of its comparison and counted apart; one the provider refused the
//! arm's request for counts against the arm. The built-in
//! `original` arm is the stored records themselves. It is kept in PostgreSQL (`eval_runs`) for
//! the console; an interrupted run's report is kept too, marked `interrupted`.

mod judge;
mod report;
mod score;
mod stats;

use std::collections::BTreeMap;
use std::sync::Arc;

use indicatif::ProgressBar;
use tokio_util::sync::CancellationToken;

pub use judge::{request as judge_request, Judge, JudgeSpend};
pub use report::{ArmReport, EvalReport, Regression};
pub use score::{Scorers, LOWER_IS_BETTER};
pub use stats::{sign_test, Estimate, Paired};

use crate::config::Settings;
use crate::llm::LlmClient;
use crate::reprocess::{self, ReprocessError, Reprocessor, Selection};
use crate::store::{EvalRow, Store};

/// The arm that replays nothing: the stored records.
pub const ORIGINAL: &str = "original";

/// One arm: what its replays change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arm {
    /// Its name (letters, digits, `_`, `-`), also the suffix of its reprocess run.
    pub name: String,
    /// Another model.
    pub model: Option<String>,
    /// Another ConversationContext.
    pub conversation_context: Option<String>,
}

impl std::str::FromStr for Arm {
    type Err = String;

    /// `NAME`, `NAME:model=M`, `NAME:context=C`, or both, separated by `:`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.split(':');
        let name = parts.next().unwrap_or_default().to_owned();
        let name_ok = !name.is_empty()
            && name.len() <= 32
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok || name == ORIGINAL {
            return Err(format!("arm `{s}`: a name of 1-32 letters, digits, `_` or `-`, not `{ORIGINAL}`, comes first"));
        }
        let mut arm = Arm { name, model: None, conversation_context: None };
        for part in parts {
            match part.split_once('=') {
                Some(("model", m)) if !m.is_empty() => arm.model = Some(m.to_owned()),
                Some(("context", c)) if !c.is_empty() => {
                    arm.conversation_context = Some(c.to_owned())
                }
                _ => return Err(format!("arm `{s}`: `{part}` is neither model=M nor context=C")),
            }
        }
        Ok(arm)
    }
}

/// What to evaluate and how.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// Which stored turns.
    pub selection: Selection,
    /// The evaluation's id; arm `a` runs as reprocess run `<run>.a`.
    pub run: String,
    /// The arms, in order.
    pub arms: Vec<Arm>,
    /// The arm the others are compared with: [`ORIGINAL`] or one of `arms`.
    pub baseline: String,
    /// The scorers.
    pub scorers: Scorers,
    /// The LLM judge, when asked for.
    pub judge: Option<Judge>,
    /// Turns started per second per arm at most.
    pub rate: Option<f64>,
    /// Turns in flight at once per arm.
    pub concurrency: usize,
}

/// Runs every arm, then scores and compares them; the report is also saved for the console.
/// Once `cancel` is set no turn and no judgement starts (those in flight finish) and the report,
/// saved all the same, is marked `interrupted`.
pub async fn run(
    store: &Store,
    settings: Arc<Settings>,
    llm: Arc<dyn LlmClient>,
    opts: &EvalOptions,
    cancel: &CancellationToken,
) -> Result<EvalReport, ReprocessError> {
    check(opts)?;
    same_arms(store, opts).await?;
    if let Some(j) = opts.judge.as_ref().filter(|j| j.budget_usd.is_some()) {
        if settings.price_of(&j.model).is_none() {
            return Err(ReprocessError::Options(format!(
                "--judge-budget-usd needs a price for `{}` in [[telemetry.prices]]",
                j.model
            )));
        }
    }
    let reprocessor = Reprocessor::new(store.clone(), settings.clone(), llm.clone());
    let arms: Vec<reprocess::Options> =
        opts.arms.iter().map(|arm| arm_options(opts, arm)).collect();
    // Every arm's options checked, then its run held and its options checked against the
    // run's, before any arm runs.
    for o in &arms {
        reprocessor.check(o)?;
    }
    let mut holds = Vec::with_capacity(arms.len());
    for o in &arms {
        holds.push(reprocess::claim(store, o).await?);
    }
    let mut runs = BTreeMap::new();
    for ((arm, o), hold) in opts.arms.iter().zip(&arms).zip(&mut holds) {
        // A reprocessor of its own per arm: the session states one keeps are after the last
        // turn its run replayed, which no turn of the next arm's run could start from, so a
        // shared one would rebuild every turn of the later arms from its session's beginning.
        let reprocessor = Reprocessor::new(store.clone(), settings.clone(), llm.clone());
        let done = reprocessor.run_held(o, hold, &ProgressBar::hidden(), cancel).await?;
        runs.insert(arm.name.clone(), done);
    }
    let mut rows: BTreeMap<String, Vec<EvalRow>> = BTreeMap::new();
    for (arm, hold) in opts.arms.iter().zip(&mut holds) {
        rows.insert(arm.name.clone(), hold.eval_rows().await?);
    }
    for hold in holds {
        hold.release().await;
    }
    let (judged, spend) = match &opts.judge {
        Some(judge) => {
            let endpoint = crate::llm::Endpoint::resolve(&settings.llm, None)
                .map_err(|e| ReprocessError::Options(format!("the judge's endpoint: {e}")))?;
            let price = settings.price_of(&judge.model);
            // Once cancelled the judge starts no judgement (those left are counted unjudged):
            // it would spend on a partial run, which the next invocation judges again anyway.
            let (judged, spend) =
                judge::run(judge, llm.as_ref(), &endpoint, price, &rows, opts.concurrency, cancel)
                    .await;
            (judged, Some(spend))
        }
        None => Default::default(),
    };
    let mut report = report::build(opts, &rows, &runs, &settings.telemetry.prices, &judged);
    report.judge = spend;
    // Kept although partial, for the console and because resuming checks its arms against it
    // (`same_arms`: an arm's records so far were made with its model), but marked as partial.
    report.interrupted = cancel.is_cancelled();
    let json = serde_json::to_value(&report).map_err(|e| ReprocessError::Options(e.to_string()))?;
    store.save_eval(&opts.run, &json).await?;
    Ok(report)
}

/// The reprocessing run of `arm`: `<run>.<arm>`, with the arm's model and context.
fn arm_options(opts: &EvalOptions, arm: &Arm) -> reprocess::Options {
    let mut o =
        reprocess::Options::new(opts.selection.clone(), format!("{}.{}", opts.run, arm.name));
    o.model = arm.model.clone();
    o.conversation_context = arm.conversation_context.clone();
    o.rate = opts.rate;
    o.concurrency = opts.concurrency;
    o
}

fn check(opts: &EvalOptions) -> Result<(), ReprocessError> {
    let bad = |m: String| Err(ReprocessError::Options(m));
    if opts.arms.is_empty() {
        return bad("give at least one --arm".into());
    }
    let mut names: Vec<&str> = opts.arms.iter().map(|a| a.name.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return bad("two arms have the same name".into());
    }
    if opts.baseline != ORIGINAL && !names.contains(&opts.baseline.as_str()) {
        return bad(format!("--baseline `{}` is neither `{ORIGINAL}` nor an arm", opts.baseline));
    }
    Ok(())
}

/// An arm resumed under the same run must be the same arm: its records so far were made with
/// its model and context, and mixing two would report neither. Read from the saved report, for
/// runs begun before `reprocess_runs` kept each arm's options (`reprocess::claim`).
async fn same_arms(store: &Store, opts: &EvalOptions) -> Result<(), ReprocessError> {
    let Some(previous) = store.eval_run(&opts.run).await? else { return Ok(()) };
    let Ok(previous) = serde_json::from_value::<EvalReport>(previous) else { return Ok(()) };
    for arm in &opts.arms {
        let Some(was) = previous.arms.iter().find(|a| a.name == arm.name) else { continue };
        if was.model != arm.model || was.conversation_context != arm.conversation_context {
            return Err(ReprocessError::Options(format!(
                "run `{}` already has arm `{}` with model {:?} and context {:?}: give the arm another name, or the evaluation another --run",
                opts.run, arm.name, was.model, was.conversation_context
            )));
        }
    }
    Ok(())
}
