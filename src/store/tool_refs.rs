//! Tool definitions stored once: a `/responses` call's `tools` array is the same on every turn
//! of a conversation context, and the provider echoes it back, so each turn wrote it three
//! times (the record's request and response payloads, the saved answer's raw response). It is
//! kept in `session_texts` under the SHA-256 of its JSON text, and the stored JSON holds
//! `{"aptix_text_ref": "<sha256>"}` in its place. The provider's `tools` is always an array, so
//! an object there is always a reference. Readers put it back in SQL (`aptix_deref_at`,
//! migration 0015), so every query that returns these columns returns what was written.

use std::collections::BTreeMap;

use serde_json::value::RawValue;
use serde_json::Value;

use super::texts::Texts;

/// Arrays shorter than this (in JSON characters) stay inline: a reference would not be much
/// smaller.
const MIN_BY_REF: usize = 256;

/// The key of the array, in each payload.
const KEY: &str = "tools";

/// The reference that takes the array's place.
fn reference(sha: &str) -> Value {
    serde_json::json!({ "aptix_text_ref": sha })
}

/// Moves the top-level `tools` array of `payload` (a provider response) into `texts`.
pub(super) fn value_by_ref(
    payload: &mut Value,
    texts: &mut Texts,
) -> Result<(), serde_json::Error> {
    let Some(tools) = payload.get_mut(KEY).filter(|t| t.is_array()) else { return Ok(()) };
    let text = serde_json::to_string(tools)?;
    if text.len() < MIN_BY_REF {
        return Ok(());
    }
    let sha = crate::assemble::sha256_hex(&text);
    *tools = reference(&sha);
    texts.push(sha, text);
    Ok(())
}

/// A request body (raw JSON text) with its top-level `tools` array moved into `texts`; `None`
/// when it has none to move. Reads the body's top level only: its values stay raw text.
pub(super) fn body_by_ref(
    body: &RawValue,
    texts: &mut Texts,
) -> Result<Option<Box<RawValue>>, serde_json::Error> {
    let mut fields: BTreeMap<String, &RawValue> = serde_json::from_str(body.get())?;
    let Some(tools) = fields.get(KEY).filter(|t| t.get().starts_with('[')) else {
        return Ok(None);
    };
    let text = tools.get().to_owned();
    if text.len() < MIN_BY_REF {
        return Ok(None);
    }
    let sha = crate::assemble::sha256_hex(&text);
    let refer = RawValue::from_string(reference(&sha).to_string())?;
    fields.insert(KEY.to_owned(), &refer);
    let packed = RawValue::from_string(serde_json::to_string(&fields)?)?;
    texts.push(sha, text);
    Ok(Some(packed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> Value {
        let tool = |n: &str| {
            json!({"type": "function", "name": n, "parameters": {"type": "object",
            "properties": {"path": {"type": "string", "description": "a workspace path"}}}})
        };
        json!([tool("read_file"), tool("write_file"), tool("run_tests")])
    }

    #[test]
    fn a_response_keeps_its_tools_by_reference_and_short_ones_inline() {
        let mut texts = Texts::default();
        let mut response = json!({"id": "resp_1", "tools": tools(), "output": []});
        value_by_ref(&mut response, &mut texts).unwrap();
        assert_eq!(texts.keys.len(), 1);
        assert_eq!(response["tools"]["aptix_text_ref"], texts.keys[0].as_str());
        assert_eq!(serde_json::from_str::<Value>(&texts.bodies[0]).unwrap(), tools());
        let mut short = json!({"tools": [{"type": "web_search"}]});
        value_by_ref(&mut short, &mut texts).unwrap();
        assert!(short["tools"].is_array() && texts.keys.len() == 1);
    }

    #[test]
    fn a_body_keeps_its_tools_by_reference_and_the_rest_as_sent() {
        let sent = json!({"model": "m", "input": [{"role": "user", "content": "hi"}],
                          "tools": tools(), "stream": true});
        let raw = RawValue::from_string(sent.to_string()).unwrap();
        let mut texts = Texts::default();
        let packed = body_by_ref(&raw, &mut texts).unwrap().expect("packed");
        let mut back: Value = serde_json::from_str(packed.get()).unwrap();
        assert_eq!(back["tools"]["aptix_text_ref"], texts.keys[0].as_str());
        back["tools"] = serde_json::from_str(&texts.bodies[0]).unwrap();
        assert_eq!(back, sent);
        let none = RawValue::from_string(r#"{"model":"m","input":[]}"#.into()).unwrap();
        assert!(body_by_ref(&none, &mut texts).unwrap().is_none());
    }
}
