//! Invoke: the `/responses` body in; the provider's answer (or why there is none) out. A
//! completed call is saved before it is forwarded, so a redelivered message never calls the
//! provider twice; a lost chain (`previous_response_not_found`) is rebuilt and called again.

use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{user_turn, Deps, StageError};
use crate::broker::{OutMessage, StageName, Topology};
use crate::contracts::ApiError;
use crate::llm::{Endpoint, LlmError, LlmRequest, LlmResponse, StreamDelta};
use crate::messages::{Answer, InvokeJob, PersistJob, RoundTrip, StageMessage};

/// Runs the stage for one turn.
pub async fn run(deps: &Deps, job: InvokeJob) -> Result<(StageName, StageMessage), StageError> {
    let key = job.job.key.clone();
    let step = job.job.step;
    if let Some(saved) = deps.store.llm_result(&key, step).await? {
        if let Ok(persist) = serde_json::from_value::<PersistJob>(saved) {
            info!(session = %key.session_id, turn = %key.turn_id, step, "provider already answered; forwarding the saved answer");
            return Ok((StageName::Persist, StageMessage::Persist(persist)));
        }
    }
    let turn = user_turn(&job.job).cloned();
    let agent = turn.as_ref().and_then(|t| deps.agent_context(t).ok());
    let endpoint = Endpoint::resolve(&deps.settings.llm, agent);
    let stream = turn.as_ref().is_some_and(|t| t.stream());
    let mut assembled = job.assembled;
    let mut result = call(deps, &endpoint, &assembled.body, &job.job, stream).await;
    if let Err(LlmError::PreviousResponseNotFound { .. }) = &result {
        warn!(session = %key.session_id, turn = %key.turn_id, "provider lost the chain; rebuilding it from stored history");
        let state = match super::assemble::load_state(deps, &job.job).await? {
            Ok(s) => s.force_new_chain(),
            Err(e) => return Ok((StageName::Persist, super::failed(job.job, vec![e]))),
        };
        match super::assemble::build(deps, &job.job, &job.chunks, &state) {
            Ok(rebuilt) => assembled = rebuilt,
            Err(e) => return Ok((StageName::Persist, super::failed(job.job, vec![e]))),
        }
        result = call(deps, &endpoint, &assembled.body, &job.job, stream).await;
    }
    record_call(deps, &assembled.body, &result);
    let round_trip = match result {
        Ok(response) => RoundTrip::Answered(Answer::from(response)),
        Err(e) if e.is_transient() => return Err(StageError::Transient(e.to_string())),
        Err(e) => RoundTrip::Failed {
            errors: vec![ApiError::new(e.code(), e.to_string())],
            raw: e.raw_response().cloned(),
        },
    };
    let persist =
        PersistJob { job: job.job, assembled: Some(assembled), warnings: job.warnings, result: round_trip };
    let saved = serde_json::to_value(&persist)?;
    deps.store.save_llm_result(&key, step, &saved).await?;
    Ok((StageName::Persist, StageMessage::Persist(persist)))
}

fn record_call(deps: &Deps, body: &serde_json::Value, result: &Result<LlmResponse, LlmError>) {
    let model = body.get("model").and_then(serde_json::Value::as_str).unwrap_or("unknown");
    let (outcome, usage) = match result {
        Ok(r) => ("ok", r.usage.as_ref()),
        Err(e) => (e.code().as_str(), None),
    };
    crate::metrics::metrics().llm_call(model, outcome, usage, &deps.settings.telemetry.prices);
}

async fn call(
    deps: &Deps,
    endpoint: &Endpoint,
    body: &serde_json::Value,
    job: &crate::messages::TurnJob,
    stream: bool,
) -> Result<LlmResponse, LlmError> {
    let publisher = deps.deltas.clone().filter(|_| stream);
    let Some(publisher) = publisher else {
        return deps.llm.create_response(LlmRequest { endpoint, body, deltas: None }).await;
    };
    // Deltas are published one at a time, in order, while the call runs.
    let (tx, mut rx) = mpsc::channel::<StreamDelta>(256);
    let key = job.key.clone();
    let step = job.step;
    let topology = deps.topology.clone();
    let forwarder = tokio::spawn(async move {
        while let Some(delta) = rx.recv().await {
            publisher.publish(delta_message(&topology, &key, step, &delta)).await;
        }
    });
    let result = deps.llm.create_response(LlmRequest { endpoint, body, deltas: Some(&tx) }).await;
    drop(tx);
    let _ = forwarder.await;
    result
}

/// A stream delta as published to the session's reply queue: marked as a delta in the `type`
/// property, the `x-aptix-kind` header and the body.
pub fn delta_message(
    topology: &Topology,
    key: &crate::contracts::TurnKey,
    step: i32,
    delta: &StreamDelta,
) -> OutMessage {
    let body = serde_json::json!({
        "Delta": true,
        "SessionId": key.session_id,
        "TurnId": key.turn_id,
        "Step": step,
        "Seq": delta.seq,
        "Event": delta.event,
    });
    let mut msg = OutMessage::to_queue(
        key.session_id.to_string(),
        "delta",
        format!("delta:{}:{}:{step}:{}", key.session_id, key.turn_id, delta.seq),
        serde_json::to_vec(&body).unwrap_or_default(),
    )
    .header("x-aptix-session-id", key.session_id.to_string())
    .header("x-aptix-turn-id", key.turn_id.to_string())
    .header("x-aptix-step", step)
    .header("x-aptix-seq", delta.seq);
    msg.exchange = topology.replies_exchange();
    msg.session = Some(key.session_id);
    msg
}
