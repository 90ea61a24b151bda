//! The AGN-002 `[CONTEXT]` block, byte for byte, and the chunk format it is made of.
//!
//! A block is a header line, a blank line, then per chunk `=== CHUNK N ===`, the metadata lines
//! `Id:`, `Path:`, `Lines: start-end`, `Language:` in that order, a fenced block tagged with the
//! language, and a blank line after the closing fence. Active files and restored history reuse
//! the same chunk format under their own headers, so the model reads one format everywhere.
//!
//! Two rules keep arbitrary content from breaking the block:
//! - the fence is one backtick longer than the longest backtick run in the content (at least
//!   three), so a Markdown file with its own ```` ``` ```` fences cannot close ours early;
//! - content that already ends with a newline gets no extra newline before the closing fence.

use crate::chunk::Chunk;

/// The header of the retrieved-context block.
pub const CONTEXT_HEADER: &str = "[CONTEXT]";

/// The language tag used when a chunk has none: a fence needs some tag to be read as code.
const FALLBACK_LANGUAGE: &str = "text";

/// A borrowed view of anything rendered in chunk format: a retrieved chunk or a whole file.
#[derive(Debug, Clone, Copy)]
pub struct ChunkView<'a> {
    /// Stable identifier shown as `Id:`.
    pub id: &'a str,
    /// Relative path shown as `Path:`.
    pub path: &'a str,
    /// First line (1-based).
    pub start_line: u32,
    /// Last line (inclusive).
    pub end_line: u32,
    /// Language shown as `Language:` and used as the fence tag.
    pub language: &'a str,
    /// The content, exactly as in the source.
    pub text: &'a str,
}

impl<'a> From<&'a Chunk> for ChunkView<'a> {
    fn from(c: &'a Chunk) -> Self {
        ChunkView {
            id: &c.id,
            path: &c.path,
            start_line: c.start_line,
            end_line: c.end_line,
            language: &c.language,
            text: &c.text,
        }
    }
}

/// Renders the AGN-002 `[CONTEXT]` block for `chunks`, numbered from 1.
///
/// Returns the empty string when there are no chunks: AGN-003 omits the block entirely then.
pub fn render_context_block(chunks: &[Chunk]) -> String {
    render_section(CONTEXT_HEADER, None, chunks.iter().map(ChunkView::from), 1)
}

/// Renders `header`, an optional note line, a blank line, then `items` in chunk format numbered
/// from `first`. Empty when there are no items (a header with nothing under it tells the model
/// nothing).
pub(crate) fn render_section<'a>(
    header: &str,
    note: Option<&str>,
    items: impl IntoIterator<Item = ChunkView<'a>>,
    first: usize,
) -> String {
    let mut body = String::new();
    for (n, item) in (first..).zip(items) {
        push_chunk(&mut body, n, &item);
    }
    if body.is_empty() {
        return body;
    }
    let mut out = String::with_capacity(body.len() + header.len() + 64);
    out.push_str(header);
    out.push('\n');
    if let Some(note) = note {
        out.push_str(note);
        out.push('\n');
    }
    out.push('\n');
    out.push_str(&body);
    out
}

/// Appends one chunk: header, metadata, fenced content, blank line.
fn push_chunk(out: &mut String, n: usize, c: &ChunkView<'_>) {
    let language = fence_tag(c.language);
    out.push_str(&format!("=== CHUNK {n} ===\n"));
    out.push_str(&format!("Id: {}\n", one_line(c.id)));
    out.push_str(&format!("Path: {}\n", one_line(c.path)));
    out.push_str(&format!("Lines: {}-{}\n", c.start_line, c.end_line));
    out.push_str(&format!("Language: {language}\n"));
    push_fenced(out, &language, c.text);
    out.push('\n');
}

/// Appends `text` inside a backtick fence tagged `tag`, the fence longer than any backtick run
/// in `text`, followed by a newline after the closing fence.
pub(crate) fn push_fenced(out: &mut String, tag: &str, text: &str) {
    let fence = "`".repeat(longest_backtick_run(text).max(2) + 1);
    out.push_str(&fence);
    out.push_str(tag);
    out.push('\n');
    out.push_str(text);
    if !text.is_empty() && !text.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&fence);
    out.push('\n');
}

/// Length of the longest run of consecutive backticks in `text`.
fn longest_backtick_run(text: &str) -> usize {
    let (mut longest, mut run) = (0, 0);
    for b in text.bytes() {
        run = if b == b'`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    longest
}

/// A metadata value on one line: a newline inside an id or path would forge a metadata line.
fn one_line(value: &str) -> String {
    value.replace(['\r', '\n'], " ")
}

/// The language as a fence info string: no backticks (not allowed there) and no whitespace
/// (only the first word is the tag), falling back to `text`.
fn fence_tag(language: &str) -> String {
    let tag: String = language.chars().filter(|c| *c != '`' && !c.is_whitespace()).collect();
    if tag.is_empty() {
        FALLBACK_LANGUAGE.to_owned()
    } else {
        tag
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(text: &'a str, language: &'a str) -> ChunkView<'a> {
        ChunkView { id: "c1", path: "a.md", start_line: 1, end_line: 2, language, text }
    }

    #[test]
    fn fence_outgrows_content_backticks() {
        let s = render_section("[X]", None, [view("````\ncode\n````\n", "markdown")], 1);
        assert!(s.contains("\n`````markdown\n````\ncode\n````\n`````\n\n"), "{s}");
    }

    #[test]
    fn no_extra_newline_when_text_ends_with_one() {
        let a = render_section("[X]", None, [view("x\n", "rust")], 1);
        let b = render_section("[X]", None, [view("x", "rust")], 1);
        assert_eq!(a, b);
    }

    #[test]
    fn metadata_stays_on_one_line_and_tag_is_clean() {
        let c = ChunkView {
            id: "a\nId: forged",
            path: "p",
            start_line: 3,
            end_line: 4,
            language: "c `x",
            text: "",
        };
        let s = render_section("[X]", Some("note"), [c], 7);
        assert_eq!(s, "[X]\nnote\n\n=== CHUNK 7 ===\nId: a Id: forged\nPath: p\nLines: 3-4\nLanguage: cx\n```cx\n```\n\n");
    }

    #[test]
    fn empty_input_renders_nothing() {
        assert_eq!(render_context_block(&[]), "");
    }
}
