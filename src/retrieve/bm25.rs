//! BM25 sparse vectors for code, computed client-side so documents and queries always share one
//! tokenizer in both backends; Qdrant multiplies in IDF at query time (`Modifier::Idf`).
//!
//! The recipe is Qdrant's own BM25 with its English defaults (Qdrant Edge's `EdgeBm25`, Qdrant's
//! server-side `Bm25` inference): split on non-alphanumerics, lower-case, drop NLTK's English stop
//! words, Snowball English stemming, term id = `|murmur3_32(token) as i32|`, and document weights
//! `tf·(k1+1) / (tf + k1·(1 − b + b·len/avg))`. It is built here from the same parts (the Snowball
//! stemmer crate Qdrant publishes, murmur3, NLTK's list) rather than through `qdrant-edge`, so a
//! build for a Qdrant server does not compile the embedded engine; with the `embedded-store`
//! feature a test checks vector-for-vector equality with `EdgeBm25`, so collections indexed by
//! earlier versions keep matching their queries.
//!
//! Qdrant's word tokenizer keeps `HashMap` as one token `hashmap`, but code search needs its parts
//! too: before tokenizing, every mixed-case identifier is followed by its camel-case parts
//! (`HashMap` → `HashMap Hash Map`), for documents and queries alike.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use murmur3_32::Murmur3;
use rust_stemmers::{Algorithm, Stemmer};

/// Average chunk length in tokens after identifier expansion, measured on the evaluation corpus;
/// BM25's length normalisation is relative to it. Changing it changes every document vector, so
/// it is a constant rather than a setting.
pub const AVG_DOC_TOKENS: f64 = 180.0;
/// Term-frequency saturation (Qdrant's default).
const K1: f64 = 1.2;
/// Length normalisation (Qdrant's default).
const B: f64 = 0.75;

/// A sparse vector: sorted-or-not term ids and their weights.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SparseVec {
    /// Term ids (murmur3 of the token).
    pub indices: Vec<u32>,
    /// Weights, one per id.
    pub values: Vec<f32>,
}

/// The shared BM25 encoder. Clones share one model.
#[derive(Clone)]
pub struct Bm25Encoder {
    inner: Arc<Model>,
}

struct Model {
    stopwords: HashSet<String>,
    stemmer: Stemmer,
}

impl std::fmt::Debug for Bm25Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bm25Encoder").field("stopwords", &self.inner.stopwords.len()).finish()
    }
}

impl Default for Bm25Encoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Bm25Encoder {
    /// Builds the encoder: English stop words and stemming, lower-case, k=1.2, b=0.75.
    pub fn new() -> Self {
        // NLTK's list, as Qdrant's (the crate's `iso` lists are other, longer ones).
        let stopwords = stop_words::get("en").iter().map(|w| w.to_lowercase()).collect();
        let stemmer = Stemmer::create(Algorithm::English);
        Bm25Encoder { inner: Arc::new(Model { stopwords, stemmer }) }
    }

    /// Vector of a document (a chunk): BM25 term-frequency weights. The path is part of the
    /// document so that file and directory names are searchable.
    pub fn document(&self, path: &str, text: &str) -> SparseVec {
        let mut doc = String::with_capacity(path.len() + text.len() + 1);
        doc.push_str(path);
        doc.push('\n');
        doc.push_str(text);
        let expanded = expand_identifiers(&doc);
        let tokens = self.tokens(&expanded);
        if tokens.is_empty() {
            return SparseVec::default();
        }
        let mut counts: HashMap<&str, u32> = HashMap::new();
        for token in &tokens {
            *counts.entry(token.as_ref()).or_insert(0) += 1;
        }
        let doc_len = tokens.len() as f64;
        // Ordered by id, and a colliding id keeps one weight, as Qdrant's own encoder does.
        let weights: BTreeMap<u32, f32> = counts
            .into_iter()
            .map(|(token, n)| (token_id(token), term_weight(f64::from(n), doc_len)))
            .collect();
        let (indices, values) = weights.into_iter().unzip();
        SparseVec { indices, values }
    }

    /// Vector of a query: each distinct term with weight 1.
    pub fn query(&self, text: &str) -> SparseVec {
        let expanded = expand_identifiers(text);
        let mut indices: Vec<u32> = self.tokens(&expanded).iter().map(|t| token_id(t)).collect();
        indices.sort_unstable();
        indices.dedup();
        let values = vec![1.0; indices.len()];
        SparseVec { indices, values }
    }

    /// Word tokens: lower-cased, stop words dropped, stemmed.
    fn tokens<'a>(&self, text: &'a str) -> Vec<Cow<'a, str>> {
        text.split(|c: char| !c.is_alphanumeric())
            .filter(|word| !word.is_empty())
            .filter_map(|word| {
                let lower = word.to_lowercase();
                if self.inner.stopwords.contains(&lower) {
                    return None;
                }
                Some(self.inner.stemmer.stem_cow(Cow::Owned(lower)))
            })
            .collect()
    }
}

/// BM25's saturated, length-normalised term frequency (the IDF factor is Qdrant's, at query time).
fn term_weight(n: f64, doc_len: f64) -> f32 {
    let tf = n * (K1 + 1.0);
    (tf / K1.mul_add(1.0 - B + B * doc_len / AVG_DOC_TOKENS, n)) as f32
}

/// A token's sparse-vector id, as Qdrant computes it: murmur3 (seed 0) read as `i32`, made positive.
fn token_id(token: &str) -> u32 {
    (Murmur3::hash(0, token.as_bytes()) as i32).unsigned_abs()
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
mod tests;
