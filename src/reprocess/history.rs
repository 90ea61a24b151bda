//! The sessions replayed so far in a run: a session's state after its turns before some turn,
//! so that the session's next turn replays only the round trips since then. Rebuilding each
//! turn from the session's whole history made reprocessing a session of N turns read and apply
//! N²/2 saved round trips (a 1,000-turn session: half a million, each tens of KB).

use std::collections::HashMap;
use std::sync::Mutex;

use uuid::Uuid;

use crate::assemble::SessionState;

/// Sessions kept at most; past it the oldest kept goes (a run takes its turns in the order
/// they were recorded, so a session's turns come close together).
const CAPACITY: usize = 512;

/// Session states by session: the state after every round trip of the turns before `seq`.
#[derive(Debug, Default)]
pub(crate) struct Histories {
    kept: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    states: HashMap<Uuid, Entry>,
    uses: u64,
}

#[derive(Debug)]
struct Entry {
    seq: i64,
    state: SessionState,
    used: u64,
}

impl Histories {
    /// The latest state kept for `session` that a turn with arrival order `seq` can start
    /// from: the turns before the returned order are in it, those from it on are not.
    pub fn before(&self, session: Uuid, seq: i64) -> Option<(i64, SessionState)> {
        let mut kept = self.kept.lock().ok()?;
        kept.uses += 1;
        let uses = kept.uses;
        let entry = kept.states.get_mut(&session).filter(|e| e.seq <= seq)?;
        entry.used = uses;
        Some((entry.seq, entry.state.clone()))
    }

    /// Keeps `state`, the session after every turn before `seq`, unless a later one is kept.
    pub fn keep(&self, session: Uuid, seq: i64, state: &SessionState) {
        let Ok(mut kept) = self.kept.lock() else { return };
        kept.uses += 1;
        let used = kept.uses;
        if let Some(entry) = kept.states.get_mut(&session) {
            if entry.seq < seq {
                *entry = Entry { seq, state: state.clone(), used };
            }
            return;
        }
        if kept.states.len() >= CAPACITY {
            let oldest = kept.states.iter().min_by_key(|(_, e)| e.used).map(|(s, _)| *s);
            if let Some(oldest) = oldest {
                kept.states.remove(&oldest);
            }
        }
        kept.states.insert(session, Entry { seq, state: state.clone(), used });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(name: &str) -> SessionState {
        SessionState { solution_context: Some(name.into()), ..Default::default() }
    }

    #[test]
    fn a_turn_starts_from_the_latest_state_before_it_and_never_from_a_later_one() {
        let h = Histories::default();
        let s = Uuid::new_v4();
        assert!(h.before(s, 5).is_none());
        h.keep(s, 3, &state("after 1-2"));
        h.keep(s, 6, &state("after 1-5"));
        // An earlier state never replaces a later one (turns finish out of order).
        h.keep(s, 4, &state("after 1-3"));
        let (seq, got) = h.before(s, 7).unwrap();
        assert_eq!((seq, got.solution_context.as_deref()), (6, Some("after 1-5")));
        // A turn before the kept state cannot use it.
        assert!(h.before(s, 5).is_none());
        assert_eq!(h.before(s, 6).unwrap().0, 6);
    }

    #[test]
    fn past_its_capacity_the_session_used_longest_ago_goes() {
        let h = Histories::default();
        let sessions: Vec<Uuid> = (0..=CAPACITY).map(|_| Uuid::new_v4()).collect();
        for s in &sessions[..CAPACITY] {
            h.keep(*s, 1, &state("x"));
        }
        assert!(h.before(sessions[0], 2).is_some(), "the first is used again");
        h.keep(sessions[CAPACITY], 1, &state("x"));
        assert!(h.before(sessions[0], 2).is_some());
        assert!(h.before(sessions[1], 2).is_none(), "the one used longest ago went");
        assert!(h.before(sessions[CAPACITY], 2).is_some());
    }
}
