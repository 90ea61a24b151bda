//! Invoke: the `/responses` body in; the provider's answer (or why there is none) out. A
//! completed call is saved before it is forwarded, so a redelivered message never calls the
//! provider twice, and a call is claimed before it is made, so a copy running meanwhile waits
//! for its answer (`claim`); a lost chain (`previous_response_not_found`) is rebuilt and called
//! again.
//! A turn its client cancelled is not called, or its call is aborted (`watch`).

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Deps;
use crate::assemble::SessionState;
use crate::config::{Settings, Usd};
use crate::contracts::{ApiError, ErrorCode};
use crate::llm::{
    DeltaEvent, Endpoint, LlmClient, LlmError, LlmRequest, LlmResponse, RequestBody, StreamDelta,
};
use crate::messages::{
    AdmittedTurn, Answer, AssembledTurn, EndedRoundTrip, RoundTrip, SavedRoundTrip,
};
use crate::stage::{Cause, DeltaSink, Output, Stage, StageError};
use crate::store::{Settle, Store};

mod budget;
mod claim;
mod watch;

use watch::CancelWatch;

/// Calls the LLM.
#[derive(Debug)]
pub struct Invoke {
    settings: Arc<Settings>,
    store: Store,
    llm: Arc<dyn LlmClient>,
    deltas: Option<Arc<dyn DeltaSink>>,
    cancels: Arc<CancelWatch>,
}

/// How a provider call ended.
enum Call {
    /// The provider answered, or failed.
    Done(Result<LlmResponse, LlmError>),
    /// The turn was cancelled: the text streamed until then, and whether the call had been
    /// made (and aborted), which spends tokens the provider never reports.
    Cancelled(String, bool),
    /// The call would pass a money budget: not made.
    OverBudget(ApiError),
}

/// One provider call's inputs.
#[derive(Clone, Copy)]
struct CallArgs<'a> {
    endpoint: &'a Endpoint,
    body: &'a RequestBody,
    job: &'a AdmittedTurn,
    stream: bool,
    cancel: &'a CancellationToken,
}

impl Invoke {
    /// The stage, using `deps`' LLM client, store and delta sink.
    pub fn new(deps: &Deps) -> Self {
        Invoke {
            settings: deps.settings.clone(),
            store: deps.store.clone(),
            llm: deps.llm.clone(),
            deltas: deps.deltas.clone(),
            cancels: CancelWatch::new(deps.store.clone()),
        }
    }
}

impl Stage for Invoke {
    const NAME: &'static str = "invoke";
    const EXHAUSTED: ErrorCode = ErrorCode::LlmUnavailable;
    type In = AssembledTurn;
    type Out = EndedRoundTrip;

    async fn run(&self, job: AssembledTurn) -> Result<Output<EndedRoundTrip>, StageError> {
        let (key, step) = (job.admitted.key.clone(), job.admitted.step);
        let watched = self.cancels.watch(&key);
        let (state, held) = claim::take(&self.store, &key, step, &watched.token).await?;
        if let Some(saved) = state.saved {
            // An unreadable saved answer is not "not answered": calling again could charge twice.
            let persist = SavedRoundTrip::read(saved)
                .map_err(|e| StageError::unusable(format!("saved answer: {e}")))?;
            let persist = SavedRoundTrip::with_body(persist, job);
            info!(session = %key.session_id, turn = %key.turn_id, step, "provider already answered; forwarding the saved answer");
            return Ok(Output::Next(persist));
        }
        if !state.running {
            // A turn that ended (its client has the answer or the error) or moved on: a late
            // copy, which a provider call would only charge for.
            info!(session = %key.session_id, turn = %key.turn_id, step, "turn is not running this step; dropping a late copy");
            return Ok(Output::Finish(None));
        }
        let turn = job.admitted.user_turn().map_err(StageError::fail)?;
        let agent = super::agent_context(&self.settings, turn).ok();
        let endpoint =
            Endpoint::resolve(&self.settings.llm, agent).map_err(StageError::transient)?;
        let stream = turn.stream();
        let mut assembled = job.assembled;
        let mut rebuilt = false;
        let started = std::time::Instant::now();
        let stop = held.as_ref().map_or(&watched.token, claim::Held::stop);
        let mut result = if state.cancelled {
            Call::Cancelled(String::new(), false)
        } else {
            let (body, job, cancel) = (&assembled.body, &job.admitted, stop);
            let args = CallArgs { endpoint: &endpoint, body, job, stream, cancel };
            self.reserve_and_call(args, Settle::AtReservation).await?
        };
        if let Call::Done(Err(LlmError::PreviousResponseNotFound { .. })) = &result {
            warn!(session = %key.session_id, turn = %key.turn_id, "provider lost the chain; rebuilding it from stored history");
            let carried = job.session_state.as_ref();
            let stored = self.store.session_state_from(&key.session_id, carried).await?;
            let state = SessionState::from_stored(stored).map_err(StageError::unusable)?;
            let context =
                super::conversation_context(&self.settings, turn).map_err(StageError::fail)?;
            let chunks = assembled.retrieved_chunks(&state);
            // The MCP tools the lost chain was offered, offered again.
            let mcp_tools = mcp_tools_of(&assembled.body.to_value(), context);
            assembled = job
                .admitted
                .assemble(
                    &chunks,
                    &state.force_new_chain(),
                    (context, &mcp_tools),
                    &self.settings.assemble,
                )
                .map_err(StageError::fail)?;
            rebuilt = true;
            // The rebuilt body carries the whole history: reserved again, at its own worst case.
            let (body, admitted, cancel) = (&assembled.body, &job.admitted, stop);
            let args = CallArgs { endpoint: &endpoint, body, job: admitted, stream, cancel };
            // The refused call was not billed: its reservation settles at nothing.
            result = self.reserve_and_call(args, Settle::Cost(Usd::ZERO)).await?;
        }
        if held.as_ref().is_some_and(claim::Held::lost) {
            return Err(StageError::transient(Cause::ClaimTaken));
        }
        let round_trip = match result {
            Call::OverBudget(refusal) => {
                info!(session = %key.session_id, turn = %key.turn_id, step, "call over a money budget; not made");
                RoundTrip::Failed { errors: vec![refusal], raw: None }
            }
            Call::Cancelled(streamed, called) => {
                info!(session = %key.session_id, turn = %key.turn_id, step, streamed_chars = streamed.len(), called, "turn cancelled; provider call not made or aborted");
                let estimate = called.then(|| estimate_usage(assembled.body.as_str(), &streamed));
                self.record_call(&assembled.body, Err("cancelled"), None, estimate.as_ref());
                RoundTrip::Cancelled { streamed, answered: None, estimate }
            }
            Call::Done(Ok(response)) => {
                let took = Some(started.elapsed());
                self.record_call(&assembled.body, Ok(()), took, response.usage.as_ref());
                RoundTrip::Answered(Answer::from(response))
            }
            Call::Done(Err(e)) => {
                let took = Some(started.elapsed());
                self.record_call(&assembled.body, Err(e.code().as_str()), took, None);
                if e.is_transient() {
                    return Err(StageError::transient(e));
                }
                RoundTrip::Failed {
                    errors: vec![ApiError::new(e.code(), e.to_string())],
                    raw: e.raw_response().cloned(),
                }
            }
        };
        let persist = EndedRoundTrip {
            admitted: job.admitted,
            assembled: Some(assembled),
            warnings: job.warnings,
            result: round_trip,
            session_state: job.session_state,
            hops: Vec::new(),
        };
        self.keep_and_forward(persist, rebuilt, held).await
    }
}

impl Invoke {
    /// Saves the answer, then forwards it; or, when another call's answer to the round trip
    /// was saved first (a copy took this call over as it ended), forwards that one, as every
    /// copy does, so persist keeps one answer.
    async fn keep_and_forward(
        &self,
        mut persist: EndedRoundTrip,
        rebuilt: bool,
        held: Option<claim::Held>,
    ) -> Result<Output<EndedRoundTrip>, StageError> {
        let (key, step) = (persist.admitted.key.clone(), persist.admitted.step);
        let saved = SavedRoundTrip::encode(&mut persist, rebuilt)?;
        let kept = self.store.save_llm_result(&key, step, saved).await?;
        if let Some(held) = held {
            held.answered();
        }
        if kept {
            return Ok(Output::Next(persist));
        }
        warn!(session = %key.session_id, turn = %key.turn_id, step, "provider answered this round trip twice; forwarding the answer saved first");
        let first = self.store.saved_answer(&key, step).await?;
        let first = first.ok_or_else(|| StageError::unusable("saved answer vanished"))?;
        let first = SavedRoundTrip::read(first)
            .map_err(|e| StageError::unusable(format!("saved answer: {e}")))?;
        Ok(Output::Next(SavedRoundTrip::in_place_of(first, persist)))
    }

    fn record_call(
        &self,
        body: &RequestBody,
        outcome: Result<(), &str>,
        took: Option<std::time::Duration>,
        usage: Option<&crate::contracts::Usage>,
    ) {
        let model = body.head().model;
        let model = model.as_deref().unwrap_or("unknown");
        let outcome = outcome.err().unwrap_or("ok");
        let prices = &self.settings.telemetry.prices;
        crate::metrics::metrics().llm_call(model, outcome, took, usage, prices);
    }

    /// Reserves the call's worst case against its money budgets, then calls the provider; a
    /// call that would pass a budget is not made.
    async fn reserve_and_call(&self, a: CallArgs<'_>, earlier: Settle) -> Result<Call, StageError> {
        let reserved =
            budget::reserve(&self.settings, &self.store, a.job, a.body, a.cancel, earlier);
        match reserved.await? {
            budget::Reserved::Made { budgeted } => Ok(self.call(a, budgeted).await),
            budget::Reserved::Refused(refusal) => Ok(Call::OverBudget(refusal)),
            budget::Reserved::Cancelled => Ok(Call::Cancelled(String::new(), false)),
        }
    }

    /// Calls the provider, forwarding deltas of a streamed call in order while it runs, until
    /// it ends or `cancel` fires: then the call is dropped (its HTTP stream closed) and no
    /// further delta is published.
    async fn call(&self, a: CallArgs<'_>, once: bool) -> Call {
        let CallArgs { endpoint, body, job, stream, cancel } = a;
        let llm = &self.llm;
        let Some(sink) = self.deltas.clone().filter(|_| stream) else {
            return tokio::select! {
                r = llm.create_response(LlmRequest { endpoint, body, deltas: None, once }) => Call::Done(r),
                _ = cancel.cancelled() => Call::Cancelled(String::new(), true),
            };
        };
        let (tx, mut rx) = mpsc::channel::<StreamDelta>(256);
        let (key, step, to, stop) = (job.key.clone(), job.step, job.address(), cancel.clone());
        let forwarder = tokio::spawn(async move {
            let mut text = String::new();
            while let Some(delta) = rx.recv().await {
                if stop.is_cancelled() {
                    break;
                }
                if let DeltaEvent::OutputText { text: piece, .. } = &delta.event {
                    text.push_str(piece);
                }
                sink.publish(&key, step, &to, &delta).await;
            }
            text
        });
        let result = tokio::select! {
            r = llm.create_response(LlmRequest { endpoint, body, deltas: Some(&tx), once }) => Some(r),
            _ = cancel.cancelled() => None,
        };
        drop(tx);
        let streamed = forwarder.await.unwrap_or_default();
        match result {
            Some(r) => Call::Done(r),
            None => Call::Cancelled(streamed, true),
        }
    }
}

/// What an aborted call is charged when the provider never reported its usage: one token per
/// four bytes of the request body and per four characters of the text streamed back, rounded up
/// (the usual size of a token in English text and code; docs/tenancy.md, "Limits").
pub fn estimate_usage(body: &str, streamed: &str) -> crate::contracts::Usage {
    let input_tokens = (body.len() as u64).div_ceil(4);
    let output_tokens = (streamed.chars().count() as u64).div_ceil(4);
    crate::contracts::Usage {
        input_tokens,
        output_tokens,
        total_tokens: input_tokens + output_tokens,
        ..Default::default()
    }
}

/// The MCP function tools a request body offered.
fn mcp_tools_of(
    body: &serde_json::Value,
    context: &crate::config::ConversationContext,
) -> Vec<serde_json::Value> {
    let tools = body.get("tools").and_then(serde_json::Value::as_array);
    tools
        .into_iter()
        .flatten()
        .filter(|t| {
            let name = t.get("name").and_then(serde_json::Value::as_str).unwrap_or_default();
            context.server_tools.mcp_tool(name).is_some()
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod estimate_tests {
    #[test]
    fn an_aborted_call_is_charged_by_size() {
        let u = super::estimate_usage("0123456789", "héllo");
        assert_eq!((u.input_tokens, u.output_tokens, u.total_tokens), (3, 2, 5));
        assert_eq!(super::estimate_usage("", "").total_tokens, 0);
    }
}
