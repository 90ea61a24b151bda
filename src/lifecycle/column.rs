//! How a [`Phase`] is stored: the `turns.state` column ([`TurnState`]), with the session's
//! `active_turn_id` telling queued from held and `turns.cancel_requested_at` failed from
//! cancelled.

use super::Phase;

/// Where a turn stands (the `turns.state` column; its CHECK constraint allows only these).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnState {
    /// Waits behind the session's active turn.
    Queued,
    /// Holds the session and moves through the stages.
    Running,
    /// Holds the session until the client sends tool results.
    AwaitingToolResults,
    /// Holds the session until the client approves or denies server tool calls.
    AwaitingApproval,
    /// A follow-up a running turn took in: ends when that turn ends.
    Steered,
    /// Ended with a final answer.
    Completed,
    /// Ended with an error reply.
    Failed,
}

impl TurnState {
    /// The column value.
    pub fn as_str(self) -> &'static str {
        match self {
            TurnState::Queued => "queued",
            TurnState::Running => "running",
            TurnState::AwaitingToolResults => "awaiting_tool_results",
            TurnState::AwaitingApproval => "awaiting_approval",
            TurnState::Steered => "steered",
            TurnState::Completed => "completed",
            TurnState::Failed => "failed",
        }
    }

    /// Whether the turn has ended.
    pub fn is_finished(self) -> bool {
        matches!(self, TurnState::Completed | TurnState::Failed)
    }
}

impl std::fmt::Display for TurnState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Phase {
    /// The `turns.state` value this phase is stored as.
    pub fn column(self) -> TurnState {
        match self {
            Phase::Queued | Phase::Held => TurnState::Queued,
            Phase::Running { .. } => TurnState::Running,
            Phase::AwaitingTools { .. } => TurnState::AwaitingToolResults,
            Phase::AwaitingApproval { .. } => TurnState::AwaitingApproval,
            Phase::Steered => TurnState::Steered,
            Phase::Completed => TurnState::Completed,
            Phase::Failed | Phase::Cancelled => TurnState::Failed,
        }
    }

    /// The phase a stored turn is in: its `state` column, whether it is its session's active
    /// turn, its step and whether a cancel of it was admitted.
    pub fn stored(state: TurnState, active: bool, step: i32, cancel_marked: bool) -> Phase {
        match state {
            TurnState::Queued if active => Phase::Held,
            TurnState::Queued => Phase::Queued,
            TurnState::Running => Phase::Running { step, cancelling: cancel_marked },
            TurnState::AwaitingToolResults => Phase::AwaitingTools { step },
            TurnState::AwaitingApproval => Phase::AwaitingApproval { step },
            TurnState::Steered => Phase::Steered,
            TurnState::Completed => Phase::Completed,
            TurnState::Failed if cancel_marked => Phase::Cancelled,
            TurnState::Failed => Phase::Failed,
        }
    }
}
