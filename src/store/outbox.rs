//! The transactional outbox: messages written in the same transaction as the state change they
//! announce, published after the commit, deleted once confirmed. A crash between commit and
//! publish leaves the rows; the redelivered input finds and publishes them.
//!
//! Rows hold typed, versioned [`Outgoing`] payloads (`payload`); rows written before that hold
//! an AMQP message in the other columns and are read as [`Outgoing::Legacy`] until drained.

use std::time::Duration;

use sqlx::PgConnection;
use uuid::Uuid;

use serde::Deserialize as _;

use super::{Store, StoreError};
use crate::contracts::SessionId;
use crate::messages::{LegacyMessage, Outgoing};

/// Outbox rows and the messages they hold.
#[derive(Debug, Default, Clone)]
pub struct PendingOutbox {
    /// Row ids, to delete once published.
    pub ids: Vec<i64>,
    /// The messages, in insertion order.
    pub messages: Vec<Outgoing>,
}

impl PendingOutbox {
    /// Whether there is nothing to publish.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Adds `other`'s rows after these, in order.
    pub(super) fn append(&mut self, other: PendingOutbox) {
        self.ids.extend(other.ids);
        self.messages.extend(other.messages);
    }
}

/// A session's name and expiry, as its step replies carry them.
pub(super) type SessionModel = (Option<String>, Option<chrono::DateTime<chrono::Utc>>);

/// Writes `messages` as outbox rows, a step reply of the session given its current name and
/// expiry.
pub(super) async fn insert(
    conn: &mut PgConnection,
    session: Uuid,
    turn: &str,
    mut messages: Vec<Outgoing>,
) -> Result<PendingOutbox, StoreError> {
    let mut out = PendingOutbox::default();
    with_session_model(conn, session, &mut messages, None).await?;
    for m in messages {
        let id = sqlx::query_scalar!(
            "INSERT INTO outbox (session_id, turn_id, payload) VALUES ($1, $2, $3) RETURNING id",
            session,
            turn,
            payload(&m)?
        )
        .fetch_one(&mut *conn)
        .await?;
        out.ids.push(id);
        out.messages.push(m);
    }
    Ok(out)
}

/// Gives the session's step replies its current name and expiry, read under the transaction
/// that sends them (`known`, or read here).
pub(super) async fn with_session_model(
    conn: &mut PgConnection,
    session: Uuid,
    messages: &mut [Outgoing],
    known: Option<SessionModel>,
) -> Result<(), StoreError> {
    let mut replies = messages.iter_mut().filter_map(|m| match m {
        Outgoing::Reply(r) if r.step.is_some() && r.session.as_uuid() == session => Some(r),
        _ => None,
    });
    let Some(first) = replies.next() else { return Ok(()) };
    let model: Option<SessionModel> = match known {
        Some(model) => Some(model),
        None => sqlx::query!("SELECT name, expires_at FROM sessions WHERE id = $1", session)
            .fetch_optional(&mut *conn)
            .await?
            .map(|r| (r.name, r.expires_at)),
    };
    let (name, expires) = model.unwrap_or_default();
    for r in std::iter::once(first).chain(replies) {
        (r.session_name, r.session_expires) = (name.clone(), expires);
    }
    Ok(())
}

/// A message as its outbox row holds it.
pub(super) fn payload(m: &Outgoing) -> Result<serde_json::Value, StoreError> {
    crate::metrics::metrics().json("serialize", "outbox");
    Ok(serde_json::to_value(m)?)
}

/// Rows younger than this are presumed still being published, then deleted, by the worker that
/// wrote them (it publishes within milliseconds of its commit).
const SETTLING: Duration = Duration::from_secs(1);
/// Pauses while such rows go, milliseconds: 77 ms in all.
const SETTLE_PAUSES_MS: [u64; 5] = [2, 5, 10, 20, 40];

/// Unpublished rows of one turn, for a copy of a message that already wrote them (a duplicate or
/// a redelivery, found under the session's lock). Rows written in the last second are most
/// likely being published and deleted by their writer at this very moment, and publishing them
/// again here would send the client a copy: they get a moment (77 ms at most) to go. What is
/// left after it is published by the caller, as after a crash of the writer.
pub(super) async fn pending_for_turn(
    conn: &mut PgConnection,
    session: Uuid,
    turn: &str,
) -> Result<PendingOutbox, StoreError> {
    let (rows, _) = settled(conn, session, Some(turn), SETTLING).await?;
    decode(&rows)
}

/// Unpublished rows of every turn of a session, oldest first, for a turn about to start (under
/// the session's lock): it must not overtake them. Rows written within `fresh` are being
/// published by their writer and get a moment (77 ms at most) to go, waited for here rather
/// than by running the whole admission again; `None` when one is still there after it.
pub(super) async fn stale_for_session(
    conn: &mut PgConnection,
    session: Uuid,
    fresh: Duration,
) -> Result<Option<PendingOutbox>, StoreError> {
    match settled(conn, session, None, fresh).await? {
        (_, true) => Ok(None),
        (rows, false) => decode(&rows).map(Some),
    }
}

/// An outbox row as read back: a typed payload, or (rows written before payloads) the AMQP
/// message's parts.
pub(super) struct OutboxRow {
    pub id: i64,
    pub payload: Option<serde_json::Value>,
    pub exchange: Option<String>,
    pub routing_key: Option<String>,
    pub message_id: Option<String>,
    pub kind: Option<String>,
    pub declare_session: bool,
    pub headers: serde_json::Value,
    pub body: Option<Vec<u8>>,
    /// Written within the freshness window the query was given.
    pub fresh: bool,
}

/// The unpublished rows, read again after each pause while one of them is younger than `fresh`;
/// and whether one still is.
async fn settled(
    conn: &mut PgConnection,
    session: Uuid,
    turn: Option<&str>,
    fresh: Duration,
) -> Result<(Vec<OutboxRow>, bool), StoreError> {
    let mut rows = rows(conn, session, turn, fresh).await?;
    for pause in SETTLE_PAUSES_MS {
        if !rows.iter().any(|r| r.fresh) {
            return Ok((rows, false));
        }
        tokio::time::sleep(Duration::from_millis(pause)).await;
        rows = self::rows(conn, session, turn, fresh).await?;
    }
    let fresh = rows.iter().any(|r| r.fresh);
    Ok((rows, fresh))
}

async fn rows(
    conn: &mut PgConnection,
    session: Uuid,
    turn: Option<&str>,
    fresh: Duration,
) -> Result<Vec<OutboxRow>, StoreError> {
    Ok(sqlx::query_as!(
        OutboxRow,
        r#"SELECT id, payload, exchange, routing_key, message_id, kind, declare_session, headers,
                  body, created_at > now() - make_interval(secs => $3) AS "fresh!"
           FROM outbox WHERE session_id = $1 AND ($2::text IS NULL OR turn_id = $2) ORDER BY id"#,
        session,
        turn,
        fresh.as_secs_f64()
    )
    .fetch_all(&mut *conn)
    .await?)
}

pub(super) fn decode(rows: &[OutboxRow]) -> Result<PendingOutbox, StoreError> {
    let mut out = PendingOutbox::default();
    for row in rows {
        out.ids.push(row.id);
        out.messages.push(match &row.payload {
            Some(p) => {
                crate::metrics::metrics().json("parse", "outbox");
                Outgoing::deserialize(p)?
            }
            None => Outgoing::Legacy(legacy(row).ok_or_else(|| sqlx::Error::ColumnDecode {
                index: "exchange".into(),
                source: "a legacy outbox row lacks a column".into(),
            })?),
        });
    }
    Ok(out)
}

/// [`decode`], leaving out (logged) the rows that do not decode: a pass over many turns' rows
/// (the orphan passes) must not stop for all of them at one.
pub(super) fn decode_each(rows: &[OutboxRow]) -> PendingOutbox {
    let mut out = PendingOutbox::default();
    for row in rows {
        match decode(std::slice::from_ref(row)) {
            Ok(one) => out.append(one),
            Err(error) => {
                tracing::warn!(outbox_id = row.id, %error, "an outbox row does not decode; left where it is");
            }
        }
    }
    out
}

/// A row written before payloads, as the message it holds; `None` if a column it needs is NULL.
fn legacy(row: &OutboxRow) -> Option<LegacyMessage> {
    Some(LegacyMessage {
        exchange: row.exchange.clone()?,
        routing_key: row.routing_key.clone()?,
        message_id: row.message_id.clone()?,
        kind: row.kind.clone()?,
        headers: row.headers.clone(),
        body: row.body.clone()?,
        declare_session: row.declare_session,
    })
}

impl Store {
    /// Outbox rows of one turn that are still unpublished.
    pub async fn pending_outbox(
        &self,
        session: &SessionId,
        turn: &str,
    ) -> Result<PendingOutbox, StoreError> {
        let mut conn = self.pool.acquire().await?;
        pending_for_turn(&mut conn, session.as_uuid(), turn).await
    }

    /// Number of unpublished outbox rows (zero after a clean drain).
    pub async fn outbox_len(&self) -> Result<i64, StoreError> {
        let n = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM outbox"#);
        Ok(n.fetch_one(&self.pool).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, payload: Option<serde_json::Value>, exchange: Option<&str>) -> OutboxRow {
        OutboxRow {
            id,
            payload,
            exchange: exchange.map(str::to_owned),
            routing_key: Some("rk".into()),
            message_id: Some(format!("m{id}")),
            kind: Some("turn".into()),
            declare_session: false,
            headers: serde_json::json!({}),
            body: Some(b"{}".to_vec()),
            fresh: false,
        }
    }

    /// An orphan pass reads up to a hundred rows of many turns: one that no longer decodes
    /// (a version's payload this one cannot read, a legacy row missing a column) is left out,
    /// not the reason none of the others is published.
    #[test]
    fn a_row_that_does_not_decode_holds_back_none_of_the_others() {
        let rows = [
            row(1, None, Some("x")),
            row(2, Some(serde_json::json!({"Kind": "outgoing.unknown/v9"})), None),
            row(3, None, None),
            row(4, None, Some("y")),
        ];
        assert!(decode(&rows).is_err(), "one bad row fails the strict decoding");
        let out = decode_each(&rows);
        assert_eq!(out.ids, [1, 4]);
        assert_eq!(out.messages.len(), 2);
    }
}
