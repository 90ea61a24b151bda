//! Shared helpers of the assembly tests: golden files (`APTIX_BLESS=1` rewrites them) and the
//! directory every produced request body is written to for `check-responses-request`.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::PathBuf;

/// `tests/golden/<rel>`.
pub fn golden_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(rel)
}

/// Compares `actual` with the golden file `rel`, or rewrites it when `APTIX_BLESS=1`.
pub fn assert_golden(rel: &str, actual: &str) {
    let path = golden_path(rel);
    if std::env::var_os("APTIX_BLESS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("cannot read {} ({e}); run with APTIX_BLESS=1 to create it", path.display())
    });
    if expected != actual {
        let first = expected.lines().zip(actual.lines()).position(|(a, b)| a != b);
        panic!(
            "{} differs from the golden file (first differing line: {:?}); rerun with APTIX_BLESS=1 if the change is intended\n--- expected\n{expected}\n--- actual\n{actual}",
            path.display(),
            first.map(|n| n + 1)
        );
    }
}

/// Pretty JSON with a trailing newline, as golden files hold it.
pub fn pretty(value: &impl serde::Serialize) -> String {
    let mut s = serde_json::to_string_pretty(value).unwrap();
    s.push('\n');
    s
}

/// Writes a request body to `tests/out/responses-requests/<name>.json` for the CI check.
pub fn write_request_body(name: &str, body: &serde_json::Value) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/out/responses-requests");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.json")), pretty(body)).unwrap();
}
