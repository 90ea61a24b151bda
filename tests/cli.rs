//! `aptix validate`: verdicts, exit codes, and clean failures on unreadable or garbage input.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn validate_stdin(input: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_aptix"))
        .args(["validate", "-"])
        .env_remove("APTIX_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn valid_request_exits_zero() {
    let out = validate_stdin(
        br#"{"SessionId":"5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f","TurnId":"t1","Instruction":"hi"}"#,
    );
    assert_eq!(out.status.code(), Some(0));
    let v = stdout_json(&out);
    assert_eq!(v["Successful"], true);
    assert_eq!(v["Result"]["Scenario"], "user_turn");
}

#[test]
fn invalid_request_exits_one_with_errors() {
    let out = validate_stdin(br#"{"SessionId":"x","TurnId":"t1","Mode":"DDR"}"#);
    assert_eq!(out.status.code(), Some(1));
    let v = stdout_json(&out);
    assert_eq!(v["Successful"], false);
    assert_eq!(v["Errors"][0]["Code"], "request.forbidden_field");
    assert_eq!(v["Errors"][0]["Field"], "Mode");
}

#[test]
fn garbage_is_a_clear_error_not_a_panic() {
    for input in [&b""[..], b"{", b"\xff\xfe", b"null", b"[]"] {
        let out = validate_stdin(input);
        assert_eq!(out.status.code(), Some(1), "{input:?}");
        assert!(
            out.stderr.is_empty() || !String::from_utf8_lossy(&out.stderr).contains("panicked")
        );
        assert_eq!(stdout_json(&out)["Successful"], false);
    }
}

#[test]
fn unreadable_file_exits_two() {
    let out = Command::new(env!("CARGO_BIN_EXE_aptix"))
        .args(["validate", "/nonexistent/request.json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stdout_json(&out)["Successful"], false);
}
