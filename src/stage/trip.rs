//! This stage's hop on a turn's path: what the runner adds to the `x-aptix-hops` header of the
//! stage messages it forwards for the same turn (see `messages::hops`). Replies and messages of
//! other turns (a queued turn dispatched after this one) carry nothing of it.

use crate::broker::{Delivery, HeaderValue, OutMessage};
use crate::messages::hops::{self, Hop, HOPS_HEADER};

/// A delivery's place on its turn's path, taken when it arrives.
#[derive(Debug)]
pub(super) struct Trip {
    before: Vec<Hop>,
    stage: &'static str,
    received_ms: i64,
    attempt: u32,
    redelivered: bool,
    turn: Option<(String, String)>,
}

impl Trip {
    /// Starts `stage`'s hop for `d`; a client's own header is not the pipeline's and is ignored.
    pub fn start(stage: &'static str, d: &Delivery, from_clients: bool) -> Trip {
        let header = |k: &str| d.headers.get(k).cloned();
        let turn = header("x-aptix-session-id").zip(header("x-aptix-turn-id"));
        let turn = turn.or_else(|| d.hint.session.clone().zip(d.hint.turn.clone()));
        Trip {
            before: if from_clients { Vec::new() } else { hops::read(&d.headers) },
            stage,
            received_ms: hops::now_ms(),
            attempt: d.attempt,
            redelivered: d.redelivered,
            turn,
        }
    }

    /// The path so far and this hop, handed on now.
    pub fn path(&self) -> Vec<Hop> {
        let mut path = self.before.clone();
        path.push(Hop {
            stage: self.stage.to_owned(),
            received_ms: self.received_ms,
            sent_ms: hops::now_ms(),
            attempt: self.attempt,
            redelivered: self.redelivered,
        });
        path
    }

    /// Adds [`Trip::path`] to `out` when it is a stage message of the same turn.
    pub fn stamp(&self, out: &mut OutMessage) {
        let text = |k: &str| match out.headers.get(k) {
            Some(HeaderValue::Str(s)) => Some(s.clone()),
            _ => None,
        };
        let same = self.turn.is_some()
            && text("x-aptix-session-id").zip(text("x-aptix-turn-id")) == self.turn;
        if out.kind != "turn" || !same {
            return;
        }
        out.headers.insert(HOPS_HEADER.to_owned(), hops::encode(&self.path()).into());
    }
}
