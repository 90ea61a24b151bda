//! A round trip's ending as persist offers it ([`FinishStep`]) and the step statement's own
//! parameters decided from it ([`StepParams`]): shared by the transaction (`records.rs`) and the
//! one-call way (`finish_at_once.rs`).

use serde_json::Value;

use super::new_record::NewRecord;
use super::outbox;
use super::StoreError;
use crate::assemble::PackedState;
use crate::contracts::{TenantName, TurnKey};
use crate::lifecycle::{transition, Event, Phase, StepEnd};
use crate::messages::{Outgoing, ReplyOut};

/// How a round trip leaves its turn.
#[derive(Debug, Clone)]
pub enum StepOutcome {
    /// A final answer: the turn is done and the session free.
    Completed,
    /// An error reply: the turn is done and the session free.
    Failed,
    /// Tool calls went to the client; the turn holds the session until results come.
    AwaitingToolResults {
        /// The ordered client calls, as JSON.
        pending: Value,
        /// Warnings so far, owed to the final response.
        warnings: Value,
        /// Server calls of the same answer, run when the client's results come.
        server_calls: Value,
        /// The turn's server executions so far.
        executed: Value,
    },
    /// The answer called only server tools: the turn runs on (no reply), starting its next
    /// round trip where they run.
    ServerTools {
        /// The calls to run.
        server_calls: Value,
        /// The turn's server executions so far.
        executed: Value,
        /// Warnings so far, owed to the final response.
        warnings: Value,
    },
    /// Server calls that need approval went to the client; the turn holds the session until
    /// the decisions come or the request expires.
    AwaitingApproval {
        /// The ordered calls awaiting approval, as JSON.
        pending: Value,
        /// Warnings so far, owed to the final response.
        warnings: Value,
        /// Every server call of the answer (gated or not), run once the decisions came.
        server_calls: Value,
        /// The turn's server executions so far.
        executed: Value,
        /// When undecided calls are denied.
        expires_at: chrono::DateTime<chrono::Utc>,
    },
}

/// Everything persisted when a round trip ends.
#[derive(Debug)]
pub struct FinishStep {
    /// The turn.
    pub key: TurnKey,
    /// Which round trip (0 for the user turn, +1 per continuation).
    pub step: i32,
    /// The immutable record.
    pub record: NewRecord,
    /// The session's new assemble state, when it changed; its texts sent this turn are
    /// stored with the record's.
    pub session_state: Option<PackedState>,
    /// The turn's transition.
    pub outcome: StepOutcome,
    /// The reply to publish after the commit, if the round trip sends one.
    pub reply: Option<ReplyOut>,
    /// Whether it ends the turn as cancelled (its client's cancel was admitted).
    pub cancelled: bool,
    /// The follow-ups that steer the turn whose instructions this round trip sent, taken in
    /// when it ends with the model's answer.
    pub steers: Vec<String>,
    /// How the round trip's budget reservation settles (none: no budget is configured).
    pub settle: Option<super::Settle>,
    /// The turn's tenant (none in a single-tenant deployment).
    pub tenant: Option<TenantName>,
}

impl FinishStep {
    /// The follow-ups this ending takes in: only an ending with the model's answer does.
    pub(super) fn steers_taken_in(&self) -> &[String] {
        let answered = !self.cancelled && !matches!(self.outcome, StepOutcome::Failed);
        if answered {
            &self.steers
        } else {
            &[]
        }
    }
}

/// The step statement's own parameters (`records.rs`, `write_step`), `$26` to `$37`, after the record's (`$1` to `$25`,
/// [`super::new_record::RecordParams`]): named here, bound in one place, in order.
pub(super) struct StepParams<'a> {
    /// `$26`: the state the turn moves to, as `lifecycle::transition` decided.
    pub(super) state: &'static str,
    /// `$27`: round trips done after this one.
    pub(super) step: i32,
    /// `$28`: the client calls the turn now waits for.
    pub(super) pending: Option<Value>,
    /// `$29`: warnings owed to the turn's final response.
    pub(super) warnings: Option<Value>,
    /// `$30`: server calls to run before the next provider call.
    pub(super) server_calls: Option<Value>,
    /// `$31`: the turn runs on without a reply (its continuation is spent).
    pub(super) runs_on: bool,
    /// `$32`: the turn's server executions so far (NULL: unchanged).
    pub(super) executed: Option<Value>,
    /// `$33`: the session's new state (NULL: unchanged), serialised as it is bound.
    pub(super) session_state: Option<super::json_text::JsonText<&'a PackedState>>,
    /// `$34`: the turn ended: the session passes to its next queued turn.
    pub(super) ended: bool,
    /// `$35`: the reply's outbox payload, if the round trip sends one.
    pub(super) reply: Option<Value>,
    /// `$36`: this ending is the cancel (the cancel mark does not refuse it).
    pub(super) cancelled: bool,
    /// `$37`: when the approval request this ending makes expires (NULL: it makes none).
    pub(super) approval_expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl<'a> StepParams<'a> {
    /// What finishing `f` writes besides its record.
    pub(super) fn of(
        f: &FinishStep,
        session_state: Option<&'a PackedState>,
        reply: Option<&Outgoing>,
    ) -> Result<StepParams<'a>, StoreError> {
        let some = |v: &Value| (!v.is_null()).then(|| v.clone());
        let (end, pending, warnings, server_calls, executed) = match &f.outcome {
            StepOutcome::Completed => (StepEnd::Final, None, None, None, None),
            StepOutcome::Failed => (StepEnd::Error, None, None, None, None),
            StepOutcome::AwaitingToolResults { pending, warnings, server_calls, executed } => {
                let (p, w, s) = (some(pending), some(warnings), some(server_calls));
                (StepEnd::ClientTools, p, w, s, some(executed))
            }
            StepOutcome::ServerTools { server_calls, executed, warnings } => {
                let (w, s) = (some(warnings), some(server_calls));
                (StepEnd::ServerTools, None, w, s, some(executed))
            }
            StepOutcome::AwaitingApproval { pending, warnings, server_calls, executed, .. } => {
                let (p, w, s) = (some(pending), some(warnings), some(server_calls));
                (StepEnd::ApprovalRequired, p, w, s, some(executed))
            }
        };
        let approval_expires_at = match &f.outcome {
            StepOutcome::AwaitingApproval { expires_at, .. } => Some(*expires_at),
            _ => None,
        };
        // Decided for the phase the statement's guard requires: running this step, cancelling
        // exactly when this ending is the cancel.
        let from = Phase::Running { step: f.step, cancelling: f.cancelled };
        let end = if f.cancelled { StepEnd::Cancelled } else { end };
        let to = transition(Some(from), Event::StepEnded(end))?;
        Ok(StepParams {
            state: to.column().as_str(),
            step: f.step + 1,
            pending,
            warnings,
            server_calls,
            runs_on: matches!(f.outcome, StepOutcome::ServerTools { .. }),
            executed,
            session_state: session_state.map(super::json_text::JsonText),
            ended: to.has_ended(),
            reply: reply.map(outbox::payload).transpose()?,
            cancelled: f.cancelled,
            approval_expires_at,
        })
    }
}
