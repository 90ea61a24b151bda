//! Splits text into chunks with exact 1-based line spans, preferring layout boundaries: the
//! chunker for files without a grammar (`syntax` cuts the others along their syntax tree), and
//! the fallback inside an item too long to cut otherwise. Formatted text marks its structure
//! with indentation and blank lines, so a cut is scored by what starts after it:
//! - 3: a top-level item (column 0, after a blank line or a closing line such as `}`, `end`),
//!   a Markdown heading;
//! - 2: a member-level item (indented at most one level) after a blank line;
//! - 1: anything else after a blank line;
//! - 0: mid-block.
//!
//! Each chunk ends at the best-scored cut between `min_lines` and `max_lines` (closest to
//! `target_lines` among equals). Only where no boundary exists (a long function or a generated
//! table) does a hard cut happen, and then consecutive chunks overlap by `overlap_lines` so no
//! statement is seen only cut in half. Chunks never start or end with blank lines.

/// Chunking parameters, in lines (and characters for very long lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkParams {
    /// Preferred chunk length.
    pub target_lines: usize,
    /// Shortest chunk, except at the end of a file.
    pub min_lines: usize,
    /// Longest chunk.
    pub max_lines: usize,
    /// Overlap after a hard cut.
    pub overlap_lines: usize,
    /// Longest chunk in characters (at least one line is always taken).
    pub max_chars: usize,
}

impl Default for ChunkParams {
    fn default() -> Self {
        ChunkParams {
            target_lines: 40,
            min_lines: 12,
            max_lines: 80,
            overlap_lines: 5,
            max_chars: 6_000,
        }
    }
}

/// One chunk: its 1-based inclusive span and its exact text (line terminators inside the span
/// kept, the last line's terminator dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextChunk {
    /// First line, 1-based.
    pub start_line: u32,
    /// Last line, 1-based, inclusive.
    pub end_line: u32,
    /// The lines, exactly as in the file.
    pub text: String,
}

/// Splits `text` into chunks.
pub fn chunk_text(text: &str, params: &ChunkParams) -> Vec<TextChunk> {
    // Byte offset where each line starts, plus the end of the text.
    let mut starts: Vec<usize> = vec![0];
    starts.extend(text.match_indices('\n').map(|(i, _)| i + 1).filter(|&i| i < text.len()));
    let lines: Vec<&str> = starts
        .iter()
        .enumerate()
        .map(|(n, &s)| {
            let e = starts.get(n + 1).copied().unwrap_or(text.len());
            text[s..e].trim_end_matches(['\n', '\r'])
        })
        .collect();
    let blank: Vec<bool> = lines.iter().map(|l| l.trim().is_empty()).collect();
    let score: Vec<u8> = (0..lines.len()).map(|i| boundary_score(&lines, &blank, i)).collect();

    let p = ChunkParams {
        min_lines: params.min_lines.max(1),
        max_lines: params.max_lines.max(1),
        ..*params
    };
    let mut out = Vec::new();
    let mut start = 0;
    while start < lines.len() {
        while start < lines.len() && blank[start] {
            start += 1;
        }
        if start >= lines.len() {
            break;
        }
        let limit = char_limit(&lines, start, &p).min(lines.len());
        let short_tail = limit == lines.len() && limit - start <= p.target_lines + p.min_lines;
        let (end, hard) =
            if short_tail { (limit, false) } else { pick_cut(&score, start, limit, &p) };
        let mut last = end - 1;
        while last > start && blank[last] {
            last -= 1;
        }
        let byte_end = starts[last] + lines[last].len();
        out.push(TextChunk {
            start_line: to_u32(start + 1),
            end_line: to_u32(last + 1),
            text: text[starts[start]..byte_end].to_owned(),
        });
        // Overlap only chunks long enough that the overlap cannot stall progress.
        let overlap = if hard && end - start > 2 * p.overlap_lines { p.overlap_lines } else { 0 };
        start = end - overlap;
    }
    out
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// One past the last line allowed by `max_lines` and `max_chars` (at least one line).
fn char_limit(lines: &[&str], start: usize, p: &ChunkParams) -> usize {
    let mut chars = 0;
    let mut end = start;
    while end < lines.len() && end - start < p.max_lines {
        chars += lines[end].chars().count() + 1;
        if chars > p.max_chars && end > start {
            break;
        }
        end += 1;
    }
    end
}

/// The cut (exclusive end) for a chunk starting at `start` that may not pass `limit`, and
/// whether it is a hard cut (no boundary found).
fn pick_cut(score: &[u8], start: usize, limit: usize, p: &ChunkParams) -> (usize, bool) {
    let lo = (start + p.min_lines).min(limit);
    let ideal = start + p.target_lines;
    let len = score.len();
    // The end of the file is the best boundary there is; a cut near it must leave a real chunk.
    let value = |c: usize| if c == len { 3 } else { score[c] };
    let best = (lo..=limit)
        .filter(|&c| c > start && value(c) > 0 && (c == len || c + p.min_lines <= len))
        .max_by_key(|&c| (value(c), std::cmp::Reverse(c.abs_diff(ideal))));
    match best {
        Some(c) => (c, false),
        None => (limit.max(start + 1), true),
    }
}

fn indent(line: &str) -> usize {
    line.chars().take_while(|c| c.is_whitespace()).map(|c| if c == '\t' { 4 } else { 1 }).sum()
}

/// How good a place it is to start a chunk at line `i`.
fn boundary_score(lines: &[&str], blank: &[bool], i: usize) -> u8 {
    if i == 0 || blank[i] {
        return 0;
    }
    let line = lines[i];
    let prev_blank = blank[i - 1];
    let level = indent(line);
    let trimmed = line.trim_start();
    let closer = trimmed.starts_with(['}', ')', ']']) || trimmed.starts_with("end");
    if trimmed.starts_with('#') && trimmed.trim_start_matches('#').starts_with(' ') && level == 0 {
        return 3; // Markdown heading (a `# comment` line in code scores the same, harmlessly)
    }
    let prev = lines[i - 1].trim();
    let after_closer =
        level == 0 && !closer && matches!(prev, "}" | "};" | "end" | ")" | ");" | "]");
    if (prev_blank && level == 0 && !closer) || after_closer {
        3
    } else if prev_blank && level <= 4 && !closer {
        2
    } else if prev_blank {
        1
    } else {
        0
    }
}
