//! The indexer's pure parts on real trees: chunk spans over this repository's own sources, and the
//! walk over a fixture tree (gitignore, hidden, binary, size, generated files).

#![allow(clippy::unwrap_used)]

use std::path::Path;

use aptix::index::walk::{self, SkipReason};
use aptix::index::{chunk_text, language::language_for, ChunkParams};

fn write(root: &Path, rel: &str, contents: &[u8]) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, contents).unwrap();
}

#[test]
fn chunks_of_this_repositorys_sources_have_exact_spans() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (files, _) = walk::collect(&root.join("src"), 1 << 20).unwrap();
    assert!(files.len() > 20, "expected a real tree, found {} files", files.len());
    let params = ChunkParams::default();
    let mut total = 0;
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let chunks = chunk_text(&text, &params);
        let mut covered = vec![false; lines.len()];
        let mut prev_start = 0;
        for c in &chunks {
            let (s, e) = (c.start_line as usize, c.end_line as usize);
            assert!(s >= 1 && s <= e && e <= lines.len(), "{}: bad span {s}-{e}", path.display());
            assert_eq!(
                c.text,
                lines[s - 1..e].join("\n"),
                "{}: text of {s}-{e} differs from the file",
                path.display()
            );
            assert!(e - s < params.max_lines, "{}: chunk {s}-{e} longer than max", path.display());
            assert!(
                !lines[s - 1].trim().is_empty() && !lines[e - 1].trim().is_empty(),
                "chunks are trimmed"
            );
            assert!(s > prev_start, "chunks are ordered");
            prev_start = s;
            covered[s - 1..e].iter_mut().for_each(|c| *c = true);
        }
        for (i, line) in lines.iter().enumerate() {
            assert!(
                covered[i] || line.trim().is_empty(),
                "{}: line {} is in no chunk",
                path.display(),
                i + 1
            );
        }
        total += chunks.len();
    }
    assert!(total > 50);
}

#[test]
fn chunks_prefer_top_level_item_boundaries() {
    // Three 20-line functions separated by blank lines: cuts land on their doc comments, no overlap.
    let mut text = String::new();
    for f in 0..3 {
        text.push_str(&format!("/// Doc of f{f}.\nfn f{f}() {{\n"));
        for i in 0..17 {
            text.push_str(&format!("    let x{i} = {i};\n"));
        }
        text.push_str("}\n\n");
    }
    let params = ChunkParams {
        target_lines: 20,
        min_lines: 10,
        max_lines: 30,
        overlap_lines: 3,
        max_chars: 10_000,
    };
    let spans: Vec<(u32, u32)> =
        chunk_text(&text, &params).iter().map(|c| (c.start_line, c.end_line)).collect();
    assert_eq!(spans, vec![(1, 20), (22, 41), (43, 62)]);
}

#[test]
fn hard_cuts_overlap_and_long_lines_are_bounded() {
    let text: String = (1..=100).map(|i| format!("    call({i});\n")).collect();
    let params = ChunkParams {
        target_lines: 30,
        min_lines: 10,
        max_lines: 40,
        overlap_lines: 5,
        max_chars: 100_000,
    };
    let chunks = chunk_text(&text, &params);
    assert_eq!((chunks[0].start_line, chunks[0].end_line), (1, 40));
    assert_eq!(chunks[1].start_line, 36, "a hard cut overlaps by overlap_lines");
    assert_eq!(chunks.last().unwrap().end_line, 100);
    let wide: String = (0..10).map(|_| format!("{}\n", "x".repeat(1_000))).collect();
    let params = ChunkParams { max_chars: 2_500, ..params };
    assert!(chunk_text(&wide, &params).iter().all(|c| c.text.len() <= 2_500));
}

#[test]
fn walk_honours_gitignore_and_reports_skips() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, ".gitignore", b"build/\n*.log\n");
    write(root, "src/main.rs", b"fn main() {}\n");
    write(root, "src/ui/Button.tsx", b"export const Button = () => null;\n");
    write(root, "build/gen.rs", b"fn generated() {}\n");
    write(root, "debug.log", b"log line\n");
    write(root, ".hidden/secret.rs", b"fn secret() {}\n");
    write(root, "assets/logo.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR");
    write(root, "latin1.txt", b"caf\xe9\n");
    write(root, "empty.py", b"   \n");
    write(root, "big.rs", &vec![b'a'; 2_000]);
    write(root, "package-lock.json", b"{}\n");

    let (files, mut skipped) = walk::collect(root, 1_000).unwrap();
    let mut indexed = Vec::new();
    for f in &files {
        match walk::read(root, f) {
            Ok(file) => indexed.push(file.path),
            Err((path, reason)) => skipped.entry(reason).or_default().push(path),
        }
    }
    assert_eq!(indexed, ["src/main.rs", "src/ui/Button.tsx"]);
    let get = |r| skipped.get(&r).cloned().unwrap_or_default();
    assert_eq!(get(SkipReason::Binary), ["assets/logo.png"]);
    assert_eq!(get(SkipReason::NotUtf8), ["latin1.txt"]);
    assert_eq!(get(SkipReason::Empty), ["empty.py"]);
    assert_eq!(get(SkipReason::TooLarge), ["big.rs"]);
    assert_eq!(get(SkipReason::Generated), ["package-lock.json"]);
    assert_eq!(language_for(Path::new("src/ui/Button.tsx")), "typescript");
}
