//! What admitting a user turn answers ([`Admission`]): shared by admission's transaction
//! (`admit.rs`) and its ways for a busy and an idle session (`admit_ways.rs`).

use serde_json::Value;

use super::outbox::PendingOutbox;
use super::sessions::SessionOwner;
use super::tenants::Limit;

/// The result of admitting a user turn.
#[derive(Debug)]
pub enum Admission {
    /// A new turn. It runs now (its forward message is in `outbox`) or waits behind the
    /// session's current turn (`outbox` empty).
    Accepted {
        /// Messages to publish.
        outbox: PendingOutbox,
        /// Whether the turn waits behind another.
        queued: bool,
        /// Whether this turn created the session.
        new_session: bool,
    },
    /// The same request was already admitted and has not finished; unpublished messages, if a
    /// crash left any, are in `outbox`.
    InFlight {
        /// Messages to publish.
        outbox: PendingOutbox,
    },
    /// The same request already finished: send the stored reply again.
    Finished {
        /// The stored reply.
        reply: Value,
    },
    /// The pair was used with different content.
    Conflict,
    /// The session is busy with another turn and the turn's mode rejects follow-ups
    /// (`FollowUp::Reject`): nothing written.
    Busy {
        /// The session's active turn.
        turn_id: String,
    },
    /// The session already has [`MAX_QUEUED_PER_SESSION`](super::MAX_QUEUED_PER_SESSION)
    /// turns waiting behind its active turn: nothing written.
    QueueFull {
        /// The session's active turn.
        turn_id: String,
    },
    /// The turn chose a `FollowUp` its mode does not allow: nothing written.
    FollowUpNotAllowed,
    /// The session waits for tool results of another turn.
    AwaitingToolResults {
        /// The waiting turn.
        turn_id: String,
    },
    /// The session waits for the client's approval of another turn's tool calls.
    AwaitingApproval {
        /// The waiting turn.
        turn_id: String,
    },
    /// The session belongs to another tenant: nothing was read or written.
    Unavailable,
    /// The session holds other contexts than `meta` assumed: nothing written.
    ContextsDiffer(SessionOwner),
    /// The tenant is over this limit (and refuses, or it is a new session): nothing written.
    Limited(Limit),
}
