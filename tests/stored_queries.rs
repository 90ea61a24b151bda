//! The compile-time query cache (`.sqlx/`) says what the migrations make. Builds check every
//! statement of the store against that cache (`SQLX_OFFLINE=true`, .cargo/config.toml), so a
//! migration that changes a column a statement reads, without the cache written again, would
//! compile and fail in production. Here each cached statement is described afresh by a database
//! migrated as the pipeline migrates one: its columns, their nullability and its parameters must
//! be what the cache holds (`scripts/sqlx-prepare.sh` writes it again).

use std::path::Path;

use aptix::store::Store;
use serde_json::Value;
use sqlx::{Column as _, TypeInfo as _};

/// A type as the cache spells it (`Int8`, `TextArray`), from its PostgreSQL name (`INT8`,
/// `TEXT[]`), both lowercased.
fn spelled(pg_name: &str) -> String {
    match pg_name.strip_suffix("[]") {
        Some(element) => format!("{}array", element.to_lowercase()),
        None => pg_name.to_lowercase(),
    }
}

fn cached_type(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_lowercase)
}

/// What the database says of `sql`, in the cache's terms: columns (name, type), nullability,
/// parameter types.
async fn described(
    pool: &sqlx::PgPool,
    sql: &str,
) -> (Vec<(String, String)>, Vec<Option<bool>>, Vec<String>) {
    let d = sqlx::Executor::describe(pool, sql).await.unwrap_or_else(|e| {
        panic!("a cached statement no longer prepares ({e}); run scripts/sqlx-prepare.sh:\n{sql}")
    });
    let columns =
        d.columns.iter().map(|c| (c.name().to_owned(), spelled(c.type_info().name()))).collect();
    let params = d.parameters.and_then(|p| p.left()).unwrap_or_default();
    (columns, d.nullable, params.iter().map(|t| spelled(t.name())).collect())
}

#[tokio::test]
async fn every_cached_statement_reads_and_binds_what_the_migrations_make() {
    let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    let url = format!("postgres://postgres@127.0.0.1:5432/aptix_t_{id}");
    Store::create_database(&url).await.unwrap();
    let store = Store::connect(&url, 2).unwrap();
    store.migrate().await.unwrap();

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(".sqlx");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    // Every statement of the store is a macro; a handful would mean the cache went missing.
    assert!(files.len() > 60, "only {} statements in .sqlx/", files.len());
    let mut stale = Vec::new();
    for file in &files {
        let cached: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
        let sql = cached["query"].as_str().unwrap();
        let d = &cached["describe"];
        let columns: Vec<(String, String)> = d["columns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["name"].as_str().unwrap().to_owned(), cached_type(&c["type_info"])))
            .collect();
        let nullable: Vec<Option<bool>> =
            d["nullable"].as_array().unwrap().iter().map(Value::as_bool).collect();
        let params: Vec<String> = d["parameters"]["Left"]
            .as_array()
            .map(|p| p.iter().map(cached_type).collect())
            .unwrap_or_default();
        if described(store.pool(), sql).await != (columns, nullable, params) {
            stale.push(file.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    store.close().await;
    assert!(
        stale.is_empty(),
        "{} cached statements differ from what the migrations make: {stale:?}; \
         run scripts/sqlx-prepare.sh",
        stale.len()
    );
}
