//! Invoke's claim on a round trip's provider call (migration 0037, `llm_claims`): one holder
//! at a time calls the provider for a step; a copy of its message that runs meanwhile (a
//! redelivery beside the original still running, an outbox row published again, a replayed
//! dead letter) waits for the saved answer instead of calling again. A claim is a lease its
//! holder renews while the call runs, naming the holder's process (`liveness`): a holder whose
//! process died is replaced once it missed a renewal, one alive but stuck once its lease lapses.

use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use super::{Store, StoreError};
use crate::contracts::TurnKey;

/// How long a claim holds without being renewed: the longest a copy waits for a holder that
/// died. Its holder renews it every third of this.
pub const CLAIM_LEASE: Duration = Duration::from_secs(30);

/// Where a round trip stands before its provider call ([`Store::claim_call`]).
#[derive(Debug)]
pub struct CallState {
    /// The provider's saved answer, when it already answered.
    pub saved: Option<Value>,
    /// Whether a cancel of the turn was admitted.
    pub cancelled: bool,
    /// Whether the turn is running this step: otherwise the message is a late copy (a replayed
    /// dead letter, a redelivery after the turn ended) that no provider call can serve.
    pub running: bool,
    /// Whether the attempt that asked holds the call: false while another holds it (a copy
    /// running beside this one), and when there is nothing to call (answered, not running).
    pub claimed: bool,
}

impl Store {
    /// Where round trip `step` of a turn stands before its provider call, claiming the call for
    /// `attempt` when it is still to be made and no other attempt holds it (its lease lapsed,
    /// or its process died and it missed a renewal). One call of a database function, on every
    /// invoke.
    pub async fn claim_call(
        &self,
        key: &TurnKey,
        step: i32,
        attempt: Uuid,
    ) -> Result<CallState, StoreError> {
        let row = sqlx::query!(
            r#"SELECT saved, cancelled AS "cancelled!", running AS "running!",
                      claimed AS "claimed!"
               FROM aptix_claim_call($1, $2, $3, $4, $5, $6)"#,
            key.session_id.as_uuid(),
            key.turn_id.as_str(),
            step,
            attempt,
            CLAIM_LEASE.as_secs_f64(),
            self.liveness.key(&self.pool)
        )
        .fetch_one(&self.pool)
        .await?;
        let saved = self.saved_with_texts(row.saved).await?;
        let (cancelled, running, claimed) = (row.cancelled, row.running, row.claimed);
        Ok(CallState { saved, cancelled, running, claimed })
    }

    /// The answer saved for round trip `step`, the first one written.
    pub async fn saved_answer(
        &self,
        key: &TurnKey,
        step: i32,
    ) -> Result<Option<Value>, StoreError> {
        let saved = sqlx::query_scalar!(
            r#"SELECT aptix_deref_at(result, '{job,result,raw,tools}') AS "saved!"
               FROM llm_results WHERE session_id = $1 AND turn_id = $2 AND step = $3"#,
            key.session_id.as_uuid(),
            key.turn_id.as_str(),
            step
        )
        .fetch_optional(&self.pool)
        .await?;
        self.saved_with_texts(saved).await
    }

    async fn saved_with_texts(&self, saved: Option<Value>) -> Result<Option<Value>, StoreError> {
        let Some(saved) = saved else { return Ok(None) };
        let mut conn = self.pool.acquire().await?;
        Ok(Some(super::texts::read_saved(&mut conn, &self.texts, saved).await?))
    }

    /// Extends `attempt`'s claim by a lease from now; false when it no longer holds it (its
    /// lease lapsed and another attempt took the call).
    pub async fn renew_claim(
        &self,
        key: &TurnKey,
        step: i32,
        attempt: Uuid,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            "UPDATE llm_claims SET until = clock_timestamp() + make_interval(secs => $5),
                                   holder = $6
             WHERE session_id = $1 AND turn_id = $2 AND step = $3 AND attempt = $4",
            key.session_id.as_uuid(),
            key.turn_id.as_str(),
            step,
            attempt,
            CLAIM_LEASE.as_secs_f64(),
            self.liveness.key(&self.pool)
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Gives up `attempt`'s claim without an answer (a call to be tried again, a run that
    /// ended early), so the next attempt need not wait for the lease.
    pub async fn release_claim(
        &self,
        key: &TurnKey,
        step: i32,
        attempt: Uuid,
    ) -> Result<(), StoreError> {
        sqlx::query!(
            "DELETE FROM llm_claims
             WHERE session_id = $1 AND turn_id = $2 AND step = $3 AND attempt = $4",
            key.session_id.as_uuid(),
            key.turn_id.as_str(),
            step,
            attempt
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
