//! A session state as `sessions.state` holds it (texts by reference), kept as its JSON text so
//! it can travel with a round trip from assemble, which read it, to persist, which builds the
//! next state from it: one read of the row per round trip instead of two.
//!
//! Carrying it is safe because the state read by a round trip's assemble is still the row when
//! that round trip's persist commits: a session runs one turn at a time, only persist of its
//! running turn writes the state, and it does so for the step it ends, moving the turn past it
//! (steps only go up). A copy of the round trip that arrives later finds its step recorded
//! (persist writes nothing again) or its turn past that step (refused).
//!
//! A state larger than [`StoredState::MAX_CARRIED`] is not carried (persist reads the row), so
//! stage messages stay within the size `config` budgets for them.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The stored JSON of a session state, unparsed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StoredState(Box<RawValue>);

impl StoredState {
    /// Bytes of stored state carried at most. States are a few KB; one holding a large solution
    /// context or an old row's inline texts can approach a request's size.
    pub const MAX_CARRIED: usize = crate::config::MAX_CARRIED_STATE_BYTES;

    /// The state as read from its row, if it is small enough to carry.
    pub fn to_carry(stored: &serde_json::Value) -> Result<Option<Self>, serde_json::Error> {
        crate::metrics::metrics().json("serialize", "session_state_carried");
        let raw = serde_json::value::to_raw_value(stored)?;
        Ok((raw.get().len() <= Self::MAX_CARRIED).then_some(StoredState(raw)))
    }

    /// A row's text as it is, if it is small enough to carry: for a state that parsed as
    /// packed, whose text persist parses the same way. Writing the parsed state out again
    /// (escaping every transcript text) would only make a copy of it.
    pub fn verbatim(text: String) -> Result<Option<Self>, serde_json::Error> {
        if text.len() > Self::MAX_CARRIED {
            return Ok(None);
        }
        Ok(Some(StoredState(RawValue::from_string(text)?)))
    }

    /// The stored JSON's text.
    pub fn json(&self) -> &str {
        self.0.get()
    }

    /// The stored JSON again, as a tree.
    pub fn to_value(&self) -> Result<serde_json::Value, serde_json::Error> {
        crate::metrics::metrics().json("parse", "session_state_carried");
        serde_json::from_str(self.0.get())
    }
}

impl PartialEq for StoredState {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn travels_unchanged_through_a_message_and_a_tree() {
        let stored = json!({"v": 1, "texts_by_ref": true, "history": {"chunks": [
            {"id": "a", "text_ref": "ab12"}]}});
        let carried = StoredState::to_carry(&stored).unwrap().unwrap();
        let wire = serde_json::to_vec(&json!({"state": carried})).unwrap();
        let back: serde_json::Value = serde_json::from_slice(&wire).unwrap();
        #[derive(Deserialize)]
        struct Holder {
            state: StoredState,
        }
        let from_bytes: Holder = serde_json::from_slice(&wire).unwrap();
        assert_eq!(from_bytes.state, carried);
        assert_eq!(from_bytes.state.to_value().unwrap(), stored);
        let from_tree: Holder = serde_json::from_value(back).unwrap();
        assert_eq!(from_tree.state.to_value().unwrap(), stored);
    }

    #[test]
    fn a_row_carried_verbatim_reads_as_the_row_and_keeps_its_text() {
        let row = r#"{"v": 1, "texts_by_ref": true, "history": {"chunks": []}}"#;
        let carried = StoredState::verbatim(format!(" {row}\n")).unwrap().unwrap();
        assert_eq!(carried.json(), row);
        let packed = crate::assemble::PackedState::from_stored_json(carried.json()).unwrap();
        assert_eq!(packed, crate::assemble::PackedState::from_stored_json(row).unwrap());
        assert!(StoredState::verbatim("x".repeat(StoredState::MAX_CARRIED + 1)).unwrap().is_none());
        assert!(StoredState::verbatim("{".to_owned()).is_err());
    }

    #[test]
    fn a_state_over_the_bound_is_left_to_be_read_from_its_row() {
        let context = "x".repeat(StoredState::MAX_CARRIED);
        let large = json!({"v": 1, "solution_context": context});
        assert!(StoredState::to_carry(&large).unwrap().is_none());
    }
}
