//! Follow-ups that steer (`FollowUp::Steer`, docs/client-protocol.md §11): one admitted while its
//! session's turn is active waits as a queued turn aimed at that turn (`turns.steers`); the
//! assemble stage of the active turn's next round trip reads the instructions waiting for it;
//! the round trip that sent them, once its answer is persisted, takes them in (`steered`); when
//! the steered turn ends, each one it took in ends the same way, with that ending as its reply.
//! One that was never taken in is an ordinary queued turn and runs when its turn comes.

use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use super::new_record::{insert_record, NewRecord};
use super::outbox::{self, PendingOutbox};
use super::texts::TextCache;
use super::turn_row::query_turns;
use super::{Store, StoreError};
use crate::contracts::{ApiError, ErrorCode, Reply, SessionId, Steer};
use crate::lifecycle::{transition, Event, HostEnd, Phase};
use crate::messages::{Outgoing, ReplyOut};

/// Follow-ups one model call takes in at most; more wait for the next round trip (or run as
/// turns of their own), so a flood of them cannot grow one request without bound.
pub const STEERS_PER_CALL: i64 = 8;
/// Bytes of follow-up instructions one call takes in at most (the oldest is always taken): a
/// call's stage messages carry them about three times (taken in, in the request, in the
/// state's update), which must stay far below `amqp.max_message_bytes`.
pub const STEER_BYTES_PER_CALL: usize = 1 << 20;

/// Aims the queued turn `turn` at the session's active turn `active`.
pub(super) async fn aim(
    conn: &mut PgConnection,
    session: Uuid,
    turn: &str,
    active: &str,
) -> Result<(), StoreError> {
    sqlx::query!(
        "UPDATE turns SET steers = $3 WHERE session_id = $1 AND turn_id = $2",
        session,
        turn,
        active
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Takes in the follow-ups `steers` that round trip `step` of `host` sent to the model, as the
/// answer to it is persisted: only while `host` still runs that step with no cancel admitted
/// (the caller's step write checks the same under the same lock), and only those still queued
/// for it. Returns how many it took in.
pub(super) async fn take_in(
    conn: &mut PgConnection,
    session: Uuid,
    host: &str,
    step: i32,
    steers: &[String],
) -> Result<u64, StoreError> {
    if steers.is_empty() {
        return Ok(0);
    }
    let to = transition(Some(Phase::Queued), Event::Steered)?;
    let done = sqlx::query!(
        "UPDATE turns SET state = $5, updated_at = now()
         WHERE session_id = $1 AND turn_id = ANY($4) AND steers = $2 AND state = 'queued'
           AND EXISTS (SELECT 1 FROM turns h WHERE h.session_id = $1 AND h.turn_id = $2
                       AND h.state = 'running' AND h.step = $3
                       AND h.cancel_requested_at IS NULL)",
        session,
        host,
        step,
        steers,
        to.column().as_str()
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Ends every follow-up `host` took in, as `host` ended (`end`, with `reply`, its last reply's
/// body): each gets a record and, as its reply, that ending about itself, with a `turn.steered`
/// warning. Their messages are in the returned outbox rows, after whatever the caller wrote.
pub(super) async fn end_taken_in(
    conn: &mut PgConnection,
    texts: &TextCache,
    session: Uuid,
    host: &str,
    reply: &Value,
    end: HostEnd,
) -> Result<PendingOutbox, StoreError> {
    let rows = query_turns!(
        "SELECT ",
        "FROM turns WHERE session_id = $1 AND steers = $2 AND state = 'steered' ORDER BY seq",
        session,
        host
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut out = PendingOutbox::default();
    if rows.is_empty() {
        return Ok(out);
    }
    let ending: Reply = serde_json::from_value(reply.clone())?;
    let to = transition(Some(Phase::Steered), Event::HostEnded(end))?;
    for row in rows {
        let key = row.key()?;
        let warning = ApiError::new(
            ErrorCode::TurnSteered,
            format!("this turn's instruction was added to turn `{host}`; this is how it ended"),
        );
        let told = ending.clone().retold(key.turn_id.clone(), warning);
        let msg = ReplyOut::step(SessionId::new(session), key.turn_id.as_str(), 0, &told)?
            .to(row.address()?);
        let record = NewRecord {
            kind: "steered".into(),
            chain: serde_json::json!({}),
            retrieved_chunks: serde_json::json!([]),
            active_files: serde_json::json!([]),
            skipped_files: serde_json::json!([]),
            rag_scope: serde_json::json!([]),
            errors: serde_json::to_value(told.errors())?,
            instruction: row.request.get("Instruction").and_then(Value::as_str).map(Into::into),
            conversation_context_id: row.conversation_context_id(),
            reply: msg.body.clone(),
            ..NewRecord::default()
        };
        insert_record(&mut *conn, texts, (session, &row.turn_id, row.step), &record).await?;
        sqlx::query!(
            "UPDATE turns SET state = $3, step = step + 1, updated_at = now(),
                 cancel_requested_at = CASE WHEN $4 THEN clock_timestamp() END
             WHERE session_id = $1 AND turn_id = $2",
            session,
            &row.turn_id,
            to.column().as_str(),
            to.cancel_marked()
        )
        .execute(&mut *conn)
        .await?;
        // Kept with the steered turn's rows: every path that publishes again what a crash left
        // unpublished looks for that turn's.
        let reply = vec![Outgoing::Reply(msg)];
        out.append(outbox::insert(&mut *conn, session, host, reply).await?);
    }
    Ok(out)
}

/// The outbox rows of turn `host`'s `reply`, written as it moved to `phase`, followed, when that
/// ends it, by those of the follow-ups it took in ([`end_taken_in`]).
pub(super) async fn ending(
    conn: &mut PgConnection,
    texts: &TextCache,
    session: Uuid,
    host: &str,
    reply: Outgoing,
    phase: Phase,
) -> Result<PendingOutbox, StoreError> {
    let body = match (host_end(phase), &reply) {
        (Some(end), Outgoing::Reply(r)) => Some((end, r.body.clone())),
        _ => None,
    };
    let mut out = outbox::insert(&mut *conn, session, host, vec![reply]).await?;
    if let Some((end, body)) = body {
        out.append(end_taken_in(conn, texts, session, host, &body, end).await?);
    }
    Ok(out)
}

/// How a turn that ended in `phase` ends the follow-ups it took in (`None`: it has not ended).
pub(super) fn host_end(phase: Phase) -> Option<HostEnd> {
    match phase {
        Phase::Completed => Some(HostEnd::Completed),
        Phase::Failed => Some(HostEnd::Failed),
        Phase::Cancelled => Some(HostEnd::Cancelled),
        _ => None,
    }
}

impl Store {
    /// The instructions of follow-ups waiting to steer the session's turn `host`, oldest first,
    /// at most [`STEERS_PER_CALL`] and [`STEER_BYTES_PER_CALL`] (the oldest always).
    pub async fn steers_for(
        &self,
        session: &SessionId,
        host: &str,
    ) -> Result<Vec<Steer>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT turn_id, request->>'Instruction' AS instruction FROM turns
               WHERE session_id = $1 AND steers = $2 AND state = 'queued' ORDER BY seq LIMIT $3"#,
            session.as_uuid(),
            host,
            STEERS_PER_CALL
        )
        .fetch_all(&self.pool)
        .await?;
        // Admission let only a turn with an instruction steer; one without is left to run.
        Ok(within_bytes(rows.into_iter().filter_map(|r| {
            r.instruction.map(|instruction| Steer { turn_id: r.turn_id, instruction })
        })))
    }
}

/// The oldest of `steers` whose instructions fit [`STEER_BYTES_PER_CALL`] together, the first
/// whatever its size; the rest wait for the next call.
fn within_bytes(steers: impl Iterator<Item = Steer>) -> Vec<Steer> {
    let mut total = 0;
    let mut out = Vec::new();
    for steer in steers {
        total += steer.instruction.len();
        if !out.is_empty() && total > STEER_BYTES_PER_CALL {
            break;
        }
        out.push(steer);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_call_takes_in_the_oldest_follow_ups_that_fit() {
        let steer = |n: usize, bytes: usize| Steer {
            turn_id: format!("s{n}"),
            instruction: "é".repeat(bytes / 2),
        };
        let big = (0..8).map(|n| steer(n, 800_000));
        let taken: Vec<String> = within_bytes(big).into_iter().map(|s| s.turn_id).collect();
        assert_eq!(taken, ["s0"], "one large follow-up a call; the others wait");
        let small = (0..8).map(|n| steer(n, 1_000));
        assert_eq!(within_bytes(small).len(), 8);
        let huge = std::iter::once(steer(0, 3 << 20));
        assert_eq!(within_bytes(huge).len(), 1, "the oldest is taken whatever its size");
    }
}
