//! BM25 sparse vectors for code, computed client-side so documents and queries always share one
//! tokenizer in both backends; Qdrant multiplies in IDF at query time (`Modifier::Idf`).
//!
//! Qdrant's word tokenizer splits on non-alphanumerics and lower-cases, so `parse_config` becomes
//! `parse` + `config`, but `HashMap` stays one token `hashmap`. Code search needs both: before
//! tokenizing, every mixed-case identifier is followed by its camel-case parts (`HashMap` →
//! `HashMap Hash Map`), for documents and queries alike.

use std::borrow::Cow;

use qdrant_edge::bm25_embed::{EdgeBm25, EdgeBm25Config};
use qdrant_edge::external::ordered_float::NotNan;

use super::RetrieveError;

/// Average chunk length in tokens after identifier expansion, measured on the evaluation corpus;
/// BM25's length normalisation is relative to it. Changing it changes every document vector, so
/// it is a constant rather than a setting.
pub const AVG_DOC_TOKENS: f64 = 180.0;

/// A sparse vector: sorted-or-not term ids and their weights.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SparseVec {
    /// Term ids (murmur3 of the token).
    pub indices: Vec<u32>,
    /// Weights, one per id.
    pub values: Vec<f32>,
}

/// The shared BM25 encoder. Clones share one model.
#[derive(Debug, Clone)]
pub struct Bm25Encoder {
    inner: std::sync::Arc<EdgeBm25>,
}

impl Bm25Encoder {
    /// Builds the encoder: English stop words and stemming, lower-case, k=1.2, b=0.75.
    pub fn new() -> Result<Self, RetrieveError> {
        let avg = NotNan::new(AVG_DOC_TOKENS).map_err(|e| RetrieveError::Config(e.to_string()))?;
        let config = EdgeBm25Config { avg_len: avg, ..EdgeBm25Config::default() };
        let inner =
            EdgeBm25::new(config).map_err(|e| RetrieveError::Config(format!("bm25: {e}")))?;
        Ok(Bm25Encoder { inner: std::sync::Arc::new(inner) })
    }

    /// Vector of a document (a chunk): BM25 term-frequency weights. The path is part of the
    /// document so that file and directory names are searchable.
    pub fn document(&self, path: &str, text: &str) -> SparseVec {
        let mut doc = String::with_capacity(path.len() + text.len() + 1);
        doc.push_str(path);
        doc.push('\n');
        doc.push_str(text);
        let sv = self.inner.embed_document(&expand_identifiers(&doc));
        SparseVec { indices: sv.indices, values: sv.values }
    }

    /// Vector of a query: each distinct term with weight 1.
    pub fn query(&self, text: &str) -> SparseVec {
        let sv = self.inner.embed_query(&expand_identifiers(text));
        SparseVec { indices: sv.indices, values: sv.values }
    }
}

/// Appends the camel-case parts after every identifier that has them.
pub fn expand_identifiers(text: &str) -> Cow<'_, str> {
    let mut out: Option<String> = None;
    let mut last = 0;
    for (start, word) in words(text) {
        let parts = camel_parts(word);
        if parts.len() < 2 {
            continue;
        }
        let buf = out.get_or_insert_with(|| String::with_capacity(text.len() + text.len() / 4));
        let end = start + word.len();
        buf.push_str(&text[last..end]);
        for p in parts {
            buf.push(' ');
            buf.push_str(p);
        }
        last = end;
    }
    match out {
        None => Cow::Borrowed(text),
        Some(mut buf) => {
            buf.push_str(&text[last..]);
            Cow::Owned(buf)
        }
    }
}

/// Maximal alphanumeric runs with their byte offsets.
fn words(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut rest = text.char_indices().peekable();
    std::iter::from_fn(move || {
        while let Some(&(_, c)) = rest.peek() {
            if c.is_alphanumeric() {
                break;
            }
            rest.next();
        }
        let (start, _) = *rest.peek()?;
        let mut end = start;
        while let Some(&(i, c)) = rest.peek() {
            if !c.is_alphanumeric() {
                break;
            }
            end = i + c.len_utf8();
            rest.next();
        }
        Some((start, &text[start..end]))
    })
}

/// Splits `HTTPServerError2` into `HTTP`, `Server`, `Error2`; a word without case changes stays whole.
fn camel_parts(word: &str) -> Vec<&str> {
    let chars: Vec<(usize, char)> = word.char_indices().collect();
    let mut parts = Vec::new();
    let mut start = 0;
    for w in 1..chars.len() {
        let (i, c) = chars[w];
        let prev = chars[w - 1].1;
        let next_lower = chars.get(w + 1).is_some_and(|&(_, n)| n.is_lowercase());
        let boundary = (prev.is_lowercase() && c.is_uppercase())
            || (prev.is_uppercase() && c.is_uppercase() && next_lower)
            || (prev.is_numeric() && c.is_uppercase());
        if boundary {
            parts.push(&word[start..i]);
            start = i;
        }
    }
    parts.push(&word[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camel_case_identifiers_are_expanded() {
        assert_eq!(expand_identifiers("let m: HashMap<K, V>;"), "let m: HashMap Hash Map<K, V>;");
        assert_eq!(expand_identifiers("HTTPServer x"), "HTTPServer HTTP Server x");
        assert_eq!(expand_identifiers("plain snake_case"), "plain snake_case");
        assert!(matches!(expand_identifiers("nothing here"), Cow::Borrowed(_)));
    }

    #[test]
    fn query_terms_hit_document_terms() {
        let enc = Bm25Encoder::new().unwrap();
        let doc = enc.document("src/map.rs", "pub struct HashMap { table: RawTable }");
        let q = enc.query("hash map table");
        let hits = q.indices.iter().filter(|i| doc.indices.contains(i)).count();
        assert_eq!(hits, 3, "doc {doc:?} query {q:?}");
    }
}
