//! This stage's hop on a turn's path: what the runner adds to the `x-aptix-hops` header of the
//! stage messages it forwards for the same turn (see `messages::hops`). Replies and messages of
//! other turns (a queued turn dispatched after this one) carry nothing of it. A client cannot
//! start a path: the runtime removes every `x-aptix-*` header of an ingress delivery.

use crate::broker::{Delivery, OutMessage};
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
    /// Starts `stage`'s hop for `d`.
    pub fn start(stage: &'static str, d: &Delivery) -> Trip {
        let turn = d.hint.pair().map(|(s, t)| (s.to_owned(), t.to_owned()));
        Trip {
            before: hops::read(&d.headers),
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
        let mine = self.turn.as_ref().map(|(s, t)| (s.as_str(), t.as_str()));
        if out.kind != "turn" || mine.is_none() || out.turn() != mine {
            return;
        }
        out.headers.insert(HOPS_HEADER.to_owned(), hops::encode(&self.path()).into());
    }
}
