//! The README's first command as a newcomer runs it, piped: `aptix demo` prints its narrative,
//! without the pipeline's INFO logs and without colour codes (issue 20, point 5).
#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn the_demo_prints_its_narrative_alone_and_no_colour_when_piped() {
    let out = Command::new(env!("CARGO_BIN_EXE_aptix"))
        .arg("demo")
        .env_remove("APTIX_CONFIG")
        .env_remove("RUST_LOG")
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("== session") && stdout.contains("== stored in PostgreSQL"),
        "{stdout}"
    );
    assert!(stdout.contains("the server ran search_code"), "the demo shows a server tool");
    let session = stdout.lines().find_map(|l| l.strip_prefix("== session ")).unwrap_or("?");
    let url = format!("http://127.0.0.1:8090/sessions/{}", session.trim());
    assert!(stdout.contains(&url), "the demo ends pointing at the console: {url}");
    assert!(!stderr.contains("INFO"), "INFO logs in the demo's output:\n{stderr}");
    for text in [&stdout, &stderr] {
        assert!(!text.contains('\u{1b}'), "colour codes when piped:\n{text}");
    }

    let help = Command::new(env!("CARGO_BIN_EXE_aptix")).args(["demo", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("--verbose"));
}
