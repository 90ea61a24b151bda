//! The README documents every error code, and its test command is what `.ci/run` runs.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use aptix::contracts::ErrorCode;

fn read(path: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

#[test]
fn readme_lists_every_error_code() {
    let readme = read("README.md");
    for code in ErrorCode::ALL {
        assert!(readme.contains(&format!("`{}`", code.as_str())), "README is missing {code}");
    }
}
