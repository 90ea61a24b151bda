//! The encoder's behaviour, and (with the `embedded-store` feature) its equality with Qdrant
//! Edge's own BM25, vector for vector, on this crate's sources and docs.

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
    let enc = Bm25Encoder::new();
    let doc = enc.document("src/map.rs", "pub struct HashMap { table: RawTable }");
    let q = enc.query("hash map table");
    let hits = q.indices.iter().filter(|i| doc.indices.contains(i)).count();
    assert_eq!(hits, 3, "doc {doc:?} query {q:?}");
}

#[test]
fn stop_words_are_dropped_and_words_stemmed() {
    let enc = Bm25Encoder::new();
    assert_eq!(enc.query("the of and is"), SparseVec::default());
    assert_eq!(enc.query("connections"), enc.query("connection"));
    assert_eq!(enc.query("Parsing"), enc.query("parse"));
    let q = enc.query("retry retry RETRY backoff");
    assert_eq!(q.indices.len(), 2);
    assert!(q.indices.windows(2).all(|w| w[0] < w[1]), "query ids are sorted: {q:?}");
}

#[test]
fn document_weights_saturate_and_normalise_by_length() {
    let enc = Bm25Encoder::new();
    let weight = |doc: &SparseVec, term: &str| {
        let id = enc.query(term).indices[0];
        doc.indices.iter().position(|&i| i == id).map(|p| doc.values[p])
    };
    let once = enc.document("a", "retry");
    let thrice = enc.document("a", "retry retry retry");
    let (w1, w3) = (weight(&once, "retry").unwrap(), weight(&thrice, "retry").unwrap());
    assert!(w3 > w1 && w3 < 3.0 * w1, "saturating: once {w1}, three times {w3}");
    let long = enc.document("a", &format!("retry {}", "filler ".repeat(400)));
    assert!(weight(&long, "retry").unwrap() < w1, "a long document weighs a term less");
}

/// Qdrant Edge's `EdgeBm25` with the settings this crate used before it had its own encoder.
#[cfg(feature = "embedded-store")]
fn edge_encoder() -> qdrant_edge::bm25_embed::EdgeBm25 {
    use qdrant_edge::bm25_embed::{EdgeBm25, EdgeBm25Config};
    use qdrant_edge::external::ordered_float::NotNan;
    let avg_len = NotNan::new(AVG_DOC_TOKENS).unwrap();
    EdgeBm25::new(EdgeBm25Config { avg_len, ..EdgeBm25Config::default() }).unwrap()
}

/// Every file under `dir` with one of `exts`, as (path, text).
#[cfg(feature = "embedded-store")]
fn corpus(dir: &std::path::Path, exts: &[&str], out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            corpus(&path, exts, out);
        } else if path.extension().is_some_and(|e| exts.iter().any(|x| e == *x)) {
            let text = std::fs::read_to_string(&path).unwrap();
            out.push((path.display().to_string(), text));
        }
    }
}

#[cfg(feature = "embedded-store")]
#[test]
fn vectors_equal_qdrant_edge_bm25() {
    let (ours, edge) = (Bm25Encoder::new(), edge_encoder());
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = Vec::new();
    corpus(&root.join("src"), &["rs"], &mut docs);
    corpus(&root.join("docs"), &["md"], &mut docs);
    corpus(&root.join("clients"), &["py"], &mut docs);
    assert!(docs.len() > 100, "corpus of {} files", docs.len());
    // Every stop word alone, and text no source file has: other scripts, case folds, digits.
    let mut words: Vec<String> = stop_words::get("en").iter().map(|w| w.to_string()).collect();
    words.extend(
        [
            "Привет, МИР! Straße İstanbul ǅemal ΣΊΣΥΦΟΣ 東京 42nd 3.14e10 x86_64",
            "don't won't shouldn't you're it's o y ma ll re ve",
            "",
            "   ",
        ]
        .map(String::from),
    );
    docs.extend(words.iter().map(|w| ("w".to_owned(), w.clone())));
    for (path, text) in &docs {
        let expanded = expand_identifiers(&format!("{path}\n{text}")).into_owned();
        let theirs = edge.embed_document(&expanded);
        let mine = ours.document(path, text);
        assert_eq!(mine.indices, theirs.indices, "document ids of {path}");
        assert_eq!(mine.values, theirs.values, "document weights of {path}");
        let theirs = edge.embed_query(&expand_identifiers(text));
        assert_eq!(ours.query(text).indices, theirs.indices, "query ids of {path}");
    }
}
