//! Admitting a cancel (`type` = `turn.cancel`): the turn it names ends as `turn.cancelled`, now
//! or at its next stage boundary. The cancel itself gets a reply only when it changed nothing
//! (an unknown or finished turn, another tenant's session, an invalid body); an admitted one is
//! answered by the turn's own `turn.cancelled` reply, and a repeated one adds nothing.

use tracing::info;

use super::answers::{refusal, reject, unavailable};
use super::scope::Caller;
use super::Admit;
use crate::contracts::{ApiError, ErrorCode};
use crate::messages::AdmittedTurn;
use crate::rules::cancel_bytes;
use crate::stage::{Output, StageError};
use crate::store::{CancelAdmission, TurnState};

impl Admit {
    pub(super) async fn cancel(
        &self,
        body: &[u8],
        submission: &str,
        caller: Caller<'_>,
    ) -> Result<Output<AdmittedTurn>, StageError> {
        let key = match cancel_bytes(body, &self.settings.limits) {
            Ok(key) => key,
            Err(errors) => return reject(body, submission, errors.0),
        };
        let (session, turn_id) = (key.session_id, key.turn_id.as_str());
        let refuse = |tag: &str, error: ApiError| {
            let tag = format!("{tag}-{submission}");
            Ok(Output::Publish(vec![refusal(session, Some(turn_id), tag, vec![error])]))
        };
        let at = |code, message: String| ApiError::at(code, "TurnId", message);
        match self.store.cancel_turn(&key, caller.name).await? {
            CancelAdmission::Ended { outbox } => {
                info!(%session, turn = turn_id, "turn cancelled before it ran to its end");
                Ok(Output::Committed(outbox))
            }
            CancelAdmission::Requested => {
                info!(%session, turn = turn_id, "cancel of a running turn admitted");
                Ok(Output::Publish(vec![]))
            }
            // A redelivered cancel publishes what the first delivery committed, if it did not.
            CancelAdmission::AlreadyCancelled { outbox } => Ok(Output::Committed(outbox)),
            CancelAdmission::NotFound => refuse(
                "rejected-cancel",
                at(ErrorCode::TurnNotFound, format!("no turn `{turn_id}` in this session")),
            ),
            CancelAdmission::Finished { state } => refuse(
                "rejected-cancel",
                at(
                    ErrorCode::TurnFinished,
                    match state {
                        // Its instruction is in the other turn's model call: cancel that one.
                        TurnState::Steered => format!(
                            "turn `{turn_id}` steered the session's running turn, and ends with it; cancel that turn instead"
                        ),
                        _ => format!("turn `{turn_id}` already ended ({state}); nothing was cancelled"),
                    },
                ),
            ),
            CancelAdmission::Unavailable => refuse("unavailable", unavailable()),
        }
    }
}
