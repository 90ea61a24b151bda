//! Admit (the `validate` stage): a client's submission in; an admitted turn for the next stage,
//! or an error reply, out. Stateless rules first (`crate::rules`), then the stateful ones
//! (contexts, idempotency, one turn at a time, tool continuations) inside one database
//! transaction.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tracing::{info, warn};

use super::Deps;
use crate::config::Settings;
use crate::contracts::{
    ApiError, ErrorCode, ReplyAddress, SessionId, TenantName, ToolContinuation, TurnKey, UserTurn,
    ValidatedRequest,
};
use crate::messages::{AdmittedTurn, Outgoing, ReplyOut, Submission};
use crate::rules::{turn_hint, validate_bytes, CANCEL_TYPE, RESUME_TYPE, SERVER_TYPES};
use crate::stage::{message_fingerprint, Cause, Output, Stage, StageError, TurnHint};
use crate::store::{
    Admission, ContinuationAdmission, ResumeFound, SessionMeta, Store, StoredBody, StoredReply,
    MAX_QUEUED_PER_SESSION,
};

mod answers;
mod cancel;
mod reply_wait;
mod resume;
mod resume_gate;
mod scope;

pub use answers::session_name;
use answers::{fingerprint, over_limit, refusal, reject, stored_form, unavailable, without_resent};
use resume::{correlate_notices, replay};

use scope::Caller;

/// Parses, checks and admits turns; consumes the ingress queue.
#[derive(Debug)]
pub struct Admit {
    settings: Arc<Settings>,
    store: Store,
    resumes: resume_gate::ResumeGate,
}

impl Admit {
    /// The stage, using `deps`' settings and store.
    pub fn new(deps: &Deps) -> Self {
        let resumes = resume_gate::ResumeGate::new(deps.settings.pipeline.resumes_per_minute);
        Admit { settings: deps.settings.clone(), store: deps.store.clone(), resumes }
    }
}

/// When a returned server message was last logged (Unix seconds).
static RETURNED_LOGGED: AtomicU64 = AtomicU64::new(0);

/// Counts a server message that came back to the entry point, and says so at most once a
/// minute: a queue that dead-letters into it sends back every reply and delta of its session.
fn returned_server_message(kind: Option<&str>, body: &[u8]) {
    crate::metrics::metrics().message(Admit::NAME, "returned_server_message");
    let now = chrono::Utc::now().timestamp().max(0).unsigned_abs();
    let last = RETURNED_LOGGED.load(Ordering::Relaxed);
    let due = now >= last.saturating_add(60);
    if due
        && RETURNED_LOGGED.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    {
        let (session, _) = turn_hint(body);
        let session = session.map(|s| s.to_string());
        warn!(kind, session, "the pipeline's own messages come back to the entry point (a reply queue dead-letters into it); dropped unanswered");
    }
}

impl Stage for Admit {
    const NAME: &'static str = "validate";
    type In = Submission;
    type Out = AdmittedTurn;

    fn tenant(&self, s: &Submission) -> Option<TenantName> {
        scope::caller_of(&self.settings, s.user_id.as_deref()).ok().flatten().map(|(name, _)| name)
    }

    async fn run(&self, s: Submission) -> Result<Output<AdmittedTurn>, StageError> {
        if s.kind.as_deref().is_some_and(|k| SERVER_TYPES.contains(&k)) {
            // A client's queue's dead-letter exchange may be the entry point (its write
            // permission allows that): its replies come back here, and are dropped unanswered.
            returned_server_message(s.kind.as_deref(), &s.body);
            return Ok(Output::Finish(None));
        }
        // Replies that answer this submission rather than a turn's step get ids derived from
        // it, so a redelivered message yields the same id and the client can drop the copy.
        let submission = message_fingerprint(s.message_id.as_deref(), &s.body);
        // Nobody to answer: no reply queue of an unknown publisher may be written to.
        let found = scope::caller_of(&self.settings, s.user_id.as_deref())
            .map_err(|why| StageError::Refused(Cause::UnknownPublisher(why.to_string())))?;
        let caller = Caller::of(&found);
        let prefix = &self.settings.amqp.prefix;
        let to = match scope::reply_target(prefix, caller.name, s.reply_to.as_deref(), &s.body) {
            Ok(instance) => scope::address(caller, instance),
            Err(error) => {
                let output = reject(&s.body, &submission, vec![error])?;
                let to = scope::address(caller, None);
                return self.keep_refusals(s.message_id.as_deref(), &to, output).await;
            }
        };
        // A submission refused before a crash is refused again as it was, not decided anew: the
        // session may be free now, and the client already holds the refusal.
        let again =
            if s.redelivered { self.refused_before(&s.body, &submission).await? } else { None };
        let output = if let Some(refusal) = again {
            Output::Publish(vec![Outgoing::Reply(refusal)])
        } else if s.kind.as_deref() == Some(CANCEL_TYPE) {
            self.cancel(&s.body, &submission, caller).await?
        } else if s.kind.as_deref() == Some(RESUME_TYPE) {
            self.resume(&s.body, &submission, caller, &to).await?
        } else {
            // A client's own re-submission of a running turn attaches to its stream (§9a); a
            // redelivered copy only publishes what its first delivery left unpublished.
            self.request(&s.body, &submission, caller, &to, !s.redelivered).await?
        };
        let mut output = if s.redelivered { without_resent(output) } else { output };
        correlate_notices(&mut output, s.message_id.as_deref());
        self.keep_refusals(s.message_id.as_deref(), &to, output).await
    }

    /// The submission can never be handled (retries spent, poison, unusable data): the turn it
    /// admitted, if any, fails (record, reply, the session's next turn); otherwise the client
    /// is told, if there is one to tell.
    async fn give_up(
        &self,
        s: Submission,
        error: ApiError,
    ) -> Result<Output<AdmittedTurn>, StageError> {
        let submission = message_fingerprint(s.message_id.as_deref(), &s.body);
        tracing::error!(reason = %error.message, submission, "giving up an ingress message");
        let error = ApiError::new(
            error.code,
            "the request could not be processed; an operator has the details".to_owned(),
        );
        let (session, turn) = turn_hint(&s.body);
        let Some(session) = session else { return Ok(Output::Publish(vec![])) };
        let Ok(found) = scope::caller_of(&self.settings, s.user_id.as_deref()) else {
            return Ok(Output::Publish(vec![]));
        };
        let caller = Caller::of(&found);
        let prefix = &self.settings.amqp.prefix;
        let instance = scope::reply_target(prefix, caller.name, s.reply_to.as_deref(), &s.body);
        let to = scope::address(caller, instance.ok().flatten());
        let parsed = turn.as_deref().and_then(|t| t.parse().ok());
        // Another tenant's turn is not this publisher's to fail, however exactly its copy
        // matches (an unreadable owner counts as another's: the turn is left to its own).
        let own = !self.foreign(&session, &to).await.unwrap_or(true);
        if let (Some(turn_id), Ok(request), true) =
            (parsed, validate_bytes(&s.body, &self.settings.limits), own)
        {
            let key = TurnKey { session_id: session, turn_id };
            let failed =
                self.store.fail_admitted(&key, &request.fingerprint(), error.clone()).await;
            if let Ok(Some(outbox)) = failed {
                return Ok(Output::Committed(outbox));
            }
        }
        let tag = format!("exhausted-{submission}");
        let reply = ReplyOut::refusal(session, turn.as_deref(), tag, vec![error]);
        Ok(Output::Publish(vec![Outgoing::Reply(reply.to(to))]))
    }

    const ORDERED: bool = true;

    fn hint(body: &[u8]) -> TurnHint {
        let (session, turn) = turn_hint(body);
        TurnHint { session: session.map(|s| s.to_string()), turn }
    }
}

impl Admit {
    /// A user turn or tool results.
    async fn request(
        &self,
        body: &[u8],
        submission: &str,
        caller: Caller<'_>,
        to: &ReplyAddress,
        attach: bool,
    ) -> Result<Output<AdmittedTurn>, StageError> {
        match validate_bytes(body, &self.settings.limits) {
            Ok(request) => match &request {
                ValidatedRequest::UserTurn(t) => {
                    self.user_turn(&request, t, submission, caller, to, attach).await
                }
                ValidatedRequest::ToolContinuation(c) => {
                    self.continuation(&request, c, submission, to).await
                }
            },
            Err(errors) => reject(body, submission, errors.0),
        }
    }

    /// Stores the replies that answer this submission (refusals and stored replies sent again,
    /// not the outbox's), so the database holds every reply a client can receive, marks them
    /// with the request's `message_id` as their `correlation_id`, and sends them where it asked.
    async fn keep_refusals(
        &self,
        message_id: Option<&str>,
        to: &ReplyAddress,
        mut output: Output<AdmittedTurn>,
    ) -> Result<Output<AdmittedTurn>, StageError> {
        let Output::Publish(messages) = &mut output else { return Ok(output) };
        for m in messages {
            let Outgoing::Reply(r) = m else { continue };
            if r.step.is_some() {
                // A step's reply sent again to a resuming client (§9a): stored with its record.
                continue;
            }
            r.correlation_id = message_id.map(str::to_owned);
            self.keep_refusal(r, to).await?;
        }
        Ok(output)
    }

    /// Sends `r`, a reply to this submission, where it asked, and stores it (not against
    /// another tenant's session).
    async fn keep_refusal(&self, r: &mut ReplyOut, to: &ReplyAddress) -> Result<(), StageError> {
        (r.reply_to, r.tenant) = (to.instance.clone(), to.tenant.clone());
        if self.foreign(&r.session, to).await? {
            return Ok(());
        }
        let stored = StoredReply {
            message_id: &r.message_id(),
            session: &r.session,
            turn_id: r.turn_id.as_deref(),
            outcome: r.outcome,
            // A duplicate's copy of a turn's reply is kept by reference: a tenant's duplicates
            // of a long answer must not store it once each.
            body: if r.is_resent() { StoredBody::TurnsReply } else { StoredBody::AsSent(&r.body) },
            tenant: to.tenant.as_ref(),
        };
        // Classified by what failed: a value the database refuses is no outage to wait out.
        self.store.save_reply(&stored).await?;
        Ok(())
    }

    /// The refusal stored for this submission, if it was refused.
    async fn refused_before(
        &self,
        body: &[u8],
        submission: &str,
    ) -> Result<Option<ReplyOut>, StageError> {
        let (Some(session), _) = turn_hint(body) else { return Ok(None) };
        let found = self.store.refusal_of(session.as_uuid(), submission).await?;
        let Some((message_id, turn_id, body)) = found else { return Ok(None) };
        let Some(tag) = ReplyOut::tag_of(&session, turn_id.as_deref(), &message_id) else {
            return Ok(None);
        };
        Ok(Some(ReplyOut::refused_again(session, turn_id.clone(), tag.to_owned(), body)))
    }

    /// Whether `session` exists and belongs to a tenant other than the one replied to.
    async fn foreign(&self, session: &SessionId, to: &ReplyAddress) -> Result<bool, StageError> {
        if !self.settings.multi_tenant() {
            return Ok(false);
        }
        let owner = self.store.session_owner(session).await?;
        Ok(owner.is_some_and(|o| o.tenant.as_deref() != to.tenant.as_ref().map(TenantName::as_str)))
    }

    async fn user_turn(
        &self,
        request: &ValidatedRequest,
        turn: &UserTurn,
        submission: &str,
        caller: Caller<'_>,
        to: &ReplyAddress,
        attach: bool,
    ) -> Result<Output<AdmittedTurn>, StageError> {
        let key = turn.key();
        let (session, turn_id) = (key.session_id, key.turn_id.as_str());
        let refuse = |what: &str, errors| {
            let tag = format!("{what}-{submission}");
            Ok(Output::Publish(vec![refusal(session, Some(turn_id), tag, errors)]))
        };
        // What the session was created with, once the admission found it differs from what the
        // request resolves to (its owner is checked there, under the session's lock, first).
        let mut owner = None;
        let fingerprint = fingerprint(request);
        for _ in 0..3 {
            let (agent, conversation) =
                match scope::contexts(&self.settings, caller, turn, owner.as_ref()) {
                    Ok(ids) => ids,
                    Err(errors) => return refuse("rejected-context", errors),
                };
            let Some(fixed) = scope::with_contexts(turn, &agent, &conversation) else {
                return Err(StageError::unusable("a configured context id is not a ContextId"));
            };
            // Refused by the admission once it knows the turn is new and its mode is this one.
            let (follow_up, follow_up_refusal) =
                match scope::follow_up(&self.settings, &conversation, turn) {
                    Ok(f) => (f, None),
                    Err(errors) => (crate::contracts::FollowUp::default(), Some(errors)),
                };
            let meta = SessionMeta {
                tenant: caller.name.cloned(),
                agent_context_id: Some(agent),
                conversation_context_id: Some(conversation),
                mode_named: turn.conversation_context_id().is_some(),
                follow_up,
                follow_up_refused: follow_up_refusal.is_some(),
                workspace_id: turn.workspace_id().map(str::to_owned),
                repo: turn.repo().map(str::to_owned),
                name: turn.instruction().and_then(session_name),
                expires_at: Some(self.settings.assemble.expires_at(chrono::Utc::now())),
            };
            let wire = stored_form(&ValidatedRequest::UserTurn(fixed))?;
            let instance = to.instance.as_ref();
            let admission = reply_wait::admitting(|| {
                self.store.admit_user_turn(key, &fingerprint, &wire, &meta, instance)
            })
            .await?;
            match (admission, follow_up_refusal) {
                // The session holds other contexts: decide again on those.
                (Admission::ContextsDiffer(stored), _) => owner = Some(stored),
                (Admission::FollowUpNotAllowed, Some(errors)) => {
                    return refuse("rejected-follow-up", errors)
                }
                (Admission::InFlight { mut outbox }, _) if attach => {
                    // Attaching sends what a resume sends, so it is counted as one.
                    if let Some(mut refusal) = self.over_resume_limit(caller, key, submission) {
                        // Beside the outbox, still answered where the client asked, and kept.
                        if let Outgoing::Reply(r) = &mut refusal {
                            self.keep_refusal(r, to).await?;
                        }
                        outbox.messages.push(refusal);
                        return Ok(Output::Committed(outbox));
                    }
                    info!(%session, turn = turn_id, "re-submission of a turn in flight: attached");
                    let found = self.store.resume_events(key, caller.name, None).await?;
                    if let ResumeFound::Events(found) = found {
                        outbox.messages.extend(replay(key, to, found, None, submission));
                    }
                    return Ok(Output::Committed(outbox));
                }
                (other, _) => return self.admitted(other, session, turn_id, submission),
            }
        }
        Err(StageError::Transient(Cause::Contended))
    }

    /// The output for a user turn's admission.
    fn admitted(
        &self,
        admission: Admission,
        session: SessionId,
        turn_id: &str,
        submission: &str,
    ) -> Result<Output<AdmittedTurn>, StageError> {
        let refuse = |what: &str, errors| {
            let tag = format!("{what}-{submission}");
            Ok(Output::Publish(vec![refusal(session, Some(turn_id), tag, errors)]))
        };
        match admission {
            Admission::Accepted { outbox, queued, new_session } => {
                info!(%session, turn = turn_id, queued, new_session, "turn admitted");
                Ok(Output::Committed(outbox))
            }
            Admission::InFlight { outbox } => {
                info!(%session, turn = turn_id, "duplicate of a turn in flight");
                Ok(Output::Committed(outbox))
            }
            Admission::Finished { reply } => {
                Ok(Output::Publish(vec![Outgoing::Reply(ReplyOut::resent(session, turn_id, submission, reply))]))
            }
            Admission::FollowUpNotAllowed => {
                Err(StageError::unusable("a follow-up refused without its reason"))
            }
            Admission::Conflict => refuse(
                "conflict",
                vec![ApiError::at(
                    ErrorCode::TurnConflict,
                    "TurnId",
                    format!("TurnId `{turn_id}` was already used in this session with different content"),
                )],
            ),
            Admission::Busy { turn_id: running } => refuse(
                "rejected-busy",
                vec![ApiError::new(
                    ErrorCode::SessionBusy,
                    format!("the session is busy with turn `{running}` and this turn rejects follow-ups; submit it again, under a new message_id, once that turn ended"),
                )],
            ),
            Admission::QueueFull { turn_id: running } => refuse(
                "rejected-busy",
                vec![ApiError::new(
                    ErrorCode::SessionQueueFull,
                    format!("the session already has {MAX_QUEUED_PER_SESSION} turns waiting behind turn `{running}`; submit this one again, under a new message_id, once fewer wait"),
                )],
            ),
            Admission::AwaitingApproval { turn_id: waiting } => refuse(
                "rejected-awaiting",
                vec![ApiError::new(
                    ErrorCode::SessionAwaitingApproval,
                    format!("the session waits for the approval of tool calls of turn `{waiting}`; send the decisions (ToolApprovals) before a new turn"),
                )],
            ),
            Admission::AwaitingToolResults { turn_id: waiting } => refuse(
                "rejected-awaiting",
                vec![ApiError::new(
                    ErrorCode::SessionAwaitingToolResults,
                    format!("the session waits for the tool results of turn `{waiting}`; submit them before a new turn"),
                )],
            ),
            Admission::Unavailable | Admission::ContextsDiffer(_) => {
                refuse("unavailable", vec![unavailable()])
            }
            Admission::Limited(limit) => {
                info!(%session, turn = turn_id, ?limit, "turn over its tenant's limit, refused");
                refuse("limited", vec![over_limit(limit)])
            }
        }
    }

    async fn continuation(
        &self,
        request: &ValidatedRequest,
        c: &ToolContinuation,
        submission: &str,
        to: &ReplyAddress,
    ) -> Result<Output<AdmittedTurn>, StageError> {
        let key = c.key();
        let (session, turn_id) = (key.session_id, key.turn_id.as_str());
        let (wire, fingerprint) = (stored_form(request)?, fingerprint(request));
        let (instance, tenant) = (to.instance.as_ref(), to.tenant.as_ref());
        let admission = reply_wait::admitting(|| {
            self.store.admit_continuation(key, &fingerprint, &wire, c, instance, tenant)
        })
        .await?;
        let refuse = |code: ErrorCode, message: String| {
            let tag = format!("rejected-continuation-{submission}");
            let errors = vec![ApiError::at(code, "TurnId", message)];
            Ok(Output::Publish(vec![refusal(session, Some(turn_id), tag, errors)]))
        };
        match admission {
            ContinuationAdmission::Accepted { outbox }
            | ContinuationAdmission::InFlight { outbox }
            | ContinuationAdmission::Aborted { outbox } => Ok(Output::Committed(outbox)),
            ContinuationAdmission::Finished { reply } => {
                Ok(Output::Publish(vec![Outgoing::Reply(ReplyOut::resent(
                    session, turn_id, submission, reply,
                ))]))
            }
            ContinuationAdmission::Unavailable => {
                let tag = format!("unavailable-{submission}");
                Ok(Output::Publish(vec![refusal(session, Some(turn_id), tag, vec![unavailable()])]))
            }
            ContinuationAdmission::NotFound => {
                refuse(ErrorCode::TurnNotFound, format!("no turn `{turn_id}` in this session"))
            }
            ContinuationAdmission::Cancelled => refuse(
                ErrorCode::ToolResultsTurnCancelled,
                format!("turn `{turn_id}` was cancelled; this submission is not used"),
            ),
            ContinuationAdmission::Expired => refuse(
                ErrorCode::ToolApprovalsExpired,
                format!("the approval request of turn `{turn_id}` expired; its calls were denied and the turn went on"),
            ),
            ContinuationAdmission::NotAwaiting { state } if c.is_approval() => refuse(
                ErrorCode::TurnNotAwaitingApproval,
                format!("turn `{turn_id}` is {state}, not waiting for decisions on these calls"),
            ),
            ContinuationAdmission::NotAwaiting { state } => refuse(
                ErrorCode::TurnNotAwaitingToolResults,
                format!("turn `{turn_id}` is {state}, not waiting for tool results"),
            ),
        }
    }
}
