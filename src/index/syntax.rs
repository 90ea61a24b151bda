//! Syntax-aware chunking: a file of a language with a tree-sitter grammar (Rust, C#,
//! TypeScript/TSX, JavaScript, Python, Go) is cut only between syntax nodes. Its top-level items
//! (functions, types, impls, classes, imports) are packed in order into chunks of about
//! `target_lines`; an item longer than `max_lines` is opened and its members (methods, nested
//! items) packed the same way, its header kept with the first of them and its closing lines with
//! the last (a long function is opened the same way, into its statements); an item with nothing
//! to open falls back to the line chunker within its own lines. Comments and attributes directly above an item stay with it.
//! Spans are whole lines, so `StartLine`/`EndLine` are exact; files of other languages, and files
//! that do not parse, use the line chunker.

use std::path::Path;

use tree_sitter::{Language, Node, Parser};

use super::chunker::{chunk_text, ChunkParams, TextChunk};

/// How deep items are opened before a long one falls back to line chunking.
const MAX_DEPTH: usize = 8;

/// The grammar for a file, from its extension.
fn grammar(path: &Path) -> Option<Language> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    Some(match ext.as_str() {
        "rs" => tree_sitter_rust::LANGUAGE.into(),
        "cs" | "csx" => tree_sitter_c_sharp::LANGUAGE.into(),
        "ts" | "mts" | "cts" => tree_sitter_typescript::LANGUAGE_TYPESCRIPT.into(),
        "tsx" => tree_sitter_typescript::LANGUAGE_TSX.into(),
        "js" | "jsx" | "mjs" | "cjs" => tree_sitter_javascript::LANGUAGE.into(),
        "py" | "pyi" => tree_sitter_python::LANGUAGE.into(),
        "go" => tree_sitter_go::LANGUAGE.into(),
        _ => return None,
    })
}

/// Chunks a file: along its syntax when its language has a grammar, by lines otherwise.
pub fn chunk_file(path: &Path, text: &str, params: &ChunkParams) -> Vec<TextChunk> {
    grammar(path)
        .and_then(|language| chunk_syntax(text, &language, params))
        .unwrap_or_else(|| chunk_text(text, params))
}

/// Chunks `text` along the syntax tree of `language`; `None` when it cannot be parsed.
pub fn chunk_syntax(
    text: &str,
    language: &Language,
    params: &ChunkParams,
) -> Option<Vec<TextChunk>> {
    let mut parser = Parser::new();
    parser.set_language(language).ok()?;
    let tree = parser.parse(text, None)?;
    let lines = Lines::new(text);
    let mut packer = Packer { lines: &lines, params, out: Vec::new(), cur: None };
    packer.children(tree.root_node(), 0);
    packer.flush();
    Some(packer.out)
}

/// The file's lines: where each starts, and its length without the terminator.
struct Lines<'a> {
    text: &'a str,
    starts: Vec<usize>,
}

impl<'a> Lines<'a> {
    fn new(text: &'a str) -> Self {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1).filter(|&i| i < text.len()));
        Lines { text, starts }
    }

    fn count(&self) -> usize {
        self.starts.len()
    }

    /// Line `n` (0-based) without its terminator.
    fn line(&self, n: usize) -> &'a str {
        let end = self.starts.get(n + 1).copied().unwrap_or(self.text.len());
        self.text[self.starts[n]..end].trim_end_matches(['\n', '\r'])
    }

    fn blank(&self, n: usize) -> bool {
        self.line(n).trim().is_empty()
    }

    fn chars(&self, first: usize, last: usize) -> usize {
        (first..=last).map(|n| self.line(n).len() + 1).sum()
    }

    /// Lines `first..=last` as a chunk, without blank lines at either end (`None` if all blank).
    fn chunk(&self, mut first: usize, mut last: usize) -> Option<TextChunk> {
        while first <= last && self.blank(first) {
            first += 1;
        }
        while last > first && self.blank(last) {
            last -= 1;
        }
        if first > last || self.blank(first) {
            return None;
        }
        let end = self.starts[last] + self.line(last).len();
        Some(TextChunk {
            start_line: to_u32(first + 1),
            end_line: to_u32(last + 1),
            text: self.text[self.starts[first]..end].to_owned(),
        })
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A node's rows, first to last (0-based, inclusive).
fn rows(node: Node<'_>) -> (usize, usize) {
    let (start, end) = (node.start_position(), node.end_position());
    let last = if end.column == 0 && end.row > start.row { end.row - 1 } else { end.row };
    (start.row, last)
}

/// Comments and attributes belong to the item after them.
fn leads(node: Node<'_>) -> bool {
    node.is_extra() || node.kind().contains("comment") || node.kind().ends_with("attribute_item")
}

/// One item to pack: its rows, and the node to open if it is too long.
struct Unit<'t> {
    first: usize,
    last: usize,
    node: Node<'t>,
}

/// The named children of `node` as units, comments and attributes joined to the item they
/// directly precede.
fn units(node: Node<'_>) -> Vec<Unit<'_>> {
    let mut out = Vec::new();
    let mut lead: Option<(usize, usize)> = None;
    let mut cursor = node.walk();
    for child in node.named_children(&mut cursor) {
        let (first, last) = rows(child);
        if let Some((lf, ll)) = lead.take() {
            if first <= ll + 1 {
                if leads(child) {
                    lead = Some((lf, last));
                } else {
                    out.push(Unit { first: lf, last, node: child });
                }
                continue;
            }
            out.push(Unit { first: lf, last: ll, node });
        }
        if leads(child) {
            lead = Some((first, last));
        } else {
            out.push(Unit { first, last, node: child });
        }
    }
    if let Some((first, last)) = lead {
        out.push(Unit { first, last, node });
    }
    out.retain(|u| u.first <= u.last);
    out
}

/// Packs units into line spans, in order.
struct Packer<'a> {
    lines: &'a Lines<'a>,
    params: &'a ChunkParams,
    out: Vec<TextChunk>,
    /// The chunk being filled: its first and last row.
    cur: Option<(usize, usize)>,
}

impl Packer<'_> {
    fn children(&mut self, node: Node<'_>, depth: usize) {
        for unit in units(node) {
            self.add(&unit, depth);
        }
    }

    fn fits(&self, first: usize, last: usize, limit: usize) -> bool {
        last + 1 - first <= limit && self.lines.chars(first, last) <= self.params.max_chars
    }

    /// Adds rows `first..=last` to the current chunk if the whole stays within `limit` lines,
    /// or starts a new chunk with them.
    fn extend(&mut self, first: usize, last: usize, limit: usize) {
        match self.cur {
            Some((start, _)) if self.fits(start, last, limit) => self.cur = Some((start, last)),
            _ => {
                self.flush();
                self.cur = Some((first, last));
            }
        }
    }

    fn flush(&mut self) {
        if let Some((first, last)) = self.cur.take() {
            self.out.extend(self.lines.chunk(first, last));
        }
    }

    fn add(&mut self, unit: &Unit<'_>, depth: usize) {
        let (first, last) = (unit.first, unit.last.min(self.lines.count() - 1));
        if self.fits(first, last, self.params.max_lines) {
            return self.extend(first, last, self.params.target_lines);
        }
        let members = units(unit.node);
        let opens = depth < MAX_DEPTH
            && members.len() >= 2
            && members.iter().all(|m| m.first >= first && m.last <= last);
        if opens {
            // The item's header (its signature, up to its first member) leads the first chunk.
            let header_end = members[0].first.saturating_sub(1);
            if members[0].first > first {
                self.extend(first, header_end, self.params.target_lines);
            }
            for m in &members {
                self.add(m, depth + 1);
            }
            // Its closing lines end the last one.
            let tail = members.iter().map(|m| m.last).max().unwrap_or(last);
            if tail < last {
                self.extend(tail + 1, last, self.params.max_lines);
            }
            return;
        }
        self.flush();
        let end = self.lines.starts[last] + self.lines.line(last).len();
        for c in chunk_text(&self.lines.text[self.lines.starts[first]..end], self.params) {
            let (s, e) = (c.start_line as usize - 1 + first, c.end_line as usize - 1 + first);
            if s > last {
                break;
            }
            self.out.extend(self.lines.chunk(s, e.min(last)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(path: &str, text: &str, params: &ChunkParams) -> Vec<(u32, u32)> {
        chunk_file(Path::new(path), text, params)
            .iter()
            .map(|c| (c.start_line, c.end_line))
            .collect()
    }

    fn small() -> ChunkParams {
        ChunkParams {
            target_lines: 8,
            min_lines: 2,
            max_lines: 12,
            overlap_lines: 1,
            max_chars: 6000,
        }
    }

    #[test]
    fn rust_items_are_cut_between_functions_with_their_doc_comments() {
        let text = "use std::fmt;\n\n/// Adds.\n#[inline]\nfn add(a: u32, b: u32) -> u32 {\n    a + b\n}\n\n/// Subtracts, at length.\nfn sub(a: u32, b: u32) -> u32 {\n    let x = a;\n    let y = b;\n    let z = x - y;\n    z\n}\n";
        assert_eq!(spans("m.rs", text, &small()), [(1, 7), (9, 15)]);
    }

    #[test]
    fn a_long_impl_is_opened_into_its_methods_keeping_header_and_closing_brace() {
        let method = |n: usize| {
            format!("    fn m{n}(&self) -> u32 {{\n        let a = {n};\n        let b = a + 1;\n        a + b\n    }}\n")
        };
        let body: String = (0..4).map(method).collect();
        let text = format!("struct S;\n\nimpl S {{\n{body}}}\n");
        let got = spans("s.rs", &text, &small());
        // Each method is 5 lines; the header `impl S {` joins the first, `}` the last.
        assert_eq!(got, [(1, 8), (9, 13), (14, 18), (19, 24)]);
        assert_eq!(got.last().map(|s| s.1), Some(text.lines().count() as u32));
        for (s, e) in &got {
            assert!(e - s < 12, "{got:?}");
        }
    }

    #[test]
    fn every_grammar_parses_and_spans_are_exact_lines() {
        let samples = [
            ("a.cs", "namespace N {\n  class C {\n    void M() { }\n  }\n}\n"),
            ("a.ts", "export class C {\n  m(): number { return 1; }\n}\nfunction f() {}\n"),
            ("a.tsx", "export const A = () => <div>hi</div>;\n"),
            ("a.js", "function f() {\n  return 1;\n}\n"),
            ("a.py", "import os\n\nclass C:\n    def m(self):\n        return 1\n"),
            ("a.go", "package p\n\nfunc F() int {\n\treturn 1\n}\n"),
        ];
        for (path, text) in samples {
            let language = grammar(Path::new(path)).unwrap();
            let chunks = chunk_syntax(text, &language, &ChunkParams::default()).unwrap();
            assert!(!chunks.is_empty(), "{path}");
            let lines: Vec<&str> = text.lines().collect();
            for c in chunks {
                let exact = lines[c.start_line as usize - 1..c.end_line as usize].join("\n");
                assert_eq!(c.text, exact, "{path}");
            }
        }
    }

    /// `n` functions of `body` lines each, in the syntax of `ext`, and the 1-based line span of
    /// each.
    fn functions(ext: &str, n: usize, body: usize) -> (String, Vec<(u32, u32)>) {
        let (open, line, close): (fn(usize) -> String, &str, &str) = match ext {
            "rs" => (|i| format!("/// Doc {i}.\nfn f{i}() -> u32 {{"), "    let x = 1;", "}"),
            "cs" => (|i| format!("  public int F{i}() {{"), "    var x = 1;", "  }"),
            "ts" | "js" => (|i| format!("function f{i}() {{"), "  const x = 1;", "}"),
            "py" => (|i| format!("def f{i}():"), "    x = 1", "    return x"),
            "go" => (|i| format!("func F{i}() int {{"), "\tx := 1", "}"),
            _ => unreachable!(),
        };
        let mut text = match ext {
            "cs" => "class C {\n".to_owned(),
            "go" => "package p\n".to_owned(),
            _ => String::new(),
        };
        let mut spans = Vec::new();
        for i in 0..n {
            text.push('\n');
            let first = text.lines().count() as u32 + 1;
            text.push_str(&open(i));
            text.push('\n');
            for _ in 0..body {
                text.push_str(line);
                text.push('\n');
            }
            text.push_str(close);
            text.push('\n');
            spans.push((first, text.lines().count() as u32));
        }
        if ext == "cs" {
            text.push_str("}\n");
        }
        (text, spans)
    }

    #[test]
    fn no_chunk_cuts_a_function_in_any_grammar() {
        for ext in ["rs", "cs", "ts", "js", "py", "go"] {
            let (text, fns) = functions(ext, 12, 9);
            let chunks = chunk_file(Path::new(&format!("f.{ext}")), &text, &ChunkParams::default());
            assert!(chunks.len() > 1, "{ext}: {} chunks", chunks.len());
            for (first, last) in &fns {
                let whole = chunks.iter().any(|c| c.start_line <= *first && *last <= c.end_line);
                assert!(whole, "{ext}: lines {first}-{last} are split");
            }
        }
    }

    #[test]
    fn a_long_function_is_cut_between_its_statements_within_its_own_lines() {
        let body: String = (0..30).map(|i| format!("    let v{i} = {i};\n")).collect();
        let text = format!("fn long() {{\n{body}}}\n\nfn after() {{}}\n");
        let got = spans("l.rs", &text, &small());
        let after = text.lines().position(|l| l.starts_with("fn after")).unwrap() as u32 + 1;
        assert_eq!(got.last(), Some(&(after, after)));
        assert!(got[..got.len() - 1].iter().all(|(_, e)| *e < after), "{got:?}");
        assert!(got.len() > 3);
    }
}
