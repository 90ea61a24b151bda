//! The streamed form of a response: the real event sequence, each frame `event: <type>` plus
//! `data: <json>` with a `sequence_number` from 0, and no `[DONE]` sentinel.
//!
//! `response.created` → `response.in_progress` → per item `response.output_item.added` →
//! (text: `content_part.added`, `output_text.delta`×N, `output_text.done`, `content_part.done`;
//! refusal: the same with `refusal.*`; function call: `function_call_arguments.delta`×N,
//! `function_call_arguments.done`) → `response.output_item.done` → `response.completed` |
//! `response.incomplete` | `response.failed`.

use bytes::Bytes;
use serde_json::{json, Value};

use super::response::{item, refusal_part, status_str, text_part};
use super::script::{Item, Reply, Status};

struct Frames {
    seq: u64,
    out: Vec<Bytes>,
}

impl Frames {
    /// Appends an event whose other fields are `fields`, a JSON object written without its
    /// braces (so a response serialized once can be spliced in, and no map is built per event).
    fn push_raw(&mut self, kind: &str, fields: &str) {
        let sep = if fields.is_empty() { "" } else { "," };
        let frame = format!(
            "event: {kind}\ndata: {{\"type\":\"{kind}\",\"sequence_number\":{}{sep}{fields}}}\n\n",
            self.seq
        );
        self.seq += 1;
        self.out.push(Bytes::from(frame));
    }

    fn push(&mut self, kind: &str, fields: Value) {
        let text = fields.to_string();
        let inner = text.strip_prefix('{').and_then(|t| t.strip_suffix('}')).unwrap_or_default();
        self.push_raw(kind, inner);
    }
}

/// Splits `text` into pieces of at most `n` characters (the simulated tokens).
fn pieces(text: &str, n: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let cut = rest.char_indices().nth(n).map_or(rest.len(), |(i, _)| i);
        out.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    out
}

/// Every event frame of `reply`, whose complete response object is `response` and its
/// serialized form `response_json`.
pub(crate) fn events(
    reply: &Reply,
    response: &Value,
    response_json: &str,
    delta_chars: usize,
) -> Vec<Bytes> {
    let mut f = Frames { seq: 0, out: Vec::new() };
    let mut shell = response.clone();
    if let Some(obj) = shell.as_object_mut() {
        for (key, value) in [
            ("status", json!("in_progress")),
            ("output", json!([])),
            ("usage", Value::Null),
            ("completed_at", Value::Null),
            ("error", Value::Null),
            ("incomplete_details", Value::Null),
        ] {
            obj.insert(key.into(), value);
        }
    }
    let shell = format!("\"response\":{shell}");
    f.push_raw("response.created", &shell);
    f.push_raw("response.in_progress", &shell);
    let item_status =
        if matches!(reply.status, Status::Incomplete(_)) { "incomplete" } else { "completed" };
    for (index, it) in reply.items.iter().enumerate() {
        f.push(
            "response.output_item.added",
            json!({"output_index": index, "item": item(it, None)}),
        );
        match it {
            Item::Reasoning { .. } => {}
            Item::Message { id, text } | Item::Refusal { id, text } => {
                let refusal = matches!(it, Item::Refusal { .. });
                let (empty, full) = if refusal {
                    (refusal_part(""), refusal_part(text))
                } else {
                    (text_part(""), text_part(text))
                };
                let with = |mut extra: Value| {
                    if let Some(o) = extra.as_object_mut() {
                        o.insert("item_id".into(), json!(id));
                        o.insert("output_index".into(), json!(index));
                        o.insert("content_index".into(), json!(0));
                    }
                    extra
                };
                f.push("response.content_part.added", with(json!({ "part": empty })));
                let kind = if refusal { "response.refusal" } else { "response.output_text" };
                for piece in pieces(text, delta_chars) {
                    let extra = if refusal {
                        json!({"delta": piece})
                    } else {
                        json!({"delta": piece, "logprobs": []})
                    };
                    f.push(&format!("{kind}.delta"), with(extra));
                }
                let done = if refusal {
                    json!({"refusal": text})
                } else {
                    json!({"text": text, "logprobs": []})
                };
                f.push(&format!("{kind}.done"), with(done));
                f.push("response.content_part.done", with(json!({ "part": full })));
            }
            Item::Call { id, name, arguments, .. } => {
                for piece in pieces(arguments, delta_chars) {
                    f.push(
                        "response.function_call_arguments.delta",
                        json!({"item_id": id, "output_index": index, "delta": piece}),
                    );
                }
                f.push(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "name": name, "output_index": index, "arguments": arguments}),
                );
            }
        }
        f.push(
            "response.output_item.done",
            json!({"output_index": index, "item": item(it, Some(item_status))}),
        );
    }
    let terminal = format!("response.{}", status_str(reply.status));
    f.push_raw(&terminal, &format!("\"response\":{response_json}"));
    f.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_respect_char_boundaries() {
        assert_eq!(pieces("héllo wörld", 4), vec!["héll", "o wö", "rld"]);
        assert!(pieces("", 4).is_empty());
    }
}
