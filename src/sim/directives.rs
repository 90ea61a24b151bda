//! Directives that steer the simulated model, parsed from the instruction text, and sample
//! tool arguments generated from a JSON Schema.
//!
//! `@call(name)`, `@call(name, {json args})`, `@call(*)`, `@refuse`, `@incomplete`, `@fail`. A
//! directive is an `@` followed by a whole word (`@failure` is not `@fail`).

use serde_json::{json, Value};

#[derive(Debug, PartialEq)]
pub(crate) enum Directive {
    Call(String, Option<String>),
    Refuse,
    Incomplete,
    Fail,
}

pub(crate) fn directives(text: &str) -> Vec<Directive> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(pos) = rest.find('@') {
        rest = &rest[pos + 1..];
        let word_end =
            rest.find(|c: char| !c.is_ascii_alphanumeric() && c != '_').unwrap_or(rest.len());
        match &rest[..word_end] {
            "refuse" => out.push(Directive::Refuse),
            "incomplete" => out.push(Directive::Incomplete),
            "fail" => out.push(Directive::Fail),
            "call" if rest[word_end..].starts_with('(') => {
                let r = &rest[word_end + 1..];
                let Some(end) = r.find([',', ')']) else { break };
                let name = r[..end].trim().to_owned();
                let mut args = None;
                if r[end..].starts_with(',') {
                    let after = r[end + 1..].trim_start();
                    let mut values = serde_json::Deserializer::from_str(after).into_iter::<Value>();
                    if let Some(Ok(v)) = values.next() {
                        args = Some(v.to_string());
                        rest = &after[values.byte_offset()..];
                    }
                }
                out.push(Directive::Call(name, args));
                continue;
            }
            _ => {}
        }
        rest = &rest[word_end..];
    }
    out
}

/// A plausible value for a JSON Schema: required properties filled, first enum value, first
/// non-null type.
pub(crate) fn sample(schema: &Value) -> Value {
    if let Some(first) = schema.get("enum").and_then(Value::as_array).and_then(|e| e.first()) {
        return first.clone();
    }
    let kind = match schema.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(ts)) => {
            ts.iter().filter_map(Value::as_str).find(|t| *t != "null").unwrap_or("null")
        }
        _ if schema.get("properties").is_some() => "object",
        _ => "null",
    };
    match kind {
        "string" => json!("sample"),
        "integer" | "number" => json!(1),
        "boolean" => json!(true),
        "array" => json!([]),
        "object" => {
            let mut obj = serde_json::Map::new();
            let required = schema.get("required").and_then(Value::as_array).into_iter().flatten();
            for name in required.filter_map(Value::as_str) {
                let prop = schema.pointer(&format!("/properties/{name}")).unwrap_or(&Value::Null);
                obj.insert(name.to_owned(), sample(prop));
            }
            Value::Object(obj)
        }
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_directives() {
        let d = directives(
            r#"please @call(read_file, {"path":"a)b"}) then @call( * ) and @refuse, not @failure"#,
        );
        assert_eq!(
            d,
            vec![
                Directive::Call("read_file".into(), Some(r#"{"path":"a)b"}"#.into())),
                Directive::Call("*".into(), None),
                Directive::Refuse,
            ]
        );
    }

    #[test]
    fn samples_schemas() {
        let schema = json!({"type":"object","properties":{"path":{"type":"string"},"n":{"type":["null","integer"]},
            "mode":{"enum":["fast","slow"]}},"required":["path","n","mode"]});
        assert_eq!(sample(&schema), json!({"path":"sample","n":1,"mode":"fast"}));
    }
}
