//! What a committed state change announces (the outbox holds these), and what enters the
//! pipeline from clients.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::AdmittedTurn;
use crate::contracts::{
    ApiError, InstanceName, InvokeResult, Outcome, Reply, ReplyAddress, SessionId, TenantName,
    TurnId,
};

/// A request as a client published it: bytes not yet parsed, and its `message_id`.
#[derive(Debug, Clone)]
pub struct Submission {
    /// The body, as received.
    pub body: bytes::Bytes,
    /// The client's `message_id`, if it set one.
    pub message_id: Option<String>,
    /// The client's `reply_to`, if it set one (checked at admission).
    pub reply_to: Option<String>,
    /// The RabbitMQ user that published it (broker-checked `user_id`), which names its tenant.
    pub user_id: Option<String>,
    /// Its AMQP `type`: `turn.cancel` for a cancel, anything else (or none) for a request.
    pub kind: Option<String>,
    /// Delivered before, to a consumer that stopped before acknowledging it.
    pub redelivered: bool,
}

/// How the tag of a stored reply sent again starts (`resent-<submission>`).
pub const RESENT: &str = "resent-";

/// A message to publish once the transaction that decided it has committed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "Kind")]
pub enum Outgoing {
    /// Start (or resume) a turn at the pipeline's first stage after admission.
    #[serde(rename = "outgoing.start/v1")]
    Start(AdmittedTurn),
    /// A reply for the session's reply queue.
    #[serde(rename = "outgoing.reply/v1")]
    Reply(ReplyOut),
    /// A kept stream delta sent again to a client resuming its turn's stream (§9a).
    #[serde(skip)]
    ReplayedDelta(Replay),
    /// The end of what a resume sends again (§9a).
    #[serde(skip)]
    Resumed(Replay),
    /// An outbox row written before rows were typed: an AMQP message as it was built then.
    #[serde(skip)]
    Legacy(LegacyMessage),
}

/// An outbox row in the format before typed payloads (read until such rows are drained).
#[derive(Debug, Clone, PartialEq)]
pub struct LegacyMessage {
    /// Exchange.
    pub exchange: String,
    /// Routing key.
    pub routing_key: String,
    /// Message id.
    pub message_id: String,
    /// `type` property.
    pub kind: String,
    /// Headers, as stored.
    pub headers: Value,
    /// Body.
    pub body: Vec<u8>,
    /// Whether it goes to a session's reply queue.
    pub declare_session: bool,
}

/// A reply to a session, as the outbox keeps it and the client receives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplyOut {
    /// The session.
    pub session: SessionId,
    /// The turn it names, if the request named a valid one.
    pub turn_id: Option<String>,
    /// Makes the message id stable for the same logical reply (`step-0`, `rejected-<fp>`).
    pub tag: String,
    /// The step it ends, for replies that end one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<i32>,
    /// What it tells the client (`x-aptix-outcome`).
    pub outcome: ReplyOutcome,
    /// The AGN-033 reply.
    pub body: Value,
    /// Whether the session's queue may be declared for it (refusals only bind a queue the
    /// client declared).
    #[serde(default = "yes")]
    pub create_queue: bool,
    /// The `message_id` of the request it answers, for refusals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    /// The backend instance whose queue receives it instead of the session's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<InstanceName>,
    /// The tenant whose reply queues receive it (none in a single-tenant deployment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<TenantName>,
    /// The session's display name, for a step reply (`x-aptix-session-name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_name: Option<String>,
    /// When the session expires, for a step reply (`x-aptix-session-expires`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_expires: Option<chrono::DateTime<chrono::Utc>>,
}

/// What a resume (`turn.resume`, §9a) sends: a kept delta again, or the notice that ends the
/// replay. Answers one submission; never kept in the outbox (its variants are not serialized).
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// The turn.
    pub key: crate::contracts::TurnKey,
    /// A delta's step and place in it; for the notice, the step and `None`.
    pub step: i32,
    /// A delta's `Seq`.
    pub seq: Option<u64>,
    /// The body: the delta as it was published, or the notice.
    pub body: Value,
    /// The notice's id tag (`resumed-<submission>`).
    pub tag: String,
    /// The queue that receives it: the resume's reply queue.
    pub to: ReplyAddress,
    /// The notice's `correlation_id`: the `message_id` of the submission it answers.
    pub correlation_id: Option<String>,
}

/// What a reply's `message_id` starts with (client protocol §6).
fn id_prefix(session: &SessionId, turn_id: Option<&str>) -> String {
    format!("reply:{session}:{}:", turn_id.unwrap_or("-"))
}

fn yes() -> bool {
    true
}

impl ReplyOut {
    /// A reply of `session` about `turn_id` with `body` and no other property: what the
    /// constructors below start from.
    fn bare(
        session: SessionId,
        turn_id: Option<String>,
        outcome: ReplyOutcome,
        body: Value,
    ) -> Self {
        ReplyOut {
            session,
            turn_id,
            tag: String::new(),
            step: None,
            outcome,
            body,
            create_queue: false,
            correlation_id: None,
            reply_to: None,
            tenant: None,
            session_name: None,
            session_expires: None,
        }
    }

    /// The reply that ends round trip `step` of a turn.
    pub fn step(
        session: SessionId,
        turn_id: &str,
        step: i32,
        reply: &Reply,
    ) -> Result<Self, serde_json::Error> {
        crate::metrics::metrics().json("serialize", "reply");
        let (turn, outcome) = (Some(turn_id.to_owned()), ReplyOutcome::of(reply, true));
        Ok(ReplyOut {
            tag: format!("step-{step}"),
            step: Some(step),
            create_queue: true,
            ..ReplyOut::bare(session, turn, outcome, serde_json::to_value(reply)?)
        })
    }

    /// Step `step`'s reply sent again, as it was first sent (same id), to a resuming client;
    /// only to a queue that exists.
    pub fn replayed(session: SessionId, turn_id: &str, step: i32, stored: Value) -> Self {
        let outcome = ReplyOutcome::of_stored(&stored);
        ReplyOut {
            tag: format!("step-{step}"),
            step: Some(step),
            ..ReplyOut::bare(session, Some(turn_id.to_owned()), outcome, stored)
        }
    }

    /// A refusal of a submission: creates nothing (the session may not exist).
    pub fn refusal(
        session: SessionId,
        turn_id: Option<&str>,
        tag: String,
        errors: Vec<ApiError>,
    ) -> Self {
        // A turn that reached here was checked (`turn_hint`, or a validated request's key).
        let turn = turn_id.and_then(|t| t.parse::<TurnId>().ok());
        let reply: Reply = InvokeResult::fail(errors).about(session, turn);
        let body = serde_json::to_value(&reply).unwrap_or(Value::Null);
        ReplyOut::refused_again(session, turn_id.map(str::to_owned), tag, body)
    }

    /// A refusal sent before, sent again as it was (same id), for a redelivered submission.
    pub fn refused_again(
        session: SessionId,
        turn_id: Option<String>,
        tag: String,
        body: Value,
    ) -> Self {
        ReplyOut { tag, ..ReplyOut::bare(session, turn_id, ReplyOutcome::Refused, body) }
    }

    /// A stored step reply sent again, under an id of its own (it answers another submission),
    /// with the body [`resent_body`] gives.
    pub fn resent(session: SessionId, turn_id: &str, submission: &str, stored: Value) -> Self {
        let stored = resent_body(&session, turn_id, stored);
        let outcome = ReplyOutcome::of_stored(&stored);
        ReplyOut {
            tag: format!("{RESENT}{submission}"),
            create_queue: true,
            ..ReplyOut::bare(session, Some(turn_id.to_owned()), outcome, stored)
        }
    }

    /// Whether it is a turn's stored reply sent again ([`ReplyOut::resent`]).
    pub fn is_resent(&self) -> bool {
        self.tag.starts_with(RESENT)
    }

    /// The same reply, for the queue at `to` (a tenant's, an instance's).
    pub fn to(mut self, to: ReplyAddress) -> Self {
        self.reply_to = to.instance;
        self.tenant = to.tenant;
        self
    }

    /// Where it goes.
    pub fn address(&self) -> ReplyAddress {
        ReplyAddress { tenant: self.tenant.clone(), instance: self.reply_to.clone() }
    }

    /// Its `message_id`: the same for every copy of the same logical reply.
    pub fn message_id(&self) -> String {
        format!("{}{}", id_prefix(&self.session, self.turn_id.as_deref()), self.tag)
    }

    /// The tag of `message_id`, a reply of `session` about `turn_id` (what [`Self::message_id`]
    /// put after the turn).
    pub fn tag_of<'a>(
        session: &SessionId,
        turn_id: Option<&str>,
        message_id: &'a str,
    ) -> Option<&'a str> {
        message_id.strip_prefix(&id_prefix(session, turn_id))
    }
}

/// A finished turn's stored reply as it is sent again: one stored before replies named their
/// turn gets `SessionId` and `TurnId` added, as the server writes them now (after the
/// envelope's other properties). `aptix_resent_body` (migration 0032) reads a copy kept by
/// reference the same way.
fn resent_body(session: &SessionId, turn_id: &str, mut stored: Value) -> Value {
    if let Some(body) = stored.as_object_mut().filter(|b| b.contains_key("Successful")) {
        if !body.contains_key("SessionId") {
            body.insert("SessionId".to_owned(), Value::String(session.to_string()));
        }
        if !body.contains_key("TurnId") {
            body.insert("TurnId".to_owned(), Value::String(turn_id.to_owned()));
        }
    }
    stored
}

/// What a reply tells its client, sent as the `x-aptix-outcome` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplyOutcome {
    /// The turn ended with an answer.
    Final,
    /// The turn waits for the client's tool results.
    ClientToolContinuation,
    /// The turn waits for the client's approval of server tool calls.
    ToolApprovalRequired,
    /// The turn ended in failure.
    Failed,
    /// This submission was refused; no turn changed.
    Refused,
}

impl ReplyOutcome {
    /// Of a reply that ends a step (`step`), or that answers a submission.
    pub fn of(reply: &Reply, step: bool) -> Self {
        match (reply.result(), step) {
            (Some(r), _) => match r.outcome {
                Outcome::ClientToolContinuation(_) => ReplyOutcome::ClientToolContinuation,
                Outcome::ToolApprovalRequired(_) => ReplyOutcome::ToolApprovalRequired,
                Outcome::Final(_) => ReplyOutcome::Final,
            },
            (None, true) => ReplyOutcome::Failed,
            (None, false) => ReplyOutcome::Refused,
        }
    }

    /// Of a stored step reply sent again.
    pub fn of_stored(reply: &Value) -> Self {
        match reply.pointer("/Result/Kind").and_then(Value::as_str) {
            Some("client_tool_continuation") => ReplyOutcome::ClientToolContinuation,
            Some("tool_approval_required") => ReplyOutcome::ToolApprovalRequired,
            Some(_) => ReplyOutcome::Final,
            None => ReplyOutcome::Failed,
        }
    }

    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplyOutcome::Final => "final",
            ReplyOutcome::ClientToolContinuation => "client_tool_continuation",
            ReplyOutcome::ToolApprovalRequired => "tool_approval_required",
            ReplyOutcome::Failed => "failed",
            ReplyOutcome::Refused => "refused",
        }
    }

    /// Whether the turn ended (`x-aptix-final`): everything but a round trip that waits for
    /// the client (tool results or approvals).
    pub fn ends_turn(self) -> bool {
        !matches!(self, ReplyOutcome::ClientToolContinuation | ReplyOutcome::ToolApprovalRequired)
    }
}
