//! Invoke: the `/responses` body in; the provider's answer (or why there is none) out. A
//! completed call is saved before it is forwarded, so a redelivered message never calls the
//! provider twice, and a call is claimed before it is made, so a copy running meanwhile waits
//! for its answer (`claim`); a lost chain (`previous_response_not_found`) is rebuilt and called
//! again (`attempt`).
//! A turn its client cancelled is not called, or its call is aborted (`watch`).

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Deps;
use crate::config::Settings;
use crate::contracts::{ApiError, ErrorCode};
use crate::llm::{
    DeltaEvent, Endpoint, LlmClient, LlmError, LlmRequest, LlmResponse, RequestBody, StreamDelta,
};
use crate::messages::{AdmittedTurn, AssembledTurn, EndedRoundTrip};
use crate::stage::{DeltaSink, Output, Stage, StageError};
use crate::store::Store;

mod attempt;
mod budget;
mod claim;
mod watch;

use attempt::Attempt;
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

    async fn run(&self, mut job: AssembledTurn) -> Result<Output<EndedRoundTrip>, StageError> {
        let watched = self.cancels.watch(&job.admitted.key);
        loop {
            match self.attempt(job, &watched.token).await? {
                Attempt::Ended(out) => return Ok(out),
                Attempt::GaveWay(back) => job = back,
            }
        }
    }
}

impl Invoke {
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
    /// call that would pass a budget is not made. The reservation made, if any.
    async fn reserve_and_call(&self, a: CallArgs<'_>) -> Result<(Call, Option<i64>), StageError> {
        match budget::reserve(&self.settings, &self.store, a.job, a.body, a.cancel).await? {
            budget::Reserved::Made { reservation } => {
                Ok((self.call(a, reservation.is_some()).await, reservation))
            }
            budget::Reserved::Refused(refusal) => Ok((Call::OverBudget(refusal), None)),
            budget::Reserved::Cancelled => Ok((Call::Cancelled(String::new(), false), None)),
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
