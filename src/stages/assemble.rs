//! Assemble: the turn and its chunks in; the `/responses` body and the record of what it sends
//! out. The work is the pure `crate::assemble`; this stage loads the session state for it.

use chrono::Utc;

use super::{failed, user_turn, Deps, StageError};
use crate::assemble::{assemble, AssembleInput, Assembled, SessionState, TurnInput};
use crate::broker::StageName;
use crate::contracts::{ApiError, ErrorCode, ValidatedRequest};
use crate::messages::{AssembleJob, InvokeJob, StageMessage, TurnJob};

/// Runs the stage for one turn.
pub async fn run(deps: &Deps, job: AssembleJob) -> Result<(StageName, StageMessage), StageError> {
    let state = load_state(deps, &job.job).await?;
    let state = match state {
        Ok(s) => s,
        Err(e) => return Ok((StageName::Persist, failed(job.job, vec![e]))),
    };
    match build(deps, &job.job, &job.chunks, &state) {
        Ok(assembled) => Ok((
            StageName::Invoke,
            StageMessage::Invoke(InvokeJob {
                job: job.job,
                chunks: job.chunks,
                warnings: job.warnings,
                assembled,
            }),
        )),
        Err(e) => Ok((StageName::Persist, failed(job.job, vec![e]))),
    }
}

/// The session's assemble state; the inner error fails the turn (stored state unreadable).
pub async fn load_state(deps: &Deps, job: &TurnJob) -> Result<Result<SessionState, ApiError>, StageError> {
    let raw = deps.store.session_state(&job.key.session_id).await?;
    Ok(serde_json::from_value(raw).map_err(|e| {
        ApiError::new(ErrorCode::Internal, format!("the session's stored state is unreadable: {e}"))
    }))
}

/// Builds the request for a job from `state` (also used by invoke to rebuild a lost chain).
pub fn build(
    deps: &Deps,
    job: &TurnJob,
    chunks: &[crate::chunk::Chunk],
    state: &SessionState,
) -> Result<Assembled, ApiError> {
    let turn = user_turn(job).ok_or_else(super::retrieve::not_a_user_turn)?;
    let context = deps.conversation_context(turn)?;
    let turn_input = match &job.continuation {
        Some(ValidatedRequest::ToolContinuation(c)) => TurnInput::ToolContinuation {
            continuation: c,
            pending: &job.pending_tool_calls,
            stream: turn.stream(),
        },
        _ => TurnInput::User { turn, chunks },
    };
    let input =
        AssembleInput { state, context, policy: &deps.settings.assemble, now: Utc::now(), turn: turn_input };
    assemble(input).map_err(|e| e.to_api_error())
}
