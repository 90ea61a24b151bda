//! JSON Schema documents (draft 2020-12) for the public contracts, so backends in other
//! languages can check what they send and receive. The committed copies under `schemas/` are
//! kept current by a test (`tests/schemas.rs`) and checked against a corpus of valid and invalid
//! messages (`tests/schema_corpus/`).
//!
//! Each document starts from what schemars generates from the Rust types (property names, types,
//! descriptions) and is then assembled into the shape the contract states, which derive macros
//! cannot express: the request is one of two scenarios (AGN-034 §2), a response carries exactly
//! the buckets its `Kind` allows (AGN-033 §3.4), and an `InvokeResult` is a success with a result
//! or a failure with errors.

mod delta;
mod reply;
mod request;

use schemars::Schema;
use serde_json::{Map, Value};

/// A schema document and the file it is committed as.
#[derive(Debug)]
pub struct SchemaFile {
    /// Name for `aptix schema NAME`.
    pub name: &'static str,
    /// File name under `schemas/`.
    pub file_name: &'static str,
    /// The schema.
    pub schema: Schema,
}

/// Every published schema: the request, the reply (`InvokeResult`) and the stream delta.
pub fn all() -> Vec<SchemaFile> {
    vec![
        SchemaFile {
            name: "request",
            file_name: "agent-execute-request.schema.json",
            schema: request::schema(),
        },
        SchemaFile {
            name: "response",
            file_name: "invoke-result.schema.json",
            schema: reply::schema(),
        },
        SchemaFile { name: "delta", file_name: "reply-delta.schema.json", schema: delta::schema() },
    ]
}

/// The schema published under `name` (`request`, `response` or `delta`).
pub fn named(name: &str) -> Option<SchemaFile> {
    all().into_iter().find(|f| f.name == name)
}

/// The schema rendered as committed: pretty JSON with a trailing newline.
pub fn render(schema: &Schema) -> String {
    let mut text = serde_json::to_string_pretty(schema).unwrap_or_default();
    text.push('\n');
    text
}

/// `SessionId` as clients must write it: a UUID in lowercase hyphenated form, the spelling the
/// server uses in reply queue names and routing keys.
pub(crate) const SESSION_ID_PATTERN: &str =
    "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$";

/// `TurnId`: 1-128 of `[A-Za-z0-9._:-]` (`crate::contracts::TurnId`).
pub(crate) const TURN_ID_PATTERN: &str = "^[A-Za-z0-9._:-]{1,128}$";

fn session_id() -> Value {
    serde_json::json!({ "type": "string", "format": "uuid", "pattern": SESSION_ID_PATTERN })
}

fn turn_id() -> Value {
    serde_json::json!({ "type": "string", "minLength": 1, "maxLength": 128, "pattern": TURN_ID_PATTERN })
}

/// A generated schema as JSON.
fn to_value(schema: Schema) -> Value {
    schema.to_value()
}

/// Builds a [`Schema`] from assembled JSON (always an object here).
fn from_value(value: Value) -> Schema {
    Schema::try_from(value).unwrap_or_default()
}

/// The object at `pointer`, or an empty one (generated shapes are fixed by the types; a test
/// checks the documents, so a change there shows up as a failing test, not a panic).
fn object_at(value: &Value, pointer: &str) -> Map<String, Value> {
    value.pointer(pointer).and_then(Value::as_object).cloned().unwrap_or_default()
}

/// Merges `extra` into the schema `base` (an object), keeping its description.
fn refine(base: &mut Value, extra: Value) {
    if let (Some(base), Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
}

/// Applies `refine` to the property `name` of a properties map, keeping its description.
fn refine_property(props: &mut Map<String, Value>, name: &str, extra: Value) {
    let description = props.get(name).and_then(|p| p.get("description")).cloned();
    let mut schema = serde_json::json!({});
    if let Some(d) = description {
        schema["description"] = d;
    }
    refine(&mut schema, extra);
    props.insert(name.to_owned(), schema);
}

/// The description schemars took from a doc comment, if any.
fn description_of(value: &Value) -> Value {
    value.get("description").cloned().unwrap_or(Value::Null)
}
