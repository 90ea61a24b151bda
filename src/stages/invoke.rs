//! Invoke: the `/responses` body in; the provider's answer (or why there is none) out. A
//! completed call is saved before it is forwarded, so a redelivered message never calls the
//! provider twice; a lost chain (`previous_response_not_found`) is rebuilt and called again.

use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::{info, warn};

use super::Deps;
use crate::assemble::SessionState;
use crate::config::Settings;
use crate::contracts::{ApiError, ErrorCode};
use crate::llm::{Endpoint, LlmClient, LlmError, LlmRequest, LlmResponse, StreamDelta};
use crate::messages::{Answer, InvokeJob, PersistJob, RoundTrip, SavedRoundTrip, TurnJob};
use crate::stage::{DeltaSink, Output, Stage, StageError};
use crate::store::Store;

/// Calls the LLM.
#[derive(Debug)]
pub struct Invoke {
    settings: Arc<Settings>,
    store: Store,
    llm: Arc<dyn LlmClient>,
    deltas: Option<Arc<dyn DeltaSink>>,
}

impl Invoke {
    /// The stage, using `deps`' LLM client, store and delta sink.
    pub fn new(deps: &Deps) -> Self {
        Invoke {
            settings: deps.settings.clone(),
            store: deps.store.clone(),
            llm: deps.llm.clone(),
            deltas: deps.deltas.clone(),
        }
    }
}

impl Stage for Invoke {
    const NAME: &'static str = "invoke";
    const EXHAUSTED: ErrorCode = ErrorCode::LlmUnavailable;
    type In = InvokeJob;
    type Out = PersistJob;

    async fn run(&self, job: InvokeJob) -> Result<Output<PersistJob>, StageError> {
        let (key, step) = (job.job.key.clone(), job.job.step);
        if let Some(saved) = self.store.llm_result(&key, step).await? {
            // An unreadable saved answer is not "not answered": calling again could charge twice.
            let persist = SavedRoundTrip::read(saved)
                .map_err(|e| StageError::unusable(format!("saved answer: {e}")))?;
            info!(session = %key.session_id, turn = %key.turn_id, step, "provider already answered; forwarding the saved answer");
            return Ok(Output::next(persist));
        }
        let turn = job.job.user_turn().map_err(StageError::fail)?;
        let agent = super::agent_context(&self.settings, turn).ok();
        let endpoint =
            Endpoint::resolve(&self.settings.llm, agent).map_err(StageError::Transient)?;
        let stream = turn.stream();
        let mut assembled = job.assembled;
        let mut result = self.call(&endpoint, &assembled.body, &job.job, stream).await;
        if let Err(LlmError::PreviousResponseNotFound { .. }) = &result {
            warn!(session = %key.session_id, turn = %key.turn_id, "provider lost the chain; rebuilding it from stored history");
            let stored = self.store.session_state(&key.session_id).await?;
            let state = SessionState::from_stored(stored).map_err(StageError::unusable)?;
            let context =
                super::conversation_context(&self.settings, turn).map_err(StageError::fail)?;
            assembled = job
                .job
                .assemble(&job.chunks, &state.force_new_chain(), context, &self.settings.assemble)
                .map_err(StageError::fail)?;
            result = self.call(&endpoint, &assembled.body, &job.job, stream).await;
        }
        self.record_call(&assembled.body, &result);
        let round_trip = match result {
            Ok(response) => RoundTrip::Answered(Answer::from(response)),
            Err(e) if e.is_transient() => return Err(StageError::Transient(e.to_string())),
            Err(e) => RoundTrip::Failed {
                errors: vec![ApiError::new(e.code(), e.to_string())],
                raw: e.raw_response().cloned(),
            },
        };
        let persist = PersistJob {
            job: job.job,
            assembled: Some(assembled),
            warnings: job.warnings,
            result: round_trip,
        };
        self.store.save_llm_result(&key, step, &SavedRoundTrip::encode(&persist)?).await?;
        Ok(Output::next(persist))
    }
}

impl Invoke {
    fn record_call(&self, body: &serde_json::Value, result: &Result<LlmResponse, LlmError>) {
        let model = body.get("model").and_then(serde_json::Value::as_str).unwrap_or("unknown");
        let (outcome, usage) = match result {
            Ok(r) => ("ok", r.usage.as_ref()),
            Err(e) => (e.code().as_str(), None),
        };
        crate::metrics::metrics().llm_call(model, outcome, usage, &self.settings.telemetry.prices);
    }

    async fn call(
        &self,
        endpoint: &Endpoint,
        body: &serde_json::Value,
        job: &TurnJob,
        stream: bool,
    ) -> Result<LlmResponse, LlmError> {
        let llm = &self.llm;
        let Some(sink) = self.deltas.clone().filter(|_| stream) else {
            return llm.create_response(LlmRequest { endpoint, body, deltas: None }).await;
        };
        // Deltas are published one at a time, in order, while the call runs.
        let (tx, mut rx) = mpsc::channel::<StreamDelta>(256);
        let (key, step, to) = (job.key.clone(), job.step, job.address());
        let forwarder = tokio::spawn(async move {
            while let Some(delta) = rx.recv().await {
                sink.publish(&key, step, &to, &delta).await;
            }
        });
        let result = llm.create_response(LlmRequest { endpoint, body, deltas: Some(&tx) }).await;
        drop(tx);
        let _ = forwarder.await;
        result
    }
}
