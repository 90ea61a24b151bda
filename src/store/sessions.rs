//! What is stored per session besides its turns: the assemble state, the invoke stage's saved
//! answers, and everything about a session for `aptix session show`.

use serde::Serialize;
use serde_json::Value;

use super::texts::Holder;
use super::{Store, StoreError};
use crate::assemble::{PackedState, StoredState};
use crate::contracts::{SessionId, TurnKey};

/// Who a session belongs to and the contexts it was created with (fixed for its life).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOwner {
    /// Its tenant; `None` in a single-tenant deployment.
    pub tenant: Option<String>,
    /// Its AgentContext; `None` for sessions created before contexts were fixed (they use
    /// whatever their turns name).
    pub agent_context_id: Option<String>,
    /// Its ConversationContext, likewise.
    pub conversation_context_id: Option<String>,
}

/// A session's state as [`Store::session_state_to_carry`] read it for assembly.
#[derive(Debug)]
pub enum StateRead {
    /// Checked, its texts in place.
    Typed(crate::assemble::SessionState),
    /// Its stored JSON with its texts in place, not yet checked to be a state.
    Stored(Value),
}

/// A session's state as [`Store::session_state_to_update`] read it.
#[derive(Debug)]
pub enum StateToUpdate {
    /// With its texts by reference.
    ByRef(PackedState),
    /// With its texts in place, as stored JSON (not yet checked to be a state).
    InPlace(Value),
}

impl Store {
    /// The owner and contexts of a session, if it exists.
    pub async fn session_owner(
        &self,
        session: &SessionId,
    ) -> Result<Option<SessionOwner>, StoreError> {
        Ok(sqlx::query_as!(
            SessionOwner,
            "SELECT tenant, agent_context_id, conversation_context_id FROM sessions WHERE id = $1",
            session.as_uuid()
        )
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Renames a session; whether it exists.
    pub async fn rename_session(
        &self,
        session: &SessionId,
        name: &str,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            "UPDATE sessions SET name = $2, updated_at = now() WHERE id = $1",
            session.as_uuid(),
            name
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The session's assemble state (`{}` for a new session), its texts in place.
    pub async fn session_state(&self, session: &SessionId) -> Result<Value, StoreError> {
        self.session_state_from(session, None).await
    }

    /// The session's state for assembly, and the state as stored, which the round trip
    /// carries to persist ([`Store::session_state_to_update`]) unless it is too large to. A
    /// state in the current form is parsed from the row's text straight into the state, its
    /// texts then put in from this process's cache (PostgreSQL only for those it lacks), and the
    /// row's text itself is what is carried; any other (texts inline, or references without
    /// lengths) is read as before, as JSON with its texts put in, for the caller to check.
    pub async fn session_state_to_carry(
        &self,
        session: &SessionId,
    ) -> Result<(StateRead, Option<StoredState>), StoreError> {
        let text = sqlx::query_scalar!(
            r#"SELECT state::text AS "state!" FROM sessions WHERE id = $1"#,
            session.as_uuid()
        )
        .fetch_optional(&self.pool)
        .await?
        .unwrap_or_else(|| "{}".to_owned());
        if let Ok(packed) = PackedState::from_stored_json(&text) {
            let carried = StoredState::verbatim(text)?;
            let texts = super::texts::bodies(&self.pool, &self.texts, packed.text_keys()).await?;
            return Ok((StateRead::Typed(super::texts::in_place(packed, &texts)?), carried));
        }
        crate::metrics::metrics().json("parse", "session_state_row");
        let stored: Value = serde_json::from_str(&text)?;
        let carried = StoredState::to_carry(&stored)?;
        let state = super::texts::read_pooled(&self.pool, &self.texts, stored).await?;
        Ok((StateRead::Stored(state), carried))
    }

    /// The session's state with its texts in place: the one `carried` from assemble when the
    /// round trip has one, else the row's. Texts come from this process's cache, PostgreSQL only
    /// for those it lacks.
    pub async fn session_state_from(
        &self,
        session: &SessionId,
        carried: Option<&StoredState>,
    ) -> Result<Value, StoreError> {
        let stored = match carried {
            Some(carried) => carried.to_value()?,
            None => self.stored_state(session).await?,
        };
        super::texts::read_pooled(&self.pool, &self.texts, stored).await
    }

    /// The session's state as persist builds the next one from it (the one `carried`, else the
    /// row's): by reference ([`PackedState`]) when it holds every text in place or referenced
    /// with its length, which needs no text; else, as a state written before lengths were kept
    /// is, with its texts read in place (and the error, if it is no state at all, is the
    /// caller's to tell).
    pub async fn session_state_to_update(
        &self,
        session: &SessionId,
        carried: Option<&StoredState>,
    ) -> Result<StateToUpdate, StoreError> {
        let stored = match carried {
            Some(carried) => match PackedState::from_stored_json(carried.json()) {
                Ok(state) => return Ok(StateToUpdate::ByRef(state)),
                Err(_) => carried.to_value()?,
            },
            None => {
                let stored = self.stored_state(session).await?;
                match PackedState::from_stored_value(&stored) {
                    Ok(state) => return Ok(StateToUpdate::ByRef(state)),
                    Err(_) => stored,
                }
            }
        };
        let state = super::texts::read_pooled(&self.pool, &self.texts, stored).await?;
        Ok(StateToUpdate::InPlace(state))
    }

    /// `sessions.state` as stored (`{}` for no row).
    async fn stored_state(&self, session: &SessionId) -> Result<Value, StoreError> {
        crate::metrics::metrics().json("parse", "session_state_row");
        let state =
            sqlx::query_scalar!("SELECT state FROM sessions WHERE id = $1", session.as_uuid())
                .fetch_optional(&self.pool)
                .await?;
        Ok(state.unwrap_or_else(|| Value::Object(Default::default())))
    }

    /// Keeps a provider answer before it is forwarded; the first one written wins. Its chunk
    /// and file texts go to `session_texts` in the same statement (persist stores the same
    /// texts there for the session state a moment later; they are kept once), and the call's
    /// claim ([`Store::claim_call`]) goes: copies waiting on it find the answer. False when
    /// another answer to the round trip was saved first, which is kept.
    pub async fn save_llm_result(
        &self,
        key: &TurnKey,
        step: i32,
        result: Value,
    ) -> Result<bool, StoreError> {
        let (mut result, mut texts) = super::texts::take_texts(result, Holder::SavedAnswer);
        if let Some(raw) = result.pointer_mut("/job/result/raw") {
            super::tool_refs::value_by_ref(raw, &mut texts)?;
        }
        texts.retain(|sha| !self.texts.holds(sha));
        texts.sort();
        let done = sqlx::query!(
            "WITH texts AS (
                 INSERT INTO session_texts (sha256, body)
                 SELECT * FROM unnest($5::text[], $6::text[]) ON CONFLICT (sha256) DO NOTHING),
             released AS (
                 DELETE FROM llm_claims WHERE session_id = $1 AND turn_id = $2 AND step = $3)
             INSERT INTO llm_results (session_id, turn_id, step, result) VALUES ($1, $2, $3, $4)
             ON CONFLICT DO NOTHING",
            key.session_id.as_uuid(),
            key.turn_id.as_str(),
            step,
            super::json_text::JsonText(&result) as _,
            &texts.keys,
            &texts.bodies
        )
        .execute(&self.pool)
        .await?;
        self.texts.keep(&texts);
        Ok(done.rows_affected() == 1)
    }
}

/// A session with its turns and records, for `aptix session show`.
#[derive(Debug, Serialize)]
pub struct SessionView {
    /// The session row.
    pub session: Value,
    /// Its turns, in arrival order.
    pub turns: Vec<Value>,
    /// Its records, oldest first.
    pub records: Vec<Value>,
    /// Refusals sent to it (replies that answered a submission, not a step), oldest first.
    pub replies: Vec<Value>,
}

impl Store {
    /// A session's row with its state as the pipeline reads it (its texts in place), or `None`
    /// if it does not exist.
    pub(super) async fn session_row(
        &self,
        session: &SessionId,
    ) -> Result<Option<Value>, StoreError> {
        let row = sqlx::query_scalar!(
            r#"SELECT to_jsonb(s) AS "row!" FROM sessions s WHERE id = $1"#,
            session.as_uuid()
        )
        .fetch_optional(&self.pool)
        .await?;
        let Some(mut view) = row else { return Ok(None) };
        view["state"] = self.session_state(session).await?;
        Ok(Some(view))
    }

    /// Everything stored about a session, or `None` if it does not exist.
    pub async fn session_view(
        &self,
        session: &SessionId,
    ) -> Result<Option<SessionView>, StoreError> {
        let id = session.as_uuid();
        let Some(session) = self.session_row(session).await? else { return Ok(None) };
        let turns = sqlx::query_scalar!(
            r#"SELECT to_jsonb(t) AS "row!" FROM turns t WHERE session_id = $1 ORDER BY seq"#,
            id
        )
        .fetch_all(&self.pool)
        .await?;
        let records = self.session_records(id, None, None).await?;
        let replies = self.session_replies(id, None).await?;
        Ok(Some(SessionView { session, turns, records, replies }))
    }

    /// A session's records (of turn `turn` only, with `Some`), oldest first, their tool
    /// definitions put back in; with `newest`, only that many: the live records first, then
    /// the newest reprocessed ones.
    pub(super) async fn session_records(
        &self,
        session: uuid::Uuid,
        turn: Option<&str>,
        newest: Option<i64>,
    ) -> Result<Vec<Value>, StoreError> {
        // `LIMIT NULL` is no limit.
        Ok(sqlx::query_scalar!(
            r#"SELECT to_jsonb(r) || jsonb_build_object(
                   'request_payload', aptix_deref_at(r.request_payload, '{tools}'),
                   'response_payload', aptix_deref_at(r.response_payload, '{tools}')) AS "row!"
               FROM (SELECT * FROM response_records
                     WHERE session_id = $1 AND ($2::text IS NULL OR turn_id = $2)
                     ORDER BY reprocess_of IS NULL DESC, created_at DESC, id DESC
                     LIMIT $3) r
               ORDER BY r.created_at, r.id"#,
            session,
            turn,
            newest
        )
        .fetch_all(&self.pool)
        .await?)
    }
}
