//! A session state as `sessions.state` holds it (texts by reference), kept as its JSON text so
//! it can travel with a round trip from assemble, which read it, to persist, which builds the
//! next state from it: one read of the row per round trip instead of two.
//!
//! Carrying it is safe because only the persist step of a session's running turn writes the
//! state, after this round trip's assemble read it; a copy of the round trip that arrives later
//! is refused by persist before anything is written (its step already has a record).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The stored JSON of a session state, unparsed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StoredState(Box<RawValue>);

impl StoredState {
    /// The state as read from its row.
    pub fn new(stored: &serde_json::Value) -> Result<Self, serde_json::Error> {
        serde_json::value::to_raw_value(stored).map(StoredState)
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
        let carried = StoredState::new(&stored).unwrap();
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
}
