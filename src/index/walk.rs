//! Walks a repository the way git sees it: `.gitignore`, `.ignore` and global git excludes are
//! honoured (even outside a git checkout), hidden files and directories are skipped, and files
//! that are binary, not UTF-8, empty, generated or too large are reported rather than indexed.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::IndexError;

/// Why a file was not indexed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SkipReason {
    /// Larger than the size limit.
    TooLarge,
    /// Contains NUL bytes.
    Binary,
    /// Not valid UTF-8.
    NotUtf8,
    /// Empty or whitespace only.
    Empty,
    /// A lock file, minified bundle or source map: large, machine-written, useless as context.
    Generated,
    /// Could not be read.
    Unreadable,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SkipReason::TooLarge => "too large",
            SkipReason::Binary => "binary",
            SkipReason::NotUtf8 => "not UTF-8",
            SkipReason::Empty => "empty",
            SkipReason::Generated => "generated",
            SkipReason::Unreadable => "unreadable",
        })
    }
}

/// A file to index: its `/`-separated path relative to the root and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// Relative path, `/`-separated.
    pub path: String,
    /// Contents.
    pub text: String,
}

/// Relative paths of skipped files, by reason.
pub type Skipped = BTreeMap<SkipReason, Vec<String>>;

/// Every indexable file under `root`, sorted by path, and the skipped ones by reason.
pub fn collect(root: &Path, max_bytes: u64) -> Result<(Vec<PathBuf>, Skipped), IndexError> {
    if !root.is_dir() {
        return Err(IndexError::NotADirectory(root.to_path_buf()));
    }
    let mut files = Vec::new();
    let mut skipped = Skipped::new();
    let walker =
        ignore::WalkBuilder::new(root).hidden(true).require_git(false).follow_links(false).build();
    for entry in walker {
        let entry = entry.map_err(|e| IndexError::Walk(e.to_string()))?;
        if !entry.file_type().is_some_and(|t| t.is_file()) {
            continue;
        }
        let path = entry.into_path();
        let rel = relative(root, &path);
        if is_generated(&rel) {
            skipped.entry(SkipReason::Generated).or_default().push(rel);
            continue;
        }
        match std::fs::metadata(&path) {
            Ok(m) if m.len() > max_bytes => {
                skipped.entry(SkipReason::TooLarge).or_default().push(rel)
            }
            Ok(_) => files.push(path),
            Err(_) => skipped.entry(SkipReason::Unreadable).or_default().push(rel),
        }
    }
    files.sort();
    Ok((files, skipped))
}

/// Reads one file, or says why it is skipped.
pub fn read(root: &Path, path: &Path) -> Result<SourceFile, (String, SkipReason)> {
    let rel = relative(root, path);
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(_) => return Err((rel, SkipReason::Unreadable)),
    };
    if bytes.iter().take(8_192).any(|&b| b == 0) {
        return Err((rel, SkipReason::Binary));
    }
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(_) => return Err((rel, SkipReason::NotUtf8)),
    };
    if text.trim().is_empty() {
        return Err((rel, SkipReason::Empty));
    }
    Ok(SourceFile { path: rel, text })
}

/// `path` relative to `root`, with `/` separators.
pub fn relative(root: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(root).unwrap_or(path);
    rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/")
}

fn is_generated(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    matches!(
        name,
        "Cargo.lock"
            | "package-lock.json"
            | "yarn.lock"
            | "pnpm-lock.yaml"
            | "poetry.lock"
            | "go.sum"
    ) || name.ends_with(".min.js")
        || name.ends_with(".min.css")
        || name.ends_with(".map")
}
