//! A server tool call recorded before it runs (`store::effects`, docs/tools.md "Effects"): a
//! step that is redelivered or retried gets the outcome of a call it already ran instead of
//! running it again, and a call that was cut short runs again only if its tool is idempotent;
//! otherwise the model and the operator are told that its outcome is unknown.

use std::time::Duration;

use serde_json::{json, Value};
use tracing::warn;

use super::tools::{Produced, ToolFailure};
use super::Retrieve;
use crate::config::{ConversationContext, ServerTool};
use crate::contracts::{FileRef, ToolCall, UserTurn};
use crate::messages::AdmittedTurn;
use crate::stage::StageError;
use crate::store::{EffectKey, EffectStart};

impl Retrieve {
    /// Runs `call` once for the turn, recording it first and its outcome after.
    pub(super) async fn run_recorded(
        &self,
        job: &AdmittedTurn,
        call: &ToolCall,
        turn: &UserTurn,
        context: &ConversationContext,
    ) -> Result<Produced, StageError> {
        let key = EffectKey {
            session: job.key.session_id.as_uuid(),
            turn: job.key.turn_id.as_str(),
            step: job.step - 1,
            call_id: &call.tool_call_id,
        };
        let arguments = serde_json::from_str(&call.arguments_json)
            .unwrap_or_else(|_| Value::String(call.arguments_json.clone()));
        let mut start = self.store.begin_effect(&key, &call.name, &arguments).await?;
        if let EffectStart::CutShort { age, .. } = start {
            // An attempt younger than the call may take could still be running in another
            // worker (a message redelivered while its first delivery is handled): its outcome
            // is awaited before the call is judged cut short.
            let live = longest_call(context, &call.name) + LIVE_MARGIN;
            if age < live {
                tokio::time::sleep(live - age).await;
                if let Some(outcome) = self.store.effect_outcome(&key).await? {
                    start = EffectStart::Ended(outcome);
                }
            }
        }
        match start {
            EffectStart::Ended(outcome) => return Ok(replayed(&outcome)),
            EffectStart::Mismatch => {
                let why = "this call's id repeats another call of the same answer; not run";
                return Ok((Err(ToolFailure::Recorded(why.into())), None));
            }
            EffectStart::CutShort { attempts, .. } if !may_run_again(context, &call.name) => {
                crate::metrics::metrics().tool_outcome_unknown(&call.name);
                warn!(
                    session = %key.session, turn = key.turn, step = key.step,
                    call = key.call_id, tool = %call.name, attempts,
                    "server tool call cut short; its outcome is unknown and it is not run again"
                );
                let why = "the pipeline stopped while this call ran, and the tool is not \
                           declared idempotent, so it was not run again; it may or may not have \
                           taken effect";
                let produced = (Err(ToolFailure::Unknown(why.into())), None);
                self.store.end_effect(&key, &recorded(&produced)).await?;
                return Ok(produced);
            }
            EffectStart::Fresh | EffectStart::CutShort { .. } => {}
        }
        if self.cancelled(job).await? {
            // Recorded like an outcome, so a redelivery answers the call the same way.
            let produced = (Err(ToolFailure::NotRun("the turn was cancelled")), None);
            self.store.end_effect(&key, &recorded(&produced)).await?;
            return Ok(produced);
        }
        let produced = self.run_tool(call, &key.idempotency_key(), turn, job, context).await?;
        let produced = match produced {
            (Err(ToolFailure::Mcp(e)), file) if e.sent_without_answer() => {
                crate::metrics::metrics().tool_outcome_unknown(&call.name);
                (Err(ToolFailure::Unknown(e.to_string())), file)
            }
            other => other,
        };
        self.store.end_effect(&key, &recorded(&produced)).await?;
        Ok(produced)
    }

    /// Whether the turn's cancel (or an interrupting follow-up) came: a call about to run does
    /// not. One started runs to its end (docs/tools.md, "Effects").
    async fn cancelled(&self, job: &AdmittedTurn) -> Result<bool, StageError> {
        let marked = self.store.cancel_requested(std::slice::from_ref(&job.key)).await?;
        Ok(!marked.is_empty())
    }
}

/// Added to a call's longest time before an unfinished attempt is judged cut short.
const LIVE_MARGIN: Duration = Duration::from_secs(5);

/// The longest a call of `name` may run: its MCP server's timeout; a built-in's bound.
fn longest_call(context: &ConversationContext, name: &str) -> Duration {
    match context.server_tools.mcp_tool(name) {
        Some((server, _)) => Duration::from_millis(server.timeout_ms),
        None => Duration::from_secs(30),
    }
}

/// Whether a call of `name` may run again after an attempt was cut short: reading and
/// content-addressed built-ins may, an MCP tool only when its server declares it idempotent.
fn may_run_again(context: &ConversationContext, name: &str) -> bool {
    if let Some((server, tool)) = context.server_tools.mcp_tool(name) {
        return server.idempotent(tool);
    }
    matches!(
        context.server_tools.runs(name),
        Some(ServerTool::SearchCode | ServerTool::WriteFile) | None
    )
}

/// An outcome as `tool_effects.outcome` keeps it.
fn recorded((outcome, file): &Produced) -> Value {
    match outcome {
        Ok(json) => json!({ "ok": json, "file": file }),
        Err(ToolFailure::Unknown(why)) => json!({ "unknown": why }),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

/// What a recorded outcome gives the call again.
fn replayed(outcome: &Value) -> Produced {
    let text = |k: &str| outcome.get(k).and_then(Value::as_str).map(str::to_owned);
    if let Some(ok) = text("ok") {
        let file: Option<FileRef> =
            outcome.get("file").cloned().and_then(|f| serde_json::from_value(f).ok());
        return (Ok(ok), file);
    }
    if let Some(why) = text("unknown") {
        return (Err(ToolFailure::Unknown(why)), None);
    }
    (Err(ToolFailure::Recorded(text("error").unwrap_or_default())), None)
}
