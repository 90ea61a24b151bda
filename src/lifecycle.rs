//! A turn's life as one table: every phase a turn can be in ([`Phase`]), every event that moves
//! it ([`Event`]) and the one function that decides where an event takes it ([`transition`]).
//! The store asks this function and writes what it decided; `docs/architecture.md` ("A turn's
//! life") is [`table`] printed, and a test keeps the two equal.

use std::fmt;

/// Where a turn stands. Stored as `turns.state` ([`TurnState`]) with the session's
/// `active_turn_id` (queued or held) and `turns.cancel_requested_at` (the cancel marks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Waits behind its session's active turn.
    Queued,
    /// Its session's next turn, waiting for its tenant's limits to allow one more (a tenant
    /// whose turns over a limit queue).
    Held,
    /// Holds the session and moves through the stages at round trip `step`; `cancelling` once
    /// a client's cancel of it was admitted (it ends as cancelled at its next stage boundary).
    Running {
        /// Round trips done.
        step: i32,
        /// A cancel was admitted.
        cancelling: bool,
    },
    /// Holds the session until the client sends the results of the tool calls of round trip
    /// `step - 1`.
    AwaitingTools {
        /// Round trips done.
        step: i32,
    },
    /// Holds the session until the client approves or denies the server tool calls of round
    /// trip `step - 1` that need approval, or until the request expires (docs/tools.md).
    AwaitingApproval {
        /// Round trips done.
        step: i32,
    },
    /// A follow-up that steers: a round trip of the turn it steers took its input in, and it
    /// ends when that turn ends, as that turn does.
    Steered,
    /// Ended with a final answer.
    Completed,
    /// Ended with an error reply.
    Failed,
    /// Ended by its client's cancel (an error reply with `turn.cancelled`).
    Cancelled,
}

/// What happens to a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// A new turn is admitted: its session has an active turn (`busy`) or not, and its tenant's
    /// limits allow one more to run (`room`) or hold it.
    Admitted {
        /// The session has an active turn.
        busy: bool,
        /// The tenant's limits allow it to run now.
        room: bool,
    },
    /// The session's active turn ended and this one is next.
    Dispatched {
        /// The tenant's limits allow it to run now.
        room: bool,
    },
    /// The tenant's limits now allow a held turn to run.
    RoomFreed,
    /// A round trip was persisted, ending as `StepEnd` says.
    StepEnded(StepEnd),
    /// The client sent the awaited tool results; `matching` when they answer the pending calls.
    ToolResults {
        /// They answer exactly the pending calls.
        matching: bool,
    },
    /// The client answered the approval request; `matching` when it answers exactly the calls
    /// awaiting approval, in order.
    Approvals {
        /// They answer exactly the calls awaiting approval.
        matching: bool,
    },
    /// The approval request expired: its calls are denied and the turn runs on.
    ApprovalExpired,
    /// A client's cancel was admitted.
    Cancel,
    /// A message of the turn can never be handled (poison, retries spent): the turn fails.
    GivenUp,
    /// A round trip of the running turn this queued follow-up steers took its input in.
    Steered,
    /// The turn a steered follow-up steers ended, in this phase.
    HostEnded(HostEnd),
}

/// How the turn a steered follow-up steers ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostEnd {
    /// With a final answer.
    Completed,
    /// With an error reply.
    Failed,
    /// By its client's cancel.
    Cancelled,
}

/// How a round trip ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepEnd {
    /// A final answer.
    Final,
    /// An error reply (a provider refusal, a failed stage).
    Error,
    /// Tool calls for the client.
    ClientTools,
    /// Tool calls the pipeline runs itself: the turn goes on without a reply.
    ServerTools,
    /// Server tool calls that need the client's approval first.
    ApprovalRequired,
    /// The round trip ended as cancelled, because a cancel was admitted.
    Cancelled,
}

/// An event that does not apply to the turn's phase: nothing is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// The phase the turn was in (`None`: there was no turn).
    pub from: Option<Phase>,
    /// What was refused.
    pub event: Event,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let from = self.from.map_or_else(|| "no turn".to_owned(), |p| p.to_string());
        write!(f, "{} does not apply to a turn in phase {from}", self.event)
    }
}

impl std::error::Error for Refused {}

/// Where `event` takes a turn in phase `from` (`None`: a turn not admitted yet), or why it
/// does not apply.
pub fn transition(from: Option<Phase>, event: Event) -> Result<Phase, Refused> {
    use Event as E;
    use Phase as P;
    let refused = Err(Refused { from, event });
    let Some(phase) = from else {
        return match event {
            E::Admitted { busy: true, .. } => Ok(P::Queued),
            E::Admitted { busy: false, room: true } => {
                Ok(P::Running { step: 0, cancelling: false })
            }
            E::Admitted { busy: false, room: false } => Ok(P::Held),
            _ => refused,
        };
    };
    match (phase, event) {
        (P::Queued, E::Dispatched { room: true }) | (P::Held, E::RoomFreed) => {
            Ok(P::Running { step: 0, cancelling: false })
        }
        (P::Queued, E::Dispatched { room: false }) => Ok(P::Held),
        (P::Running { step, cancelling }, E::StepEnded(end)) => {
            step_ended(step, cancelling, end).ok_or(Refused { from, event })
        }
        (P::AwaitingTools { step }, E::ToolResults { matching: true }) => {
            Ok(P::Running { step, cancelling: false })
        }
        (P::AwaitingTools { .. }, E::ToolResults { matching: false }) => Ok(P::Failed),
        (P::AwaitingApproval { step }, E::Approvals { matching: true } | E::ApprovalExpired) => {
            Ok(P::Running { step, cancelling: false })
        }
        (P::AwaitingApproval { .. }, E::Approvals { matching: false }) => Ok(P::Failed),
        (P::Queued | P::Held | P::AwaitingTools { .. } | P::AwaitingApproval { .. }, E::Cancel) => {
            Ok(P::Cancelled)
        }
        (P::Running { step, cancelling: false }, E::Cancel) => {
            Ok(P::Running { step, cancelling: true })
        }
        // A turn whose cancel was admitted keeps the mark, so it reads back as cancelled.
        (P::Running { cancelling: true, .. }, E::GivenUp) => Ok(P::Cancelled),
        (
            P::Queued
            | P::Held
            | P::Running { .. }
            | P::AwaitingTools { .. }
            | P::AwaitingApproval { .. },
            E::GivenUp,
        ) => Ok(P::Failed),
        // Only a turn waiting behind the running one steers it; once in, it cannot be taken out
        // (nor cancelled alone: the model has read it) and ends with the turn it steered.
        (P::Queued, E::Steered) => Ok(P::Steered),
        (P::Steered, E::HostEnded(end)) => Ok(match end {
            HostEnd::Completed => P::Completed,
            HostEnd::Failed => P::Failed,
            HostEnd::Cancelled => P::Cancelled,
        }),
        _ => refused,
    }
}

/// A running turn's round trip ends: once a cancel was admitted it can only end as cancelled
/// (an answer that raced the cancel is not kept), and only then.
fn step_ended(step: i32, cancelling: bool, end: StepEnd) -> Option<Phase> {
    match (cancelling, end) {
        (true, StepEnd::Cancelled) => Some(Phase::Cancelled),
        (true, _) | (false, StepEnd::Cancelled) => None,
        (false, StepEnd::Final) => Some(Phase::Completed),
        (false, StepEnd::Error) => Some(Phase::Failed),
        (false, StepEnd::ClientTools) => Some(Phase::AwaitingTools { step: step + 1 }),
        (false, StepEnd::ServerTools) => Some(Phase::Running { step: step + 1, cancelling: false }),
        (false, StepEnd::ApprovalRequired) => Some(Phase::AwaitingApproval { step: step + 1 }),
    }
}

impl Phase {
    /// Whether the turn has ended (nothing moves it again).
    pub fn has_ended(self) -> bool {
        matches!(self, Phase::Completed | Phase::Failed | Phase::Cancelled)
    }

    /// Whether the stored row carries the cancel mark (`cancel_requested_at`), which is never
    /// cleared so that a redelivered message cannot resurrect the turn.
    pub fn cancel_marked(self) -> bool {
        matches!(self, Phase::Running { cancelling: true, .. } | Phase::Cancelled)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Phase::Queued => f.write_str("queued"),
            Phase::Held => f.write_str("held"),
            Phase::Running { step, cancelling: false } => write!(f, "running step {step}"),
            Phase::Running { step, cancelling: true } => {
                write!(f, "running step {step}, cancelling")
            }
            Phase::AwaitingTools { step } => write!(f, "awaiting tool results for step {step}"),
            Phase::AwaitingApproval { step } => write!(f, "awaiting approval for step {step}"),
            Phase::Steered => f.write_str("steered"),
            Phase::Completed => f.write_str("completed"),
            Phase::Failed => f.write_str("failed"),
            Phase::Cancelled => f.write_str("cancelled"),
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let yes = |b: &bool, y: &'static str, n: &'static str| if *b { y } else { n };
        match self {
            Event::Admitted { busy, room } => write!(
                f,
                "admitted ({}, {})",
                yes(busy, "session busy", "session free"),
                yes(room, "room", "no room")
            ),
            Event::Dispatched { room } => {
                write!(f, "next in its session ({})", yes(room, "room", "no room"))
            }
            Event::RoomFreed => f.write_str("tenant has room"),
            Event::StepEnded(end) => write!(f, "round trip ended: {end:?}"),
            Event::ToolResults { matching } => {
                write!(f, "tool results ({})", yes(matching, "matching", "not matching"))
            }
            Event::Approvals { matching } => {
                write!(f, "approvals ({})", yes(matching, "matching", "not matching"))
            }
            Event::ApprovalExpired => f.write_str("approval expired"),
            Event::Cancel => f.write_str("cancel"),
            Event::GivenUp => f.write_str("given up"),
            Event::Steered => f.write_str("taken in by the turn it steers"),
            Event::HostEnded(end) => write!(f, "the turn it steers ended: {end:?}"),
        }
    }
}

/// Representative phases: every variant, a running turn at step 0 and 1, with and without a
/// cancel, and `None` for a turn not admitted yet.
pub fn phases() -> Vec<Option<Phase>> {
    let mut all = vec![None, Some(Phase::Queued), Some(Phase::Held)];
    for step in [0, 1] {
        for cancelling in [false, true] {
            all.push(Some(Phase::Running { step, cancelling }));
        }
    }
    all.extend(
        [
            Phase::AwaitingTools { step: 1 },
            Phase::AwaitingApproval { step: 1 },
            Phase::Steered,
            Phase::Completed,
            Phase::Failed,
            Phase::Cancelled,
        ]
        .map(Some),
    );
    all
}

/// Every event.
pub fn events() -> Vec<Event> {
    let mut all = Vec::new();
    for busy in [false, true] {
        for room in [true, false] {
            all.push(Event::Admitted { busy, room });
        }
    }
    all.extend([
        Event::Dispatched { room: true },
        Event::Dispatched { room: false },
        Event::RoomFreed,
    ]);
    all.extend(
        [
            StepEnd::Final,
            StepEnd::Error,
            StepEnd::ClientTools,
            StepEnd::ServerTools,
            StepEnd::ApprovalRequired,
            StepEnd::Cancelled,
        ]
        .map(Event::StepEnded),
    );
    all.extend([
        Event::ToolResults { matching: true },
        Event::ToolResults { matching: false },
        Event::Approvals { matching: true },
        Event::Approvals { matching: false },
        Event::ApprovalExpired,
        Event::Cancel,
        Event::GivenUp,
        Event::Steered,
    ]);
    all.extend([HostEnd::Completed, HostEnd::Failed, HostEnd::Cancelled].map(Event::HostEnded));
    all
}

/// The allowed transitions as a Markdown table (from, event, to), in [`phases`] × [`events`]
/// order; every other pair is refused.
pub fn table() -> String {
    let mut out = String::from("| from | event | to |\n|---|---|---|\n");
    for from in phases() {
        for event in events() {
            if let Ok(to) = transition(from, event) {
                let from = from.map_or_else(|| "(new)".to_owned(), |p| p.to_string());
                out.push_str(&format!("| {from} | {event} | {to} |\n"));
            }
        }
    }
    out
}

mod column;
#[cfg(test)]
mod tests;

pub use column::TurnState;
