//! JSON Schema documents for the public contracts, generated from the Rust types so backends in
//! other languages can validate before publishing. The committed copies under `schemas/` are kept
//! current by a test.

use schemars::{schema_for, Schema};

use crate::contracts::{AgentExecuteRequest, Reply};

/// A schema document and the file it is committed as.
#[derive(Debug)]
pub struct SchemaFile {
    /// File name under `schemas/`.
    pub file_name: &'static str,
    /// The schema.
    pub schema: Schema,
}

/// Every published schema.
pub fn all() -> Vec<SchemaFile> {
    vec![
        SchemaFile {
            file_name: "agent-execute-request.schema.json",
            schema: schema_for!(AgentExecuteRequest),
        },
        SchemaFile { file_name: "invoke-result.schema.json", schema: schema_for!(Reply) },
    ]
}

/// The schema rendered as committed: pretty JSON with a trailing newline.
pub fn render(schema: &Schema) -> String {
    let mut text = serde_json::to_string_pretty(schema).unwrap_or_default();
    text.push('\n');
    text
}
