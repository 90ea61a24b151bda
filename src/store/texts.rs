//! A session state's texts stored once, by content: the chunks and files a state keeps for
//! rehydration (`history.chunks[].text`, `history.files[].text`) go to `session_texts` under the
//! SHA-256 of the text, and the state at rest holds `text_ref` instead. Reading puts them back,
//! so callers see the state they wrote. A state without `texts_by_ref` (written before) is read
//! as it is.

use std::collections::HashMap;

use serde_json::{Map, Value};
use sqlx::PgConnection;

use super::StoreError;

/// Marks a state whose texts are references.
const MARK: &str = "texts_by_ref";

/// The lists of a state whose entries carry a `text`.
const LISTS: [&str; 2] = ["chunks", "files"];

/// Moves the texts of `state` out into `session_texts`; returns the state to store.
pub(super) async fn pack(conn: &mut PgConnection, state: &Value) -> Result<Value, StoreError> {
    let mut packed = state.clone();
    let mut texts: HashMap<String, String> = HashMap::new();
    for entry in entries(&mut packed) {
        if let Some(Value::String(text)) = entry.remove("text") {
            let sha = crate::assemble::sha256_hex(&text);
            entry.insert("text_ref".into(), Value::String(sha.clone()));
            texts.insert(sha, text);
        }
    }
    if let Value::Object(map) = &mut packed {
        map.insert(MARK.into(), Value::Bool(true));
    }
    if !texts.is_empty() {
        // In one order everywhere, so two transactions inserting the same texts cannot
        // deadlock on the key.
        let mut texts: Vec<(String, String)> = texts.into_iter().collect();
        texts.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let (keys, bodies): (Vec<String>, Vec<String>) = texts.into_iter().unzip();
        sqlx::query(
            "INSERT INTO session_texts (sha256, body) SELECT * FROM unnest($1::text[], $2::text[])
             ON CONFLICT (sha256) DO NOTHING",
        )
        .bind(&keys)
        .bind(&bodies)
        .execute(&mut *conn)
        .await?;
    }
    Ok(packed)
}

/// The state as written: its texts put back from `texts` (by SHA-256).
pub(super) fn unpack(mut state: Value, texts: &Map<String, Value>) -> Result<Value, StoreError> {
    let Some(Value::Bool(true)) = state.as_object_mut().and_then(|m| m.remove(MARK)) else {
        return Ok(state);
    };
    for entry in entries(&mut state) {
        let Some(Value::String(sha)) = entry.remove("text_ref") else { continue };
        let Some(text) = texts.get(&sha) else {
            let e = format!("session state references text {sha}, which is not stored");
            return Err(StoreError::Corrupt(serde::de::Error::custom(e)));
        };
        entry.insert("text".into(), text.clone());
    }
    Ok(state)
}

/// The entries of `history.chunks` and `history.files`.
fn entries(state: &mut Value) -> impl Iterator<Item = &mut Map<String, Value>> {
    let history = state.get_mut("history").and_then(Value::as_object_mut);
    history
        .into_iter()
        .flat_map(|h| h.iter_mut())
        .filter(|(k, _)| LISTS.contains(&k.as_str()))
        .filter_map(|(_, v)| v.as_array_mut())
        .flat_map(|list| list.iter_mut())
        .filter_map(Value::as_object_mut)
}

/// The texts `state` references, by SHA-256: one indexed lookup (nothing when the state holds
/// its texts inline, as states written before did).
pub(super) async fn referenced(
    conn: &mut PgConnection,
    state: &mut Value,
) -> Result<Map<String, Value>, StoreError> {
    if state.get(MARK) != Some(&Value::Bool(true)) {
        return Ok(Map::new());
    }
    let refs: Vec<String> = entries(state)
        .filter_map(|e| e.get("text_ref").and_then(Value::as_str).map(str::to_owned))
        .collect();
    if refs.is_empty() {
        return Ok(Map::new());
    }
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT sha256, body FROM session_texts WHERE sha256 = ANY($1)")
            .bind(&refs)
            .fetch_all(&mut *conn)
            .await?;
    Ok(rows.into_iter().map(|(k, v)| (k, Value::String(v))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unpacking_restores_what_was_packed_and_leaves_old_states_alone() {
        let old = json!({"v": 1, "history": {"chunks": [{"id": "a", "text": "fn a() {}"}]}});
        assert_eq!(unpack(old.clone(), &Map::new()).unwrap(), old);
        let sha = crate::assemble::sha256_hex("fn a() {}");
        let packed = json!({"v": 1, "texts_by_ref": true,
                            "history": {"chunks": [{"id": "a", "text_ref": sha}], "files": []}});
        let texts: Map<String, Value> = [(sha.clone(), json!("fn a() {}"))].into_iter().collect();
        let back = unpack(packed.clone(), &texts).unwrap();
        assert_eq!(back["history"]["chunks"][0]["text"], "fn a() {}");
        assert!(back.get(MARK).is_none());
        assert!(unpack(packed, &Map::new()).is_err(), "a missing text is corrupt, not empty");
    }
}
