//! Turn rows and their states: what `turns` holds, and reading a row back into the message that
//! starts it. Its own file so that the turn dispatch (`turns`) and the tenants' limits
//! (`tenants`), which use each other's rows, do not use each other.

use serde::Serialize;
use serde_json::Value;
use sqlx::types::Json;
use uuid::Uuid;

use super::StoreError;
use crate::contracts::{InstanceName, InvalidName, ReplyAddress, SessionId, TenantName, TurnKey};
use crate::contracts::{ToolCall, UserWarning};
use crate::lifecycle::Phase;
pub use crate::lifecycle::TurnState;
use crate::messages::{AdmittedTurn, ServerExecution};

/// The JSON columns of a turn, as they decode (a value that does not is corrupt stored data:
/// `ColumnDecode`, not retried).
pub(crate) type CallList = Json<Vec<ToolCall>>;
pub(crate) type WarningList = Json<Vec<UserWarning>>;
pub(crate) type ExecutionList = Json<Vec<ServerExecution>>;

impl TryFrom<String> for TurnState {
    type Error = StoreError;
    fn try_from(s: String) -> Result<Self, StoreError> {
        serde_json::from_value(serde_json::Value::String(s)).map_err(StoreError::Corrupt)
    }
}

/// A row of `turns`.
#[derive(Debug, Clone, Serialize)]
pub struct TurnRow {
    /// Session.
    pub session_id: Uuid,
    /// Turn.
    pub turn_id: String,
    /// Arrival order within the session.
    pub seq: i64,
    /// Where the turn stands.
    pub state: TurnState,
    /// Fingerprint of the admitted request.
    pub fingerprint: String,
    /// The validated request (wire form).
    pub request: Value,
    /// Round trips done.
    pub step: i32,
    /// Tool calls the client must answer, while awaiting.
    pub pending_tool_calls: Option<Json<Vec<ToolCall>>>,
    /// Warnings owed to the turn's final response.
    pub pending_warnings: Option<Json<Vec<UserWarning>>>,
    /// The last reply sent for this turn, in rows written before it was read from the turn's
    /// latest record instead ([`finished_reply`]); NULL since.
    pub last_reply: Option<Value>,
    /// The continuation that resumed the turn, if any.
    pub continuation: Option<Value>,
    /// Its fingerprint.
    pub continuation_fingerprint: Option<String>,
    /// The backend instance that receives the current round trip's replies, if one was named.
    pub reply_to: Option<String>,
    /// Its session's tenant, if tenants are configured.
    pub tenant: Option<String>,
    /// When a client's cancel of it was admitted.
    pub cancel_requested_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Server tool calls to run before its next provider call.
    pub server_calls: Option<Json<Vec<ToolCall>>>,
    /// Its server tool executions so far.
    pub server_executions: Option<Json<Vec<ServerExecution>>>,
}

fn parsed<T: std::str::FromStr<Err = InvalidName>>(
    text: Option<&str>,
) -> Result<Option<T>, StoreError> {
    text.map(str::parse)
        .transpose()
        .map_err(|e: InvalidName| StoreError::Corrupt(serde::de::Error::custom(e)))
}

impl TurnRow {
    /// The phase of the turn's life it is in (`active`: it is its session's active turn).
    pub fn phase(&self, active: bool) -> Phase {
        Phase::stored(self.state, active, self.step, self.cancel_requested_at.is_some())
    }

    /// The turn's key.
    pub fn key(&self) -> Result<TurnKey, StoreError> {
        let turn_id = self.turn_id.parse().map_err(|(_, e)| {
            StoreError::Corrupt(serde::de::Error::custom(format!("stored TurnId: {e}")))
        })?;
        Ok(TurnKey { session_id: SessionId::new(self.session_id), turn_id })
    }

    /// The backend instance its replies go to (checked: the column is written from a checked
    /// name).
    pub fn reply_to(&self) -> Result<Option<InstanceName>, StoreError> {
        parsed(self.reply_to.as_deref())
    }

    /// Its session's tenant (checked: written from a configured name).
    pub fn tenant(&self) -> Result<Option<TenantName>, StoreError> {
        parsed(self.tenant.as_deref())
    }

    /// The ConversationContext (mode) it runs in: admission writes it into the stored request.
    pub fn conversation_context_id(&self) -> Option<String> {
        let id = self.request.get("ConversationContextId").and_then(Value::as_str);
        id.map(str::to_owned)
    }

    /// Where its current round trip's replies go.
    pub fn address(&self) -> Result<ReplyAddress, StoreError> {
        Ok(ReplyAddress { tenant: self.tenant()?, instance: self.reply_to()? })
    }

    /// The message that starts (or resumes) this turn at its current step. The request is read
    /// back from PostgreSQL, so it is checked here, once, as it leaves the store.
    pub fn start_job(&self) -> Result<AdmittedTurn, StoreError> {
        let decode = |v: &Value| {
            crate::rules::from_stored(v)
                .map_err(|e| StoreError::Corrupt(serde::de::Error::custom(e)))
        };
        Ok(AdmittedTurn {
            key: self.key()?,
            step: self.step,
            turn: decode(&self.request)?,
            continuation: self.continuation.as_ref().map(decode).transpose()?,
            pending_tool_calls: list(&self.pending_tool_calls),
            admitted_at: chrono::Utc::now(),
            carried_warnings: list(&self.pending_warnings),
            reply_to: self.reply_to()?,
            tenant: self.tenant()?,
            server_calls: list(&self.server_calls),
            executed: list(&self.server_executions),
            steers: Vec::new(),
        })
    }
}

/// A stored JSON list (absent: empty).
fn list<T: Clone>(v: &Option<Json<Vec<T>>>) -> Vec<T> {
    v.as_ref().map(|l| l.0.clone()).unwrap_or_default()
}

/// `sqlx::query_as!` for [`TurnRow`]s, checked at compile time: `$head`, the row's columns,
/// then `$tail`, with the statement's arguments. One list of columns for every statement that
/// reads turns back.
macro_rules! query_turns {
    ($head:literal, $tail:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            $crate::store::TurnRow,
            $head
                + r#"session_id AS "session_id!", turn_id AS "turn_id!", seq AS "seq!",
                     state AS "state!: crate::store::TurnState", fingerprint AS "fingerprint!",
                     request AS "request!", step AS "step!",
                     pending_tool_calls AS "pending_tool_calls: crate::store::turn_row::CallList",
                     pending_warnings AS "pending_warnings: crate::store::turn_row::WarningList",
                     last_reply, continuation, continuation_fingerprint, reply_to, tenant,
                     cancel_requested_at,
                     server_calls AS "server_calls: crate::store::turn_row::CallList",
                     server_executions AS "server_executions: crate::store::turn_row::ExecutionList" "#
                + $tail
            $(, $arg)*
        )
    };
}
pub(super) use query_turns;

/// The turn `turn` of `session`, if admitted.
pub(super) async fn turn_row(
    conn: &mut sqlx::PgConnection,
    session: Uuid,
    turn: &str,
) -> Result<Option<TurnRow>, StoreError> {
    let q =
        query_turns!("SELECT ", "FROM turns WHERE session_id = $1 AND turn_id = $2", session, turn);
    Ok(q.fetch_optional(&mut *conn).await?)
}

/// A turn's state as its column holds it (text, checked by the table's constraint).
impl sqlx::Type<sqlx::Postgres> for TurnState {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <String as sqlx::Type<sqlx::Postgres>>::type_info()
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for TurnState {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let text = <String as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
        Ok(TurnState::try_from(text)?)
    }
}
