//! Admitting a resume (`type` = `turn.resume`, client protocol §9a): the named turn's events
//! after the client's cursor are sent again as they were first sent (kept deltas, step replies:
//! same ids, bodies and headers), then a `resumed` notice saying up to where; the turn's live
//! events go on as before. Nothing is written: a repeated resume sends the same again.

use serde_json::json;
use tracing::info;

use super::answers::{refusal, reject, unavailable};
use super::scope::Caller;
use super::Admit;
use crate::contracts::{ApiError, ErrorCode, ReplyAddress, TurnKey};
use crate::messages::{AdmittedTurn, Outgoing, Replay, ReplyOut};
use crate::rules::resume_bytes;
use crate::stage::{Output, StageError};
use crate::store::{Replayed, ResumeFound};

impl Admit {
    pub(super) async fn resume(
        &self,
        body: &[u8],
        submission: &str,
        caller: Caller<'_>,
        to: &ReplyAddress,
    ) -> Result<Output<AdmittedTurn>, StageError> {
        let resume = match resume_bytes(body, &self.settings.limits) {
            Ok(r) => r,
            Err(errors) => return reject(body, submission, errors.0),
        };
        let key = resume.key;
        let (session, turn_id) = (key.session_id, key.turn_id.as_str());
        let found = self.store.resume_events(&key, caller.name, resume.after).await?;
        let (events, ended, model) = match found {
            ResumeFound::Events { events, ended, name, expires } => {
                (events, ended, (name, expires))
            }
            ResumeFound::NotFound => {
                let message = format!("no turn `{turn_id}` in this session");
                let error = ApiError::at(ErrorCode::TurnNotFound, "TurnId", message);
                let tag = format!("rejected-resume-{submission}");
                return Ok(Output::Publish(vec![refusal(
                    session,
                    Some(turn_id),
                    tag,
                    vec![error],
                )]));
            }
            ResumeFound::Unavailable => {
                let tag = format!("unavailable-{submission}");
                let out = refusal(session, Some(turn_id), tag, vec![unavailable()]);
                return Ok(Output::Publish(vec![out]));
            }
        };
        let count = events.len();
        let tag = format!("resumed-{submission}");
        let mut out = replay(&key, to, events, resume.after, ended, tag);
        with_model(&mut out, &model);
        info!(%session, turn = turn_id, events = count, ended, "turn stream resumed");
        Ok(Output::Publish(out))
    }
}

/// What a resume after `after` sends to `to`: `events` as first sent, then the `resumed` notice.
pub(super) fn replay(
    key: &TurnKey,
    to: &ReplyAddress,
    events: Vec<Replayed>,
    after: Option<i64>,
    ended: bool,
    tag: String,
) -> Vec<Outgoing> {
    let up_to = events.last().map(Replayed::event_seq).or(after);
    let replay = |step, seq, body, tag: String| Replay {
        key: key.clone(),
        step,
        seq,
        body,
        tag,
        to: to.clone(),
        correlation_id: None,
    };
    let (session, turn_id) = (key.session_id, key.turn_id.as_str());
    let mut out: Vec<Outgoing> = events
        .into_iter()
        .map(|e| match e {
            Replayed::Delta { step, seq, body } => {
                Outgoing::ReplayedDelta(replay(step, Some(seq), body, String::new()))
            }
            Replayed::Reply { step, body } => {
                Outgoing::Reply(ReplyOut::replayed(session, turn_id, step, body).to(to.clone()))
            }
        })
        .collect();
    let notice = json!({
        "Resumed": true, "SessionId": session, "TurnId": key.turn_id,
        "AfterSeq": after, "UpToSeq": up_to, "Ended": ended,
    });
    out.push(Outgoing::Resumed(replay(0, None, notice, tag)));
    out
}

/// Names the submission a `resumed` notice answers (its `correlation_id`), so a client tells its
/// own resume's notice from another's.
pub(super) fn correlate_notices(output: &mut Output<AdmittedTurn>, message_id: Option<&str>) {
    let messages = match output {
        Output::Publish(m) => m,
        Output::Committed(outbox) => &mut outbox.messages,
        _ => return,
    };
    for m in messages {
        if let Outgoing::Resumed(n) = m {
            n.correlation_id = message_id.map(str::to_owned);
        }
    }
}

/// Step replies sent again carry the session's name and expiry, as when first sent.
pub(super) fn with_model(
    messages: &mut [Outgoing],
    (name, expires): &(Option<String>, Option<chrono::DateTime<chrono::Utc>>),
) {
    for m in messages {
        if let Outgoing::Reply(r) = m {
            (r.session_name, r.session_expires) = (name.clone(), *expires);
        }
    }
}
