//! One attempt at a round trip's provider call: the call's claim taken (or the saved answer
//! found), the call made, a lost chain rebuilt and called again, the answer saved and
//! forwarded. An attempt whose claim a copy took gives the job back, to wait for that copy's
//! answer as a copy would.

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::claim::{self, Held, Taken};
use super::{estimate_usage, mcp_tools_of, Call, CallArgs, Invoke};
use crate::assemble::{Assembled, SessionState, StoredState};
use crate::contracts::{ApiError, TurnKey};
use crate::llm::{Endpoint, LlmError, RequestBody};
use crate::messages::{
    AdmittedTurn, Answer, AssembledTurn, EndedRoundTrip, RoundTrip, SavedRoundTrip,
};
use crate::stage::{Output, StageError};

/// Whether the provider refused the call for a chain it lost.
fn lost_chain(result: &Call) -> bool {
    matches!(result, Call::Done(Err(LlmError::PreviousResponseNotFound { .. })))
}

/// A saved answer as the round trip it holds; one this build cannot read is unusable data, never
/// "not answered".
fn read_saved(saved: serde_json::Value) -> Result<EndedRoundTrip, StageError> {
    SavedRoundTrip::read(saved).map_err(|e| StageError::unusable(format!("saved answer: {e}")))
}

/// How one attempt ended.
pub(super) enum Attempt {
    /// With the stage's output.
    Ended(Output<EndedRoundTrip>),
    /// A copy of the message took the call this attempt had claimed: the job, given back.
    GaveWay(AssembledTurn),
}

impl Invoke {
    /// Claims the call (waiting while a copy holds it) and makes it; or forwards the answer
    /// already saved, or drops a late copy.
    pub(super) async fn attempt(
        &self,
        job: AssembledTurn,
        cancel: &CancellationToken,
    ) -> Result<Attempt, StageError> {
        let (key, step) = (job.admitted.key.clone(), job.admitted.step);
        let (cancelled, held) = match claim::take(&self.store, &key, step, cancel).await? {
            Taken::Answered(saved) => {
                // An unreadable saved answer is not "not answered": calling again could charge
                // twice.
                let persist = SavedRoundTrip::with_body(read_saved(saved)?, job);
                info!(session = %key.session_id, turn = %key.turn_id, step, "provider already answered; forwarding the saved answer");
                return Ok(Attempt::Ended(Output::Next(persist)));
            }
            Taken::NotRunning => {
                // A turn that ended (its client has the answer or the error) or moved on: a
                // late copy, which a provider call would only charge for.
                info!(session = %key.session_id, turn = %key.turn_id, step, "turn is not running this step; dropping a late copy");
                return Ok(Attempt::Ended(Output::Finish(None)));
            }
            Taken::Held { cancelled, held } => (cancelled, held),
        };
        self.call_held(job, cancelled, held).await
    }

    /// Makes the call this attempt holds (none when the turn's cancel was admitted), rebuilds
    /// a lost chain and calls again, then saves and forwards the outcome.
    async fn call_held(
        &self,
        job: AssembledTurn,
        cancelled: bool,
        held: Held,
    ) -> Result<Attempt, StageError> {
        let AssembledTurn { admitted, warnings, assembled: sent, session_state } = job;
        let turn = admitted.user_turn().map_err(StageError::fail)?;
        let agent = super::super::agent_context(&self.settings, turn).ok();
        let endpoint =
            Endpoint::resolve(&self.settings.llm, agent).map_err(StageError::transient)?;
        let stream = turn.stream();
        let started = std::time::Instant::now();
        let cancel = held.stop();
        let args = |body| CallArgs { endpoint: &endpoint, body, job: &admitted, stream, cancel };
        let (mut result, reservation) = if cancelled {
            (Call::Cancelled(String::new(), false), None)
        } else {
            self.reserve_and_call(args(&sent.body)).await?
        };
        let mut rebuilt = None;
        if lost_chain(&result) && !held.lost() {
            if let Some(id) = reservation {
                // The refused call was not billed: its reservation costs nothing. Left open
                // (the database failing now), the next reservation settles it whole.
                if let Err(error) = self.store.settle_unbilled(id).await {
                    warn!(session = %admitted.key.session_id, turn = %admitted.key.turn_id, %error, "refused call's reservation not settled at nothing");
                }
            }
            let state = session_state.as_ref();
            let again = rebuilt.insert(self.rebuild(&admitted, state, &sent).await?);
            // The rebuilt body carries the whole history: reserved again, at its own worst case.
            result = self.reserve_and_call(args(&again.body)).await?.0;
        }
        // Stopped because a copy took the call, or the round trip was answered or ended
        // meanwhile: given way, the job finds the copy's answer. A call that ended before it
        // could be stopped is kept (an answer saved second forwards the first).
        if held.lost() && (lost_chain(&result) || matches!(result, Call::Cancelled(..))) {
            let job = AssembledTurn { admitted, warnings, assembled: sent, session_state };
            return Ok(Attempt::GaveWay(job));
        }
        let round_trip = self.round_trip(
            result,
            rebuilt.as_ref().unwrap_or(&sent),
            (&admitted.key, admitted.step),
            started,
        )?;
        let (assembled, sent) = match rebuilt {
            Some(rebuilt) => (rebuilt, Some(sent.body)),
            None => (sent, None),
        };
        let persist = EndedRoundTrip {
            admitted,
            assembled: Some(assembled),
            warnings,
            result: round_trip,
            session_state,
            hops: Vec::new(),
        };
        self.keep_and_forward(persist, sent, held).await.map(Attempt::Ended)
    }

    /// The request rebuilt from stored history, for a chain the provider lost
    /// (`previous_response_not_found`).
    async fn rebuild(
        &self,
        admitted: &AdmittedTurn,
        carried: Option<&StoredState>,
        sent: &Assembled,
    ) -> Result<Assembled, StageError> {
        let key = &admitted.key;
        warn!(session = %key.session_id, turn = %key.turn_id, "provider lost the chain; rebuilding it from stored history");
        let turn = admitted.user_turn().map_err(StageError::fail)?;
        let stored = self.store.session_state_from(&key.session_id, carried).await?;
        let state = SessionState::from_stored(stored).map_err(StageError::unusable)?;
        let context =
            super::super::conversation_context(&self.settings, turn).map_err(StageError::fail)?;
        let chunks = sent.retrieved_chunks(&state);
        // The MCP tools the lost chain was offered, offered again.
        let mcp_tools = mcp_tools_of(&sent.body.to_value(), context);
        let policy = &self.settings.assemble;
        admitted
            .assemble(&chunks, &state.force_new_chain(), (context, &mcp_tools), policy)
            .map_err(StageError::fail)
    }

    /// The round trip a call's outcome makes; a failure worth trying again is an error.
    fn round_trip(
        &self,
        result: Call,
        assembled: &Assembled,
        (key, step): (&TurnKey, i32),
        started: std::time::Instant,
    ) -> Result<RoundTrip, StageError> {
        let body = &assembled.body;
        let (session, turn) = (&key.session_id, &key.turn_id);
        Ok(match result {
            Call::OverBudget(refusal) => {
                info!(%session, %turn, step, "call over a money budget; not made");
                RoundTrip::Failed { errors: vec![refusal], raw: None }
            }
            Call::Cancelled(streamed, called) => {
                info!(%session, %turn, step, streamed_chars = streamed.len(), called, "turn cancelled; provider call not made or aborted");
                let estimate = called.then(|| estimate_usage(body.as_str(), &streamed));
                self.record_call(body, Err("cancelled"), None, estimate.as_ref());
                RoundTrip::Cancelled { streamed, answered: None, estimate }
            }
            Call::Done(Ok(response)) => {
                let took = Some(started.elapsed());
                self.record_call(body, Ok(()), took, response.usage.as_ref());
                RoundTrip::Answered(Answer::from(response))
            }
            Call::Done(Err(e)) => {
                let took = Some(started.elapsed());
                self.record_call(body, Err(e.code().as_str()), took, None);
                if e.is_transient() {
                    return Err(StageError::transient(e));
                }
                let errors = vec![ApiError::new(e.code(), e.to_string())];
                RoundTrip::Failed { errors, raw: e.raw_response().cloned() }
            }
        })
    }

    /// Saves the answer, then forwards it; or, when another call's answer to the round trip
    /// was saved first (a copy took this call over as it ended), forwards that one, as every
    /// copy does, so persist keeps one answer. `sent`: the message's own body when `persist`
    /// carries a rebuilt one.
    async fn keep_and_forward(
        &self,
        mut persist: EndedRoundTrip,
        sent: Option<RequestBody>,
        held: Held,
    ) -> Result<Output<EndedRoundTrip>, StageError> {
        let (key, step) = (persist.admitted.key.clone(), persist.admitted.step);
        let saved = SavedRoundTrip::encode(&mut persist, sent.is_some())?;
        let kept = self.store.save_llm_result(&key, step, saved).await?;
        held.answered();
        if kept {
            return Ok(Output::Next(persist));
        }
        warn!(session = %key.session_id, turn = %key.turn_id, step, "provider answered this round trip twice; forwarding the answer saved first");
        let first = self.store.saved_answer(&key, step).await?;
        let first = first.ok_or_else(|| StageError::unusable("saved answer vanished"))?;
        let first = read_saved(first)?;
        Ok(Output::Next(SavedRoundTrip::in_place_of(first, persist, sent)))
    }
}
