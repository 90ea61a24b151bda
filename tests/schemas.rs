//! The committed JSON Schemas under `schemas/` match the types. Regenerate with
//! `APTIX_BLESS=1 cargo test --test schemas`.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use std::path::Path;

#[test]
fn committed_schemas_are_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
    let bless = std::env::var_os("APTIX_BLESS").is_some();
    for file in aptix::schema::all() {
        let path = dir.join(file.file_name);
        let expected = aptix::schema::render(&file.schema);
        if bless {
            std::fs::write(&path, &expected).unwrap();
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == expected,
            "{} is stale: run APTIX_BLESS=1 cargo test --test schemas",
            path.display()
        );
    }
}

#[test]
fn request_schema_rejects_unknown_properties_and_names_every_field() {
    let schema = serde_json::to_value(aptix::schema::all()[0].schema.clone()).unwrap();
    assert_eq!(schema["additionalProperties"], false);
    let props = schema["properties"].as_object().unwrap();
    for field in aptix::contracts::request::REQUEST_FIELDS {
        assert!(props.contains_key(*field), "{field} missing from the schema");
    }
}
