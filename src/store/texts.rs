//! Texts stored once, by content: the chunks and files a session state keeps for rehydration
//! (`history.chunks[].text`, `history.files[].text`), and those a saved provider answer keeps
//! for reprocessing (`job.assembled.update.chunks[].text`, `.files[].text`), go to
//! `session_texts` under the SHA-256 of the text, and the stored JSON holds `text_ref` instead.
//! Reading puts them back, so callers see the JSON they wrote. JSON without `texts_by_ref`
//! (written before) is read as it is. A session state is packed by its own type
//! (`assemble::PackedState`, which also keeps each text's length); this module writes its new
//! texts and reads any state back with its texts in place.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value};
use sqlx::PgConnection;

use super::StoreError;
use crate::assemble::PackedState;

/// Bytes of text the process keeps at most ([`TextCache`]).
const CACHE_BYTES: u64 = 32 << 20;

/// Texts this process knows to be committed in `session_texts`, by SHA-256: those it read, and
/// those a statement of its own stored. A text never changes under its key and is never
/// deleted, so an entry never goes stale: a turn reads its session's texts from here instead of
/// PostgreSQL (assemble and persist each read the whole history's), and does not insert again
/// what is here. Bounded by [`CACHE_BYTES`]; what falls out is read from PostgreSQL again.
#[derive(Clone)]
pub(super) struct TextCache(Arc<quick_cache::sync::Cache<String, Arc<str>, TextBytes>>);

/// Weighs an entry by its bytes.
#[derive(Clone)]
pub(super) struct TextBytes;

impl quick_cache::Weighter<String, Arc<str>> for TextBytes {
    fn weight(&self, key: &String, text: &Arc<str>) -> u64 {
        (key.len() + text.len()) as u64
    }
}

impl Default for TextCache {
    fn default() -> Self {
        // Estimated entries: chunks of about 1 KB.
        let cache = quick_cache::sync::Cache::with_weighter(32_768, CACHE_BYTES, TextBytes);
        TextCache(Arc::new(cache))
    }
}

impl std::fmt::Debug for TextCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextCache").field("bytes", &self.0.weight()).finish()
    }
}

impl TextCache {
    fn get(&self, sha: &str) -> Option<Arc<str>> {
        self.0.get(sha)
    }

    pub(super) fn holds(&self, sha: &str) -> bool {
        self.0.contains_key(sha)
    }

    /// Keeps texts that are committed in `session_texts`.
    pub(super) fn keep(&self, texts: &Texts) {
        for (sha, body) in texts.keys.iter().zip(&texts.bodies) {
            self.0.insert(sha.clone(), Arc::from(body.as_str()));
        }
    }
}

/// Marks stored JSON whose texts are references.
const MARK: &str = "texts_by_ref";

/// The lists of a holder whose entries carry a `text`.
const LISTS: [&str; 2] = ["chunks", "files"];

/// Which stored JSON, and so where its text lists are.
#[derive(Debug, Clone, Copy)]
pub(super) enum Holder {
    /// A session state (`sessions.state`): `history`.
    State,
    /// A saved provider answer (`llm_results.result`): `job.assembled.update`.
    SavedAnswer,
}

impl Holder {
    fn path(self) -> &'static [&'static str] {
        match self {
            Holder::State => &["history"],
            Holder::SavedAnswer => &["job", "assembled", "update"],
        }
    }
}

/// Texts taken out of stored JSON, to insert into `session_texts` (sorted by key: two
/// transactions inserting the same texts then lock them in one order and cannot deadlock).
#[derive(Debug, Default)]
pub(super) struct Texts {
    pub keys: Vec<String>,
    pub bodies: Vec<String>,
}

impl Texts {
    /// Adds a text, once per key.
    pub(super) fn push(&mut self, key: String, body: String) {
        if !self.keys.contains(&key) {
            self.keys.push(key);
            self.bodies.push(body);
        }
    }

    /// Sorts the texts by key: the order an insert locks them in.
    pub(super) fn sort(&mut self) {
        let pairs =
            std::mem::take(&mut self.keys).into_iter().zip(std::mem::take(&mut self.bodies));
        let mut pairs: Vec<(String, String)> = pairs.collect();
        pairs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        (self.keys, self.bodies) = pairs.into_iter().unzip();
    }

    /// Adds `other`'s texts, once per key, and sorts them.
    pub(super) fn absorb(&mut self, other: Texts) {
        for (key, body) in other.keys.into_iter().zip(other.bodies) {
            self.push(key, body);
        }
        self.sort();
    }

    /// Keeps the texts whose key passes `keep`.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        let pairs =
            std::mem::take(&mut self.keys).into_iter().zip(std::mem::take(&mut self.bodies));
        (self.keys, self.bodies) = pairs.filter(|(k, _)| keep(k)).unzip();
    }
}

/// `value` with its texts replaced by references, and the texts.
pub(super) fn take_texts(value: Value, holder: Holder) -> (Value, Texts) {
    let mut packed = value;
    let mut texts: HashMap<String, String> = HashMap::new();
    for entry in entries(&mut packed, holder) {
        if let Some(Value::String(text)) = entry.remove("text") {
            let sha = crate::assemble::sha256_hex(&text);
            entry.insert("text_ref".into(), Value::String(sha.clone()));
            texts.insert(sha, text);
        }
    }
    if let Value::Object(map) = &mut packed {
        map.insert(MARK.into(), Value::Bool(true));
    }
    let (keys, bodies) = texts.into_iter().unzip();
    let mut texts = Texts { keys, bodies };
    texts.sort();
    (packed, texts)
}

/// The texts a session `state` holds that are not known to be stored (those sent this turn),
/// made references in it; of them, those to write: the ones the `cache` (which holds only
/// stored texts) lacks. Texts the state read by reference are stored already: neither hashed
/// again nor written.
pub(super) fn pack(cache: &TextCache, state: &mut PackedState) -> Texts {
    // Serialised once, when it is bound to the statement that writes it.
    crate::metrics::metrics().json("serialize", "session_state");
    let new = state.take_new_texts().into_iter().filter(|(sha, _)| !cache.holds(sha));
    let (keys, bodies) = new.unzip();
    let mut texts = Texts { keys, bodies };
    texts.sort();
    texts
}

/// The JSON as written: its texts put back from `texts` (by SHA-256).
pub(super) fn unpack(
    mut value: Value,
    texts: &Map<String, Value>,
    holder: Holder,
) -> Result<Value, StoreError> {
    let Some(Value::Bool(true)) = value.as_object_mut().and_then(|m| m.remove(MARK)) else {
        return Ok(value);
    };
    for entry in entries(&mut value, holder) {
        let Some(Value::String(sha)) = entry.remove("text_ref") else { continue };
        entry.remove("text_chars");
        let Some(text) = texts.get(&sha) else {
            let e = format!("stored JSON references text {sha}, which is not stored");
            return Err(StoreError::Corrupt(serde::de::Error::custom(e)));
        };
        entry.insert("text".into(), text.clone());
    }
    Ok(value)
}

/// The entries of the holder's `chunks` and `files`.
fn entries(value: &mut Value, holder: Holder) -> impl Iterator<Item = &mut Map<String, Value>> {
    let lists = holder
        .path()
        .iter()
        .try_fold(value, |v, key| v.get_mut(*key))
        .and_then(Value::as_object_mut);
    lists
        .into_iter()
        .flat_map(|h| h.iter_mut())
        .filter(|(k, _)| LISTS.contains(&k.as_str()))
        .filter_map(|(_, v)| v.as_array_mut())
        .flat_map(|list| list.iter_mut())
        .filter_map(Value::as_object_mut)
}

/// The texts `value` references, by SHA-256: from the `cache`, the rest with one indexed lookup
/// (nothing when it holds its texts inline, as JSON written before did).
pub(super) async fn referenced(
    conn: &mut PgConnection,
    cache: &TextCache,
    value: &mut Value,
    holder: Holder,
) -> Result<Map<String, Value>, StoreError> {
    let (mut found, missing) = cached(cache, value, holder);
    fetch(conn, cache, missing, &mut found).await?;
    Ok(found)
}

/// The texts `value` references that the `cache` holds, and the keys of those it does not.
fn cached(
    cache: &TextCache,
    value: &mut Value,
    holder: Holder,
) -> (Map<String, Value>, Vec<String>) {
    if value.get(MARK) != Some(&Value::Bool(true)) {
        return (Map::new(), Vec::new());
    }
    let keys = entries(value, holder).filter_map(|e| e.get("text_ref").and_then(Value::as_str));
    let (found, missing) = from_cache(cache, keys);
    let found = found.into_iter().map(|(sha, text)| (sha, Value::String(text.to_string())));
    (found.collect(), missing)
}

/// The texts under `keys` that the `cache` holds, and the keys of those it does not.
fn from_cache<'k>(
    cache: &TextCache,
    keys: impl Iterator<Item = &'k str>,
) -> (HashMap<String, Arc<str>>, Vec<String>) {
    let mut found = HashMap::new();
    let mut missing = Vec::new();
    for key in keys {
        match cache.get(key) {
            Some(text) => drop(found.insert(key.to_owned(), text)),
            None => missing.push(key.to_owned()),
        }
    }
    (found, missing)
}

/// Reads the `missing` texts into `found` (and the cache) with one indexed lookup.
async fn fetch(
    conn: &mut PgConnection,
    cache: &TextCache,
    missing: Vec<String>,
    found: &mut Map<String, Value>,
) -> Result<(), StoreError> {
    let read = fetch_texts(conn, cache, missing).await?;
    found.extend(read.keys.into_iter().zip(read.bodies.into_iter().map(Value::String)));
    Ok(())
}

/// The `missing` texts (kept in the cache too), with one indexed lookup.
async fn fetch_texts(
    conn: &mut PgConnection,
    cache: &TextCache,
    missing: Vec<String>,
) -> Result<Texts, StoreError> {
    if missing.is_empty() {
        return Ok(Texts::default());
    }
    let rows =
        sqlx::query!("SELECT sha256, body FROM session_texts WHERE sha256 = ANY($1)", &missing)
            .fetch_all(&mut *conn)
            .await?;
    let (keys, bodies) = rows.into_iter().map(|r| (r.sha256, r.body)).unzip();
    let read = Texts { keys, bodies };
    cache.keep(&read);
    Ok(read)
}

/// The texts under `keys`: from the `cache`, the rest with one indexed lookup on a connection
/// taken only then.
pub(super) async fn bodies<'k>(
    pool: &sqlx::PgPool,
    cache: &TextCache,
    keys: impl Iterator<Item = &'k str>,
) -> Result<HashMap<String, Arc<str>>, StoreError> {
    let (mut found, missing) = from_cache(cache, keys);
    if !missing.is_empty() {
        let mut conn = pool.acquire().await?;
        let read = fetch_texts(&mut conn, cache, missing).await?;
        found.extend(read.keys.into_iter().zip(read.bodies.into_iter().map(Arc::from)));
    }
    Ok(found)
}

/// A packed session state with its texts in place, from [`bodies`]; a text it references that
/// is not stored makes it corrupt, as in [`unpack`].
pub(super) fn in_place(
    state: PackedState,
    texts: &HashMap<String, Arc<str>>,
) -> Result<crate::assemble::SessionState, StoreError> {
    state.with_texts(|key| texts.get(key).map(|t| t.to_string())).map_err(|sha| {
        let e = format!("stored JSON references text {sha}, which is not stored");
        StoreError::Corrupt(serde::de::Error::custom(e))
    })
}

/// `value` with its texts read back in place.
pub(super) async fn read(
    conn: &mut PgConnection,
    cache: &TextCache,
    mut value: Value,
    holder: Holder,
) -> Result<Value, StoreError> {
    let texts = referenced(conn, cache, &mut value, holder).await?;
    unpack(value, &texts, holder)
}

/// A session state with its texts read back in place, as [`read`] does, taking a connection
/// only for texts the `cache` lacks (a turn's texts nearly always are there).
pub(super) async fn read_pooled(
    pool: &sqlx::PgPool,
    cache: &TextCache,
    mut value: Value,
) -> Result<Value, StoreError> {
    let holder = Holder::State;
    let (mut texts, missing) = cached(cache, &mut value, holder);
    if !missing.is_empty() {
        let mut conn = pool.acquire().await?;
        fetch(&mut conn, cache, missing, &mut texts).await?;
    }
    unpack(value, &texts, holder)
}

/// A saved provider answer (`llm_results.result`) with its texts read back in place.
pub(super) async fn read_saved(
    conn: &mut PgConnection,
    cache: &TextCache,
    saved: Value,
) -> Result<Value, StoreError> {
    read(conn, cache, saved, Holder::SavedAnswer).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unpacking_restores_what_was_packed_and_leaves_old_states_alone() {
        let old = json!({"v": 1, "history": {"chunks": [{"id": "a", "text": "fn a() {}"}]}});
        assert_eq!(unpack(old.clone(), &Map::new(), Holder::State).unwrap(), old);
        let sha = crate::assemble::sha256_hex("fn a() {}");
        let packed = json!({"v": 1, "texts_by_ref": true,
                            "history": {"chunks": [{"id": "a", "text_ref": sha}], "files": []}});
        let texts: Map<String, Value> = [(sha.clone(), json!("fn a() {}"))].into_iter().collect();
        let back = unpack(packed.clone(), &texts, Holder::State).unwrap();
        assert_eq!(back["history"]["chunks"][0]["text"], "fn a() {}");
        assert!(back.get(MARK).is_none());
        assert!(
            unpack(packed, &Map::new(), Holder::State).is_err(),
            "a missing text is corrupt, not empty"
        );
    }

    #[test]
    fn absorbed_texts_are_sorted_once_each_and_keep_their_bodies() {
        let texts = |pairs: &[(&str, &str)]| Texts {
            keys: pairs.iter().map(|p| p.0.to_owned()).collect(),
            bodies: pairs.iter().map(|p| p.1.to_owned()).collect(),
        };
        let mut ours = texts(&[("b", "body b"), ("d", "body d")]);
        ours.absorb(texts(&[("c", "body c"), ("b", "body b"), ("a", "body a")]));
        assert_eq!(ours.keys, ["a", "b", "c", "d"]);
        assert_eq!(ours.bodies, ["body a", "body b", "body c", "body d"]);
    }

    #[test]
    fn a_saved_answer_keeps_its_update_texts_by_reference() {
        let saved = json!({"v": 2, "job": {"assembled": {"update": {
            "chunks": [{"id": "a", "text": "fn a() {}"}, {"id": "b", "text": "fn a() {}"}],
            "files": [{"path": "x.rs", "text": "fn x() {}"}]}}}});
        let (packed, texts) = take_texts(saved.clone(), Holder::SavedAnswer);
        assert_eq!(texts.keys.len(), 2, "each text once");
        assert!(texts.keys.windows(2).all(|w| w[0] < w[1]), "sorted");
        let update = &packed["job"]["assembled"]["update"];
        assert!(
            update["chunks"][0].get("text").is_none() && update["files"][0]["text_ref"].is_string()
        );
        let stored: Map<String, Value> =
            texts.keys.into_iter().zip(texts.bodies.into_iter().map(Value::String)).collect();
        assert_eq!(unpack(packed, &stored, Holder::SavedAnswer).unwrap(), saved);
    }
}
