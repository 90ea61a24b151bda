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
use crate::store::{Replayed, Resumable, ResumeFound};

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
        let refused = |tag: String, error| {
            Ok(Output::Publish(vec![refusal(session, Some(turn_id), tag, vec![error])]))
        };
        // Counted before anything is read: a refused resume costs one small publish.
        if let Some(refusal) = self.over_resume_limit(caller, &key, submission) {
            return Ok(Output::Publish(vec![refusal]));
        }
        let found = self.store.resume_events(&key, caller.name, resume.after).await?;
        match found {
            ResumeFound::Events(found) => {
                let (count, ended) = (found.events.len(), found.ended);
                info!(%session, turn = turn_id, events = count, ended, "turn stream resumed");
                Ok(Output::Publish(replay(&key, to, found, resume.after, submission)))
            }
            ResumeFound::NotFound => {
                let message = format!("no turn `{turn_id}` in this session");
                let error = ApiError::at(ErrorCode::TurnNotFound, "TurnId", message);
                refused(format!("rejected-resume-{submission}"), error)
            }
            ResumeFound::Unavailable => refused(format!("unavailable-{submission}"), unavailable()),
        }
    }

    /// Counts a resume of `key`'s session, or a re-submission attaching to its running turn
    /// (both send the turn's kept events again); past `pipeline.resumes_per_minute`, the
    /// refusal to send instead.
    pub(super) fn over_resume_limit(
        &self,
        caller: Caller<'_>,
        key: &TurnKey,
        submission: &str,
    ) -> Option<Outgoing> {
        let tenant = caller.name.map(|t| t.as_str());
        if self.resumes.admit(tenant, key.session_id, std::time::Instant::now()) {
            return None;
        }
        let limit = self.settings.pipeline.resumes_per_minute;
        let message = format!(
            "this session was resumed {limit} times in the last minute (pipeline.resumes_per_minute); resume again later"
        );
        let error = ApiError::new(ErrorCode::LimitResumesPerMinute, message);
        let tag = format!("rejected-resume-{submission}");
        Some(refusal(key.session_id, Some(key.turn_id.as_str()), tag, vec![error]))
    }
}

/// What a resume of submission `submission` after `after` sends to `to`: the events found as
/// first sent (step replies with the session's name and expiry), then the `resumed` notice.
pub(super) fn replay(
    key: &TurnKey,
    to: &ReplyAddress,
    found: Resumable,
    after: Option<i64>,
    submission: &str,
) -> Vec<Outgoing> {
    let Resumable { events, ended, name, expires } = found;
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
                let mut r = ReplyOut::replayed(session, turn_id, step, body).to(to.clone());
                (r.session_name, r.session_expires) = (name.clone(), expires);
                Outgoing::Reply(r)
            }
        })
        .collect();
    let notice = json!({
        "Resumed": true, "SessionId": session, "TurnId": key.turn_id,
        "AfterSeq": after, "UpToSeq": up_to, "Ended": ended,
    });
    out.push(Outgoing::Resumed(replay(0, None, notice, format!("resumed-{submission}"))));
    out
}

/// Names the submission a `resumed` notice (or a refusal beside an outbox) answers (its
/// `correlation_id`), so a client tells its own resume's notice from another's.
pub(super) fn correlate_notices(output: &mut Output<AdmittedTurn>, message_id: Option<&str>) {
    let messages = match output {
        Output::Publish(m) => m,
        Output::Committed(outbox) => &mut outbox.messages,
        _ => return,
    };
    for m in messages {
        match m {
            Outgoing::Resumed(n) => n.correlation_id = message_id.map(str::to_owned),
            // A refusal beside an outbox (an attach over the resume limit): it answers this
            // submission. A turn's replies there carry their step.
            Outgoing::Reply(r) if r.step.is_none() => {
                r.correlation_id = message_id.map(str::to_owned);
            }
            _ => {}
        }
    }
}
