//! The largest JSON values a turn writes (the session's state, the saved answer, a record's
//! request and response) are stored as `json`, as the pipeline wrote them: bound as `json`, so
//! the server checks their text and keeps it, without parsing them into `jsonb` and writing
//! them out again (migration 0028).
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::{new_session, user_turn, Harness};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_largest_values_are_kept_as_the_text_the_pipeline_wrote() {
    let h = Harness::start(1).await;
    let s = new_session();
    for turn in ["t1", "t2"] {
        h.submit(&user_turn(&s, turn, "what does send_invoice_email do?")).await;
        let reply = h.replies(&s, 1, Duration::from_secs(60)).await.pop().unwrap().body;
        assert_eq!(reply["Successful"], true, "{turn}: {reply}");
    }
    let pool = h.deps.store.pool();
    let columns = [
        ("sessions", "state", "id"),
        ("llm_results", "result", "session_id"),
        ("response_records", "request_payload", "session_id"),
        ("response_records", "response_payload", "session_id"),
    ];
    for (table, column, key) in columns {
        let sql = format!(
            "SELECT pg_typeof({column})::text, {column}::text FROM {table} WHERE {key} = $1::uuid"
        );
        let rows: Vec<(String, String)> =
            sqlx::query_as(&sql).bind(&s).fetch_all(pool).await.unwrap();
        assert!(!rows.is_empty(), "{table}.{column}: no rows");
        // A type change resets a column's compression to pglz; migration 0028 sets lz4 again.
        let sql = "SELECT attcompression::text FROM pg_attribute
                   WHERE attrelid = $1::regclass AND attname = $2";
        let compression: String =
            sqlx::query_scalar(sql).bind(table).bind(column).fetch_one(pool).await.unwrap();
        assert_eq!(compression, "l", "{table}.{column} compression");
        for (ty, text) in rows {
            assert_eq!(ty, "json", "{table}.{column}");
            // serde_json keeps the order of keys (`preserve_order`) and writes no spaces;
            // `jsonb` sorts keys and writes `": "` and `", "`: a value that went through it
            // would not read back as the same text.
            let value: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(serde_json::to_string(&value).unwrap(), text, "{table}.{column}");
        }
    }
    h.teardown().await;
}
