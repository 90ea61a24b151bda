//! `--dry-run`: what a run would do, turn by turn, and the estimated token volume, without
//! calling the model or writing anything. The first request of each turn is really rebuilt
//! (assembly is pure), so its size is known; later round trips are estimated from the original
//! requests. Tokens are estimated as bytes of the request body / 4.

use std::fmt;

use chrono::Utc;
use serde::Serialize;

use super::rebuild::user_request;
use super::{Options, Prepared, ReprocessError, Reprocessor};
use crate::contracts::Usage;

/// Turns listed in the printed plan; the totals cover all of them.
const SHOWN: usize = 20;

/// What a run would do.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DryRun {
    /// The run id checked for turns already done.
    pub run: String,
    /// Every selected turn.
    pub turns: Vec<PlannedTurn>,
    /// Turns that would be reprocessed.
    pub would_run: usize,
    /// Turns the run already reprocessed.
    pub already_done: usize,
    /// Turns that cannot be reprocessed.
    pub unavailable: usize,
    /// Turns beyond `--limit`.
    pub beyond_limit: usize,
    /// Estimated input tokens of the turns that would run.
    pub estimated_input_tokens: u64,
    /// Input tokens the originals of those turns used.
    pub original_input_tokens: u64,
    /// Total tokens the originals of those turns used.
    pub original_total_tokens: u64,
}

/// One selected turn in the plan.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedTurn {
    /// Session.
    pub session_id: String,
    /// Turn.
    pub turn_id: String,
    /// `run`, `already done`, `not reprocessable` or `beyond --limit`.
    pub status: &'static str,
    /// Why it is not reprocessable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Original round trips.
    pub round_trips: usize,
    /// The model it would run with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Estimated input tokens.
    pub estimated_input_tokens: u64,
    /// Input tokens the original used.
    pub original_input_tokens: u64,
}

/// Tokens in `json`: about four bytes of JSON per token.
fn estimate(json: &str) -> u64 {
    json.len() as u64 / 4
}

impl Reprocessor {
    /// What [`Reprocessor::run`] would do with `opts`.
    pub async fn dry_run(&self, opts: &Options) -> Result<DryRun, ReprocessError> {
        let selector = self.check(opts)?;
        let turns = self.store.reprocess_select(&selector, &opts.run).await?;
        let mut plan = DryRun { run: opts.run.clone(), ..DryRun::default() };
        let mut budget = opts.limit.unwrap_or(usize::MAX);
        for t in &turns {
            let (prepared, round_trips) = match self.prepare(opts, t).await {
                Ok(prepared) => prepared,
                // A turn whose stored rows PostgreSQL cannot read back (a value its `jsonb`
                // refuses, which the live path's `json` columns kept) is that turn's problem, as
                // in a run: the plan goes on with the others. A lost database stops it.
                Err(e) if !e.is_transient() => {
                    (Prepared::Unavailable(format!("its stored rows cannot be read: {e}")), 0)
                }
                Err(e) => return Err(e.into()),
            };
            let mut planned = PlannedTurn {
                session_id: t.session_id.to_string(),
                turn_id: t.turn_id.clone(),
                status: "run",
                reason: None,
                round_trips,
                model: None,
                estimated_input_tokens: 0,
                original_input_tokens: 0,
            };
            match prepared {
                Prepared::AlreadyDone => {
                    planned.status = "already done";
                    plan.already_done += 1;
                }
                Prepared::Unavailable(why) => {
                    planned.status = "not reprocessable";
                    planned.reason = Some(why);
                    plan.unavailable += 1;
                }
                Prepared::Ready(_, _) if budget == 0 => {
                    planned.status = "beyond --limit";
                    plan.beyond_limit += 1;
                }
                Prepared::Ready(inputs, replayer) => {
                    budget -= 1;
                    let first =
                        user_request(&inputs, &replayer.context, replayer.policy, Utc::now())
                            .map_or(0, |a| estimate(a.body.as_str()));
                    let later: u64 = inputs
                        .steps
                        .iter()
                        .skip(1)
                        .filter_map(|s| s.original.request_payload.as_ref())
                        .map(|body| estimate(&body.to_string()))
                        .sum();
                    let used: Vec<Usage> = inputs
                        .steps
                        .iter()
                        .filter_map(|s| s.original.usage.clone())
                        .filter_map(|u| serde_json::from_value(u).ok())
                        .collect();
                    planned.model = Some(replayer.context.model.clone());
                    planned.estimated_input_tokens = first + later;
                    planned.original_input_tokens = used.iter().map(|u| u.input_tokens).sum();
                    plan.would_run += 1;
                    plan.estimated_input_tokens += planned.estimated_input_tokens;
                    plan.original_input_tokens += planned.original_input_tokens;
                    plan.original_total_tokens += used.iter().map(|u| u.total_tokens).sum::<u64>();
                }
            }
            plan.turns.push(planned);
        }
        Ok(plan)
    }
}

impl fmt::Display for DryRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "dry run of reprocess run {}: {} turns selected (nothing is called or written)",
            self.run,
            self.turns.len()
        )?;
        for t in self.turns.iter().take(SHOWN) {
            write!(
                f,
                "  {} {} ({} round trips): {}",
                t.session_id, t.turn_id, t.round_trips, t.status
            )?;
            match (&t.reason, &t.model) {
                (Some(reason), _) => writeln!(f, ": {reason}")?,
                (None, Some(model)) => writeln!(
                    f,
                    " with {model}, ~{} input tokens (original {})",
                    t.estimated_input_tokens, t.original_input_tokens
                )?,
                (None, None) => writeln!(f)?,
            }
        }
        if self.turns.len() > SHOWN {
            writeln!(f, "  … and {} more", self.turns.len() - SHOWN)?;
        }
        writeln!(
            f,
            "  would run {}, already done {}, not reprocessable {}, beyond --limit {}",
            self.would_run, self.already_done, self.unavailable, self.beyond_limit
        )?;
        writeln!(
            f,
            "  estimated input tokens ~{} (the originals used {} input, {} total)",
            self.estimated_input_tokens, self.original_input_tokens, self.original_total_tokens
        )
    }
}
