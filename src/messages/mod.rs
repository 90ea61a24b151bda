//! Every message that crosses a queue edge or waits in the outbox, in one place. A message
//! between stages is tagged with its kind and version (`"Kind": "turn.assemble/v1"`); a stage
//! rejects kinds it does not expect, so a rolling upgrade can never feed it a shape it misreads.
//!
//! Edges (named by the artifact, not by who consumes it): backends → `requests` (raw
//! `AgentExecuteRequest` JSON, [`Submission`]) → an admitted turn ([`AdmittedTurn`]) → with its chunks
//! ([`RetrievedTurn`]) → with its `/responses` body ([`AssembledTurn`]) → how the round trip ended
//! ([`EndedRoundTrip`]) → the session's reply queue ([`Outgoing::Reply`]).
//!
//! Inner messages are written only by Aptix and were validated when their request entered, so
//! they are decoded as they are: nothing is validated twice.

pub mod hops;
mod jobs;
mod outgoing;
mod tools;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use hops::Hop;
pub use jobs::{
    with_owed_warnings, AdmittedTurn, Answer, AssembledTurn, EndedRoundTrip, RetrievedTurn,
    RoundTrip, SavedRoundTrip,
};
pub use outgoing::{LegacyMessage, Outgoing, Replay, ReplyOut, ReplyOutcome, Submission};
pub use tools::{server_rounds, ServerExecution};

use crate::contracts::ApiError;

/// A message between stages: its kind on the wire, and the turn it carries.
pub trait Message: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// `"Kind"` on the wire, with its version (`turn.retrieve/v1`).
    const KIND: &'static str;

    /// The turn the message belongs to.
    fn turn(&self) -> &AdmittedTurn;

    /// The round trip this message becomes when its turn fails with `errors` (sent to the last
    /// stage, which records it and replies). `None` when there is nothing left to fail.
    fn fail(self, errors: Vec<ApiError>) -> Option<EndedRoundTrip> {
        Some(EndedRoundTrip::failed(self.turn().clone(), errors))
    }

    /// Takes the turn's path so far, this delivery's own hop last ([`hops`]); only the last
    /// stage, which records it, keeps it.
    fn take_hops(&mut self, path: Vec<Hop>) {
        let _ = path;
    }
}

impl Message for AdmittedTurn {
    const KIND: &'static str = "turn.retrieve/v1";
    fn turn(&self) -> &AdmittedTurn {
        self
    }
}

impl Message for RetrievedTurn {
    const KIND: &'static str = "turn.assemble/v1";
    fn turn(&self) -> &AdmittedTurn {
        &self.admitted
    }
}

impl Message for AssembledTurn {
    const KIND: &'static str = "turn.invoke/v1";
    fn turn(&self) -> &AdmittedTurn {
        &self.admitted
    }
}

impl Message for EndedRoundTrip {
    const KIND: &'static str = "turn.persist/v1";
    fn turn(&self) -> &AdmittedTurn {
        &self.admitted
    }

    fn take_hops(&mut self, path: Vec<Hop>) {
        self.hops = path;
    }

    /// Failing a round trip again replaces its result; a failure that could not even be
    /// recorded is an operator's to look at, not another message's.
    fn fail(mut self, errors: Vec<ApiError>) -> Option<EndedRoundTrip> {
        if matches!(self.result, RoundTrip::Failed { .. }) && self.assembled.is_none() {
            let (session, turn) = (&self.admitted.key.session_id, &self.admitted.key.turn_id);
            tracing::error!(%session, %turn, ?errors, "could not record a failed turn");
            return None;
        }
        self.result = RoundTrip::Failed { errors, raw: None };
        self.assembled = None;
        self.session_state = None;
        Some(self)
    }
}

/// What the last stage hands on: nothing (it ends the round trip).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Done {}

impl Message for Done {
    const KIND: &'static str = "done";
    fn turn(&self) -> &AdmittedTurn {
        match *self {}
    }
}

#[derive(Serialize)]
struct Tagged<'a, M> {
    #[serde(rename = "Kind")]
    kind: &'static str,
    #[serde(flatten)]
    body: &'a M,
}

/// Only a message's kind. Its other fields are skipped unread.
#[derive(Deserialize)]
struct KindOf<'a> {
    #[serde(rename = "Kind", borrow)]
    kind: std::borrow::Cow<'a, str>,
}

/// `message` as it goes on the wire: its fields, tagged with its kind.
pub fn encode<M: Message>(message: &M) -> Result<Vec<u8>, serde_json::Error> {
    crate::metrics::metrics().json("serialize", M::KIND);
    serde_json::to_vec(&Tagged { kind: M::KIND, body: message })
}

/// A message of kind `M` from the wire (one parse; a kind other than `M::KIND` is an error).
///
/// `M` is read from the bytes directly, ignoring `Kind`: a flattened field would make serde
/// buffer the whole message as a tree first, and the `/responses` body could not stay text.
/// [`encode`] writes `Kind` first, so its messages need no second look for it.
pub fn decode<M: Message>(bytes: &[u8]) -> Result<M, DecodeError> {
    crate::metrics::metrics().json("parse", M::KIND);
    if !starts_with_kind(bytes, M::KIND) {
        let tagged: KindOf<'_> = serde_json::from_slice(bytes)?;
        if tagged.kind != M::KIND {
            let found = tagged.kind.into_owned();
            return Err(DecodeError::Kind { found, expected: M::KIND });
        }
    }
    Ok(serde_json::from_slice(bytes)?)
}

/// Why bytes (or a stored value) are not a message this build reads.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON of the message's shape.
    #[error("undecodable: {0}")]
    Json(#[from] serde_json::Error),
    /// Another kind of message.
    #[error("a `{found}` message where `{expected}` was expected")]
    Kind {
        /// Its `Kind`.
        found: String,
        /// The kind asked for.
        expected: &'static str,
    },
    /// A stored form from a version this build does not read.
    #[error("{what} has unknown version {version}")]
    Version {
        /// What was stored.
        what: &'static str,
        /// Its version.
        version: u16,
    },
}

/// Whether `bytes` open with `{"Kind":"<kind>",`, as [`encode`] writes them.
fn starts_with_kind(bytes: &[u8], kind: &str) -> bool {
    let rest = bytes.strip_prefix(br#"{"Kind":""#.as_slice());
    let rest = rest.and_then(|r| r.strip_prefix(kind.as_bytes()));
    rest.is_some_and(|r| r.starts_with(br#"","#))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::RequestBody;

    /// A message with a body, not a turn: decoding never asks for the turn.
    #[derive(Debug, Serialize, Deserialize)]
    struct Probe {
        n: u32,
        body: RequestBody,
    }

    impl Message for Probe {
        const KIND: &'static str = "probe/v1";
        fn turn(&self) -> &AdmittedTurn {
            unreachable!("a probe carries no turn")
        }
    }

    #[test]
    fn a_message_decodes_whatever_the_place_of_its_kind_and_keeps_its_body_as_text() {
        let body = RequestBody::new(&serde_json::json!({"model": "m", "input": ["a\"b"]}));
        let bytes = encode(&Probe { n: 7, body: body.clone() }).unwrap();
        assert!(bytes.starts_with(br#"{"Kind":"probe/v1","#));
        let back: Probe = decode(&bytes).unwrap();
        assert_eq!((back.n, back.body.as_str()), (7, body.as_str()));
        let later = format!(r#"{{"n": 8, "body": {}, "Kind": "probe/v1"}}"#, body.as_str());
        assert_eq!(decode::<Probe>(later.as_bytes()).unwrap().n, 8);
        let other = br#"{"Kind":"turn.persist/v1","n":1,"body":{}}"#;
        let e = decode::<Probe>(other).unwrap_err();
        assert!(e.to_string().contains("`turn.persist/v1` message where `probe/v1`"), "{e}");
        let prefixed = br#"{"Kind":"probe/v1x","n":1,"body":{}}"#;
        assert!(decode::<Probe>(prefixed).unwrap_err().to_string().contains("`probe/v1x`"));
        assert!(decode::<Probe>(br#"{"n":1,"body":{}}"#).unwrap_err().to_string().contains("Kind"));
    }
}
