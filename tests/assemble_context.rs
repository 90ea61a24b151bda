//! The AGN-002 `[CONTEXT]` block: golden files (the spec's own example byte for byte, mixed
//! languages, nested fences, empty input), a round-trip property for arbitrary content, and the
//! `aptix render-context` command on the same inputs.

// Helpers outside #[test] functions unwrap too: a failed fixture should fail the test loudly.
#![allow(clippy::unwrap_used)]

use crate::assemble_support;

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use aptix::assemble::render_context_block;
use aptix::chunk::Chunk;
use assemble_support::{assert_golden, golden_path};
use proptest::prelude::*;

const CASES: &[&str] = &["agn002-example", "mixed-languages", "nested-fences", "empty"];

fn chunks_of(case: &str) -> Vec<Chunk> {
    let path = golden_path(&format!("context/{case}.chunks.json"));
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn golden_blocks() {
    for case in CASES {
        assert_golden(&format!("context/{case}.txt"), &render_context_block(&chunks_of(case)));
    }
}

#[test]
fn agn002_example_is_byte_exact() {
    // Hand-written here as well as in the golden file, so blessing cannot quietly change it.
    let expected =
        "[CONTEXT]\n\n=== CHUNK 1 ===\nId: ctx_1\nPath: Billing/Managers/InvoiceManager.cs\n\
        Lines: 40-85\nLanguage: csharp\n```csharp\npublic class InvoiceManager\n{\n    \
        public void SendInvoiceEmail(Invoice invoice) {\n        ...\n    }\n}\n```\n\n\
        === CHUNK 2 ===\nId: ctx_2\nPath: Billing/Api/InvoiceController.cs\nLines: 10-55\n\
        Language: csharp\n```csharp\n[ApiController]\n[Route(\"api/invoices\")]\n\
        public class InvoiceController : ControllerBase\n{\n    ...\n}\n```\n\n";
    assert_eq!(render_context_block(&chunks_of("agn002-example")), expected);
}

#[test]
fn nested_fences_are_outgrown() {
    let block = render_context_block(&chunks_of("nested-fences"));
    // The README chunk holds ``` so it gets ````; the nested one holds ```` so it gets `````.
    assert!(block.contains("Language: markdown\n````markdown\n# Billing\n"), "{block}");
    assert!(block.contains("Language: markdown\n`````markdown\nHow to show a fence:"), "{block}");
    assert!(block.contains("```rust\nfn main() {}\n```\n````\n`````\n\n"), "{block}");
    // Tildes cannot close a backtick fence, so three backticks suffice.
    assert!(block.contains("```markdown\n~~~\nnot a backtick fence\n~~~\n```\n\n"), "{block}");
}

/// Reads the content back out of a one-chunk block the way a CommonMark reader would: from the
/// line after the opening fence to the first line that could close it.
fn read_back(block: &str) -> String {
    let lines: Vec<&str> = block.split('\n').collect();
    let open = lines.iter().position(|l| l.starts_with("```")).unwrap();
    let fence_len = lines[open].chars().take_while(|c| *c == '`').count();
    let closes = |l: &str| {
        let t = l.trim_start_matches(' ');
        l.len() - t.len() <= 3
            && t.trim_end().len() >= fence_len
            && t.trim_end().chars().all(|c| c == '`')
    };
    let close = open + 1 + lines[open + 1..].iter().position(|l| closes(l)).unwrap();
    lines[open + 1..close].join("\n")
}

proptest! {
    #[test]
    fn any_content_survives_the_fence(text in "[`a \n~]{0,40}") {
        let chunk = Chunk {
            id: "c".into(), path: "p.md".into(), start_line: 1, end_line: 1,
            language: "markdown".into(), text: text.clone(), repo: None, score: None,
        };
        let block = render_context_block(&[chunk]);
        let expected = text.strip_suffix('\n').unwrap_or(&text);
        prop_assert_eq!(read_back(&block), expected);
        prop_assert!(block.ends_with("\n\n"));
    }
}

fn render_cli(arg: &str, stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_aptix"))
        .args(["render-context", arg])
        .env_remove("APTIX_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn cli_prints_the_golden_block_from_a_file_and_from_stdin() {
    for case in CASES {
        let path = golden_path(&format!("context/{case}.chunks.json"));
        let expected = std::fs::read(golden_path(&format!("context/{case}.txt"))).unwrap();
        let from_file = render_cli(path.to_str().unwrap(), b"");
        assert_eq!(
            from_file.status.code(),
            Some(0),
            "{case}: {}",
            String::from_utf8_lossy(&from_file.stderr)
        );
        assert_eq!(from_file.stdout, expected, "{case}");
        let from_stdin = render_cli("-", &std::fs::read(&path).unwrap());
        assert_eq!(from_stdin.status.code(), Some(0), "{case}");
        assert_eq!(from_stdin.stdout, expected, "{case}");
    }
}

#[test]
fn cli_empty_array_prints_nothing() {
    let out = render_cli("-", b"[]");
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());
}

#[test]
fn cli_rejects_what_is_not_a_chunk_array() {
    for input in [&b"{"[..], b"{}", b"[{\"id\":\"x\"}]", b""] {
        let out = render_cli("-", input);
        assert_eq!(out.status.code(), Some(1), "{input:?}");
        assert!(out.stdout.is_empty());
        assert!(String::from_utf8_lossy(&out.stderr).contains("not a JSON array of chunks"));
    }
    let missing = render_cli("/nonexistent/chunks.json", b"");
    assert_eq!(missing.status.code(), Some(2));
}
