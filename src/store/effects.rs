//! Effects of server tools, recorded before they happen (migration 0026, docs/tools.md
//! "Effects"): a row with the call's arguments is written before a tool runs, its outcome after,
//! so a redelivered or retried step reuses what a call it already ran gave, and a call cut short
//! is known to be one.

use serde_json::Value;
use sha2::{Digest as _, Sha256};
use uuid::Uuid;

use super::{Store, StoreError};

/// One server tool call of a turn: the answer of round trip `step` called it.
#[derive(Debug, Clone, Copy)]
pub struct EffectKey<'a> {
    /// Session.
    pub session: Uuid,
    /// Turn.
    pub turn: &'a str,
    /// The round trip whose answer made the call.
    pub step: i32,
    /// The call's id.
    pub call_id: &'a str,
}

impl EffectKey<'_> {
    /// What a tool server that de-duplicates receives: the same for every attempt of this call,
    /// and telling nothing of the session or turn.
    pub fn idempotency_key(&self) -> String {
        let id =
            format!("aptix-effect:{}:{}:{}:{}", self.session, self.turn, self.step, self.call_id);
        hex::encode(&Sha256::digest(id)[..16])
    }
}

/// Where a call stands when its step is about to run it.
#[derive(Debug, Clone, PartialEq)]
pub enum EffectStart {
    /// Never started: it runs now (its row is written).
    Fresh,
    /// An earlier attempt ended: its outcome, which the call gets again without running.
    Ended(Value),
    /// An earlier attempt started and has not ended: it was cut short (its worker died, or its
    /// outcome was not written), or it still runs in another worker (a message redelivered
    /// while its first delivery is still being handled).
    CutShort {
        /// Attempts so far, this one included.
        attempts: i32,
        /// How long ago the first attempt started.
        age: std::time::Duration,
    },
    /// The call id was recorded for another call (another tool or other arguments): a provider
    /// repeated an id within one answer. Neither runs in its place.
    Mismatch,
}

impl Store {
    /// Records that `key` is about to run `tool` with `arguments`, or what an earlier attempt
    /// left: one statement.
    pub async fn begin_effect(
        &self,
        key: &EffectKey<'_>,
        tool: &str,
        arguments: &Value,
    ) -> Result<EffectStart, StoreError> {
        let row = sqlx::query!(
            r#"INSERT INTO tool_effects
                   (session_id, turn_id, step, call_id, tool, arguments, idempotency_key)
               VALUES ($1, $2, $3, $4, $5, $6, $7)
               ON CONFLICT (session_id, turn_id, step, call_id)
                   DO UPDATE SET attempts = tool_effects.attempts + 1
               RETURNING xmax::text = '0' AS "fresh!", attempts, outcome,
                         tool = $5 AND arguments = $6 AS "same!",
                         extract(epoch FROM clock_timestamp() - started_at)::float8 AS "age!""#,
            key.session,
            key.turn,
            key.step,
            key.call_id,
            tool,
            arguments,
            key.idempotency_key()
        )
        .fetch_one(&self.pool)
        .await?;
        let age = std::time::Duration::from_secs_f64(row.age.max(0.0));
        Ok(match (row.fresh, row.same, row.outcome) {
            (true, _, _) => EffectStart::Fresh,
            (false, false, _) => EffectStart::Mismatch,
            (false, true, Some(outcome)) => EffectStart::Ended(outcome),
            (false, true, None) => EffectStart::CutShort { attempts: row.attempts, age },
        })
    }

    /// The outcome recorded for `key`'s call, if it ended.
    pub async fn effect_outcome(&self, key: &EffectKey<'_>) -> Result<Option<Value>, StoreError> {
        let outcome = sqlx::query_scalar!(
            "SELECT outcome FROM tool_effects
             WHERE session_id = $1 AND turn_id = $2 AND step = $3 AND call_id = $4",
            key.session,
            key.turn,
            key.step,
            key.call_id
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(outcome.flatten())
    }

    /// Records how `key`'s call ended; the first outcome written stays.
    pub async fn end_effect(&self, key: &EffectKey<'_>, outcome: &Value) -> Result<(), StoreError> {
        sqlx::query!(
            "UPDATE tool_effects SET outcome = $5, ended_at = clock_timestamp()
             WHERE session_id = $1 AND turn_id = $2 AND step = $3 AND call_id = $4
               AND outcome IS NULL",
            key.session,
            key.turn,
            key.step,
            key.call_id,
            outcome
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The outcomes recorded for a turn's calls, oldest first: (tool, attempts, outcome).
    pub async fn effects(
        &self,
        session: Uuid,
        turn: &str,
    ) -> Result<Vec<(String, i32, Option<Value>)>, StoreError> {
        let rows = sqlx::query!(
            "SELECT tool, attempts, outcome FROM tool_effects
             WHERE session_id = $1 AND turn_id = $2 ORDER BY started_at",
            session,
            turn
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| (r.tool, r.attempts, r.outcome)).collect())
    }
}
