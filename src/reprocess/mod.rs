//! Batch reprocessing of stored turns (`aptix reprocess`): selected turns are run again from
//! their stored inputs through assemble → invoke → persist, optionally with another model or
//! ConversationContext, and each round trip gets a new immutable record linked to its original
//! (`reprocess_of`, `reprocess_run`).
//!
//! What it never does: touch an original record, a session's state, a turn row or the outbox,
//! or publish anything (no reply queue sees a reprocessed turn). It runs in-process with the
//! library functions; the LLM call goes through [`LlmClient`] to the endpoint the turn's
//! AgentContext configures.
//!
//! - Input: each turn is rebuilt as a self-contained request, the session's earlier history
//!   rehydrated into a new chain (see `rebuild`), so turns can be picked in any order and
//!   compared one by one. The session before a turn is replayed from the state kept after its
//!   turn before, when this reprocessor replayed that one (`history`), so a session's turns
//!   taken in order read its history once, not once per turn.
//! - Resume: a turn is written in one transaction once all its round trips are done, with
//!   `ON CONFLICT DO NOTHING` on the unique `(reprocess_of, reprocess_run)` index, and none of it
//!   is kept when another copy of the run wrote the turn first; a turn whose first record the
//!   run already has is skipped before its inputs are read. Running the same `--run` again
//!   therefore finishes the rest and never does a turn twice. One invocation holds a run at a
//!   time ([`claim`], [`RunHold`]); a turn still in flight is skipped until it has ended. A run
//!   keeps the model and context it first wrote records with (`reprocess_runs`): resumed with
//!   others, it is refused.
//! - Failures: when the model answers badly (refusal, `failed`, unreadable) the error is the
//!   record, as in the pipeline; when no answer comes (unavailable, timeout, rejected request)
//!   nothing is written and the next run of the same `--run` retries the turn.
//! - `--rate` spaces turn starts; `--concurrency` bounds turns in flight; `--limit` stops after
//!   that many turns; cancelling stops starting turns and lets those in flight finish.

mod compare;
mod history;
mod places;
mod plan;
mod rate;
mod rebuild;
mod record;
mod report;
mod select;
mod turn;
mod why;

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures_util::{StreamExt as _, TryStreamExt as _};
use indicatif::ProgressBar;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use uuid::Uuid;

pub use compare::{Comparison, Difference};
pub use plan::{DryRun, PlannedTurn};
pub use report::{Problem, Report};
pub use select::{parse_time, parse_turn_list, Selection};

use crate::config::Settings;
use crate::llm::{LlmClient, LlmError};
use crate::store::{RunHold, SelectedTurn, Store, StoreError, TurnSelector};
use places::Places;
use rate::RateLimiter;
use rebuild::TurnInputs;
use turn::Replayer;
use why::Unreplayable;

/// Why a run could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum ReprocessError {
    /// The options are inconsistent or name something that does not exist.
    #[error("{0}")]
    Options(String),
    /// A line of the `--turns` list is malformed.
    #[error("turn list line {line}: {message}")]
    TurnList {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// Another invocation holds the run (`aptix reprocess` or `aptix eval` with the same
    /// `--run`, in this or another process).
    #[error(
        "run `{0}` is running in another invocation: wait for it to end, or give another --run"
    )]
    Held(String),
    /// PostgreSQL.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Holds `opts.run` for this invocation and records its model and context, or refuses them
/// when the run was started with others: its records so far were made with those, and a run
/// mixing two would report neither. Refused too while another invocation holds the run: both
/// would pay for the same turns' model calls.
pub async fn claim(store: &Store, opts: &Options) -> Result<RunHold, ReprocessError> {
    let Some(mut hold) = store.hold_run(&opts.run).await? else {
        return Err(ReprocessError::Held(opts.run.clone()));
    };
    let (model, context) = (opts.model.as_deref(), opts.conversation_context.as_deref());
    let Some((was_model, was_context)) = hold.claim(model, context).await? else {
        return Ok(hold);
    };
    hold.release().await;
    Err(ReprocessError::Options(format!(
        "run `{}` was started with model {was_model:?} and context {was_context:?}: resume it with those, or give another --run",
        opts.run
    )))
}

/// What to reprocess and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// Which turns.
    pub selection: Selection,
    /// The run id, written as `reprocess_run`; the same id resumes a run.
    pub run: String,
    /// Another model for every turn.
    pub model: Option<String>,
    /// Another ConversationContext for every turn.
    pub conversation_context: Option<String>,
    /// At most this many turns started per second.
    pub rate: Option<f64>,
    /// Turns in flight at once (at least 1).
    pub concurrency: usize,
    /// At most this many turns reprocessed by this invocation.
    pub limit: Option<usize>,
}

impl Options {
    /// Options for `selection` under run `run`: no overrides, 2 turns per second, 2 at once.
    pub fn new(selection: Selection, run: impl Into<String>) -> Self {
        Options {
            selection,
            run: run.into(),
            model: None,
            conversation_context: None,
            rate: Some(2.0),
            concurrency: 2,
            limit: None,
        }
    }
}

/// A fresh run id: `rp-<UTC time>-<4 hex digits>`.
pub fn generate_run_id(now: DateTime<Utc>) -> String {
    format!("rp-{}-{:04x}", now.format("%Y%m%dT%H%M%SZ"), rand::random::<u16>())
}

/// Runs reprocessing against one database and LLM client.
#[derive(Debug, Clone)]
pub struct Reprocessor {
    store: Store,
    settings: Arc<Settings>,
    llm: Arc<dyn LlmClient>,
    /// Sessions replayed so far (by every run of this reprocessor: eval's arms share them).
    histories: Arc<history::Histories>,
}

/// A selected turn, ready to run or not.
enum Prepared<'a> {
    AlreadyDone,
    Unavailable(String),
    Ready(Box<TurnInputs>, Replayer<'a>),
}

/// What became of one turn in this invocation.
enum Outcome {
    Done,
    AlreadyDone,
    Unavailable(String),
    Failed(String),
    /// Failed in its model call: no answer came.
    Unanswered(String),
    Left,
}

impl Reprocessor {
    /// A reprocessor over `store`, calling the LLM through `llm` with `settings`' endpoints,
    /// contexts and assembly policy.
    pub fn new(store: Store, settings: Arc<Settings>, llm: Arc<dyn LlmClient>) -> Self {
        Reprocessor { store, settings, llm, histories: Default::default() }
    }

    /// Checks the options; returns the selection's conditions.
    pub(crate) fn check(&self, opts: &Options) -> Result<TurnSelector, ReprocessError> {
        let run_ok = !opts.run.is_empty()
            && opts.run.len() <= 128
            && opts.run.chars().all(|c| c.is_ascii_alphanumeric() || "._:-".contains(c));
        if !run_ok {
            return Err(ReprocessError::Options(format!(
                "run id `{}` must be 1-128 letters, digits, `.`, `_`, `:` or `-`",
                opts.run
            )));
        }
        if let Some(id) = &opts.conversation_context {
            if !self.settings.conversation_contexts.contains_key(id) {
                return Err(ReprocessError::Options(format!(
                    "no conversation context `{id}` is configured"
                )));
            }
        }
        if opts.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
            return Err(ReprocessError::Options("--model must not be empty".into()));
        }
        opts.selection.to_selector()
    }

    /// Loads a turn and decides whether it can run.
    async fn prepare(
        &self,
        opts: &Options,
        t: &SelectedTurn,
    ) -> Result<(Prepared<'_>, usize), StoreError> {
        if t.done {
            return Ok((Prepared::AlreadyDone, round_trips(t)));
        }
        if !matches!(t.turn_state.as_str(), "completed" | "failed" | "steered") {
            // Replayed now, it would count as done with the round trips it has so far.
            let why = format!("the turn is still {}: reprocess it once it has ended", t.turn_state);
            return Ok((Prepared::Unavailable(why), round_trips(t)));
        }
        let steps = rebuild::originals(&self.store, t.session_id, &t.turn_id).await?;
        let count = steps.len();
        let Some(first) = steps.first() else {
            return Ok((Prepared::Unavailable("no original records".into()), 0));
        };
        if first.original.kind == "steered" {
            // Its instruction was part of another turn's call, which replays it.
            let why = "it steered another turn, whose replay carries its instruction";
            return Ok((Prepared::Unavailable(why.into()), count));
        }
        let policy = &self.settings.assemble;
        let inputs =
            match rebuild::load(&self.store, policy, &self.histories, t.session_id, steps).await? {
                Ok(inputs) => inputs,
                Err(why) => return Ok((Prepared::Unavailable(why.to_string()), count)),
            };
        let context = rebuild::context_for(
            &self.settings,
            &inputs.turn,
            opts.conversation_context.as_deref(),
            opts.model.as_deref(),
        );
        let endpoint = turn::endpoint_for(&self.settings, &inputs.turn);
        let (context, endpoint) = match (context, endpoint) {
            (Ok(c), Ok(e)) => (c, e),
            (Err(why), _) | (_, Err(why)) => {
                return Ok((Prepared::Unavailable(why.to_string()), count))
            }
        };
        let versions = replay_versions(&self.settings, &inputs.turn, opts, &context);
        let replayer = Replayer {
            llm: &*self.llm,
            endpoint,
            context,
            policy: &self.settings.assemble,
            versions,
        };
        Ok((Prepared::Ready(Box::new(inputs), replayer), count))
    }

    /// Reprocesses the selected turns, advancing `progress` per turn, until done or `cancel`.
    pub async fn run(
        &self,
        opts: &Options,
        progress: &ProgressBar,
        cancel: &CancellationToken,
    ) -> Result<Report, ReprocessError> {
        self.check(opts)?;
        let mut hold = claim(&self.store, opts).await?;
        let report = self.run_held(opts, &mut hold, progress, cancel).await;
        hold.release().await;
        report
    }

    /// [`Reprocessor::run`] of a run this invocation already holds ([`claim`]).
    pub async fn run_held(
        &self,
        opts: &Options,
        hold: &mut RunHold,
        progress: &ProgressBar,
        cancel: &CancellationToken,
    ) -> Result<Report, ReprocessError> {
        let selector = self.check(opts)?;
        let turns = hold.select(&selector).await?;
        info!(run = %opts.run, selected = turns.len(), model = ?opts.model, conversation_context = ?opts.conversation_context, "reprocessing");
        progress.set_length(turns.len() as u64);
        let limiter = RateLimiter::new(opts.rate);
        let budget = Places::new(opts.limit);
        let mut report =
            Report { run: opts.run.clone(), selected: turns.len(), ..Report::default() };
        let mut steps: HashMap<(Uuid, String), usize> = HashMap::new();
        let (limiter, budget) = (&limiter, &budget);
        let mut results = futures_util::stream::iter(&turns)
            .map(|t| async move { (t, self.one(opts, t, limiter, budget, cancel).await) })
            .buffer_unordered(opts.concurrency.max(1));
        while let Some((t, (outcome, count))) = results.next().await {
            steps.insert((t.session_id, t.turn_id.clone()), count);
            tally(&mut report, t, outcome);
            progress.inc(1);
            progress.set_message(format!(
                "{} done, {} skipped, {} failed",
                report.done,
                report.already_done + report.unavailable,
                report.failed
            ));
        }
        drop(results);
        report.interrupted = cancel.is_cancelled();
        report.comparison = compare(hold, &steps).await?;
        info!(run = %opts.run, done = report.done, already_done = report.already_done, failed = report.failed, left = report.left, "reprocessing finished");
        Ok(report)
    }

    async fn one(
        &self,
        opts: &Options,
        t: &SelectedTurn,
        limiter: &RateLimiter,
        budget: &Places,
        cancel: &CancellationToken,
    ) -> (Outcome, usize) {
        if cancel.is_cancelled() {
            return (Outcome::Left, 0);
        }
        if t.done {
            return (Outcome::AlreadyDone, round_trips(t));
        }
        // A place under --limit before the turn's inputs are read (see `places`).
        let place = tokio::select! {
            _ = cancel.cancelled() => None,
            place = budget.take() => place,
        };
        let Some(place) = place else { return (Outcome::Left, round_trips(t)) };
        let (inputs, replayer, count) = match self.prepare(opts, t).await {
            Ok((Prepared::Ready(inputs, replayer), n)) => {
                place.keep();
                (inputs, replayer, n)
            }
            Err(e) => return (Outcome::Failed(e.to_string()), 0),
            Ok((Prepared::Unavailable(why), n)) => return (Outcome::Unavailable(why), n),
            Ok((Prepared::AlreadyDone, n)) => return (Outcome::AlreadyDone, n),
        };
        tokio::select! {
            _ = cancel.cancelled() => return (Outcome::Left, count),
            _ = limiter.wait() => {}
        }
        let records = match replayer.replay(&inputs).await {
            Ok(records) => records,
            // The provider refused the arm's request (its model, its size): the arm failed the
            // turn. A provider that was down or slow, or refused the account (its key, 401; its
            // access, 403; its quota, 429 `insufficient_quota`), says nothing of the arm.
            Err(why @ Unreplayable::Llm(LlmError::Rejected { .. })) if !account_refused(&why) => {
                return (Outcome::Unanswered(why.to_string()), count)
            }
            Err(why) => return (Outcome::Failed(why.to_string()), count),
        };
        match self.store.insert_reprocessed(&opts.run, &records).await {
            // Another copy of the run wrote this turn first.
            Ok(0) => (Outcome::AlreadyDone, count),
            Ok(_) => (Outcome::Done, count),
            Err(e) => (Outcome::Failed(e.to_string()), count),
        }
    }
}

/// The run's records of the selected turns against their originals, read one pair at a time:
/// a run of millions of records is compared in the memory of one.
async fn compare(
    hold: &mut RunHold,
    steps: &HashMap<(Uuid, String), usize>,
) -> Result<Comparison, ReprocessError> {
    let mut comparison = Comparison::default();
    let mut per_turn: HashMap<(Uuid, String), usize> = HashMap::new();
    let mut pairs = std::pin::pin!(hold.eval_rows_each());
    while let Some(p) = pairs.try_next().await? {
        let key = (p.session_id, p.turn_id.clone());
        if steps.contains_key(&key) {
            *per_turn.entry(key).or_default() += 1;
            comparison.add(&p);
        }
    }
    let originals: usize =
        per_turn.iter().map(|(k, n)| steps.get(k).copied().unwrap_or(0).max(*n)).sum();
    Ok(comparison.finish(per_turn.len(), originals))
}

/// Counts what became of turn `t` in `report`.
fn tally(report: &mut Report, t: &SelectedTurn, outcome: Outcome) {
    let (session, turn) = (t.session_id.to_string(), t.turn_id.clone());
    match outcome {
        Outcome::Done => report.done += 1,
        Outcome::AlreadyDone => report.already_done += 1,
        Outcome::Left => report.left += 1,
        Outcome::Unavailable(why) => {
            report.unavailable += 1;
            report.problem(session, turn, "skipped", why);
        }
        Outcome::Failed(why) => {
            warn!(run = %report.run, %session, %turn, reason = %why, "turn failed");
            report.failed += 1;
            report.problem(session, turn, "failed", why);
        }
        Outcome::Unanswered(why) => {
            warn!(run = %report.run, %session, %turn, reason = %why, "turn failed");
            report.failed += 1;
            report.unanswered.insert((t.session_id, t.turn_id.clone()));
            report.problem(session, turn, "failed", why);
        }
    }
}

/// Whether the provider refused the account rather than the request.
fn account_refused(why: &Unreplayable) -> bool {
    let Unreplayable::Llm(LlmError::Rejected { status, error }) = why else { return false };
    matches!(status, 401 | 403)
        || (*status == 429 && error.code.as_deref() == Some("insufficient_quota"))
}

/// A selected turn's original round trips so far.
fn round_trips(t: &SelectedTurn) -> usize {
    usize::try_from(t.round_trips).unwrap_or(0)
}

/// The `context_versions` of a replay's records: the ConversationContext it ran with (the run's
/// `--conversation-context`, or the turn's; its `--model` applied, so a model override is
/// another version) and the turn's AgentContext.
fn replay_versions(
    settings: &Settings,
    turn: &crate::contracts::UserTurn,
    opts: &Options,
    context: &crate::config::ConversationContext,
) -> serde_json::Value {
    use crate::config::content_version;
    let default = settings.default_conversation_context.as_str();
    let own = turn.conversation_context_id().map_or(default, |c| c.as_str());
    let id = opts.conversation_context.as_deref().unwrap_or(own);
    let agent_id =
        turn.agent_context_id().map_or(settings.default_agent_context.as_str(), |c| c.as_str());
    let agent = settings.agent_contexts.get(agent_id).map(content_version);
    serde_json::json!({
        "ConversationContext": { "Id": id, "Version": content_version(context) },
        "AgentContext": { "Id": agent_id, "Version": agent },
    })
}
