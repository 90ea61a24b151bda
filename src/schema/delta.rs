//! The stream delta schema (`type` = `delta` on a session's reply queue), generated from
//! [`ReplyDelta`] with the identifier patterns the other schemas use.

use schemars::{schema_for, Schema};
use serde_json::json;

use super::{refine_property, session_id, to_value, turn_id};
use crate::contracts::ReplyDelta;

/// The delta schema.
pub(super) fn schema() -> Schema {
    let mut generated = to_value(schema_for!(ReplyDelta));
    if let Some(props) = generated.get_mut("properties").and_then(|p| p.as_object_mut()) {
        refine_property(props, "SessionId", session_id());
        refine_property(props, "TurnId", turn_id());
        refine_property(props, "Delta", json!({ "type": "boolean", "const": true }));
        refine_property(props, "Step", json!({ "type": "integer", "minimum": 0 }));
        refine_property(props, "Seq", json!({ "type": "integer", "minimum": 0 }));
    }
    generated["description"] = json!(
        "The body of a stream delta (AMQP `type` = `delta`): partial output of one step of a streamed turn, \
         a preview; the reply that ends the step is complete and authoritative. See docs/client-protocol.md."
    );
    super::from_value(generated)
}
