//! What parsing a provider's answer may cost the worker. A JSON document becomes one tree node
//! per value, tens of bytes each, so a body of tiny values (`[0,0,…]`) takes some forty times its
//! size once parsed: a provider's 16 MiB answer of them would take most of a gigabyte of the
//! worker that holds every tenant's calls. Each answer's values are counted on its bytes first,
//! and an answer with more than any real one holds is refused unparsed. A provider may repeat
//! the request in its answer (its tools and instructions, in every response object): what the
//! request holds is allowed on top.

use super::error::LlmError;
use super::retry::AttemptError;

/// Most values one answer (a JSON body, or what a stream keeps: its items and its terminal
/// event) may parse to besides the request's own; a real answer's text is a few strings,
/// whatever its length.
pub(crate) const MAX_ANSWER_NODES: usize = 1 << 18;

/// What one call's answer may parse to: [`MAX_ANSWER_NODES`], plus the request's values when
/// the answer holds more (counted then only: most answers never need it).
pub(crate) struct Bound<'a> {
    request: &'a [u8],
    most: std::sync::OnceLock<usize>,
}

impl<'a> Bound<'a> {
    /// The bound of the answer to `request` (the `/responses` body sent).
    pub(crate) fn new(request: &'a [u8]) -> Self {
        Bound { request, most: std::sync::OnceLock::new() }
    }

    /// The most values the answer may hold.
    pub(crate) fn most(&self) -> usize {
        *self.most.get_or_init(|| MAX_ANSWER_NODES + count(self.request))
    }
}

/// The values `json` parses to, counted without parsing: each string (keys too), number,
/// literal, object and array outside strings.
pub(crate) fn count(json: &[u8]) -> usize {
    let (mut n, mut in_string, mut escaped, mut in_scalar) = (0usize, false, false, false);
    for &b in json {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => (n, in_string, in_scalar) = (n + 1, true, false),
            b'{' | b'[' => (n, in_scalar) = (n + 1, false),
            b',' | b':' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t' => in_scalar = false,
            _ if !in_scalar => (n, in_scalar) = (n + 1, true),
            _ => {}
        }
    }
    n
}

/// `json`'s count of values, or the refusal of an answer with more than `bound` allows.
pub(crate) fn within(json: &[u8], bound: &Bound<'_>) -> Result<usize, AttemptError> {
    let n = count(json);
    if n > MAX_ANSWER_NODES && n > bound.most() {
        return Err(too_many(n, bound.most()));
    }
    Ok(n)
}

/// The refusal of an answer of `n` values, `most` allowed.
pub(crate) fn too_many(n: usize, most: usize) -> AttemptError {
    AttemptError::Fatal(LlmError::InvalidResponse(format!(
        "the answer holds {n} JSON values, more than the {most} its request allows"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_counted_outside_strings_only() {
        assert_eq!(count(b"[0,0,0]"), 4);
        assert_eq!(count(br#"{"a": "b,c[{", "d": [true, null, -1.5e3]}"#), 8);
        assert_eq!(count(br#"["say \"hi\", [x]"]"#), 2);
        assert_eq!(count(b"  12  "), 1);
    }

    #[test]
    fn an_answer_of_tiny_values_is_refused_unparsed() {
        let small = Bound::new(br#"{"input": "hi"}"#);
        let tiny = format!("[{}0]", "0,".repeat(2 * MAX_ANSWER_NODES));
        assert!(within(tiny.as_bytes(), &small).is_err());
        let text = serde_json::json!({"output": [{"text": "x,".repeat(1 << 20)}]}).to_string();
        assert_eq!(within(text.as_bytes(), &small).unwrap(), 6);
        // A request of many tool schemas, repeated in its answer, is allowed on top.
        let large = Bound::new(tiny.as_bytes());
        assert!(within(tiny.as_bytes(), &large).is_ok());
    }
}
