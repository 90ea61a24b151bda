//! Active files (Session Architecture §5-§6): which of a turn's files are sent, by SHA-256
//! against what the chain already holds, which are skipped (over the size limit, or not text),
//! and how a whole file is rendered in the AGN-002 chunk format (`Lines: 1-N`).

use super::block::{render_section, ChunkView};
use super::record::{SentFile, SkipReason, SkippedFile, WARN_FILE_BINARY, WARN_FILE_TOO_LARGE};
use super::state::{ChainState, StoredFile};
use crate::config::AssemblePolicy;
use crate::contracts::{ArtifactContents, InputArtifact, UserWarning};
use crate::index::language::language_for;

/// Header of the active-files section of a user message.
pub(crate) const ACTIVE_FILES_HEADER: &str = "[ACTIVE FILES]";

/// A turn's files, sorted by what happens to them.
#[derive(Debug, Default)]
pub(crate) struct FileSelection {
    /// Sent: new to the chain or changed.
    pub send: Vec<StoredFile>,
    /// Not sent: the chain holds this exact version.
    pub unchanged: Vec<SentFile>,
    /// Not sent at all.
    pub skipped: Vec<SkippedFile>,
}

/// Sorts `artifacts` against the chain being continued (`None` for a new chain, which holds
/// nothing yet).
pub(crate) fn select_files(
    artifacts: &[InputArtifact],
    chain: Option<&ChainState>,
    policy: &AssemblePolicy,
) -> FileSelection {
    let mut out = FileSelection::default();
    for artifact in artifacts {
        let path = artifact.path().as_str().to_owned();
        let sha256 = artifact.sha256();
        let bytes = artifact.contents().as_bytes().len() as u64;
        let skip =
            |reason| SkippedFile { path: path.clone(), sha256: sha256.clone(), bytes, reason };
        let text = match artifact.contents() {
            _ if bytes > policy.active_file_max_bytes => {
                out.skipped
                    .push(skip(SkipReason::TooLarge { limit_bytes: policy.active_file_max_bytes }));
                continue;
            }
            ArtifactContents::Binary(_) => {
                out.skipped.push(skip(SkipReason::Binary));
                continue;
            }
            ArtifactContents::Text(text) => text,
        };
        if chain.and_then(|c| c.file_hash(&path)) == Some(sha256.as_str()) {
            out.unchanged.push(SentFile { path, sha256, bytes, rehydrated: false });
            continue;
        }
        // The client's hint wins; else the same guess the indexer uses, so a file and its
        // retrieved chunks carry the same tag.
        let language = artifact
            .language()
            .map_or_else(|| language_for(std::path::Path::new(&path)).to_owned(), str::to_owned);
        out.send.push(StoredFile { path, sha256, language, text: text.clone() });
    }
    out
}

/// The record entry of a file that is sent.
pub(crate) fn sent_file(file: &StoredFile, rehydrated: bool) -> SentFile {
    SentFile {
        path: file.path.clone(),
        sha256: file.sha256.clone(),
        bytes: file.text.len() as u64,
        rehydrated,
    }
}

/// The user warning for a skipped file.
pub(crate) fn skip_warning(file: &SkippedFile) -> UserWarning {
    match file.reason {
        SkipReason::TooLarge { limit_bytes } => UserWarning {
            code: WARN_FILE_TOO_LARGE.to_owned(),
            message: format!(
                "`{}` ({} bytes) was not sent to the model: active files over {limit_bytes} bytes are skipped.",
                file.path, file.bytes
            ),
        },
        SkipReason::Binary => UserWarning {
            code: WARN_FILE_BINARY.to_owned(),
            message: format!("`{}` was not sent to the model: its contents are not text.", file.path),
        },
    }
}

/// One line per skipped file, telling the model a file exists that it cannot see.
pub(crate) fn skipped_note(skipped: &[SkippedFile]) -> Option<String> {
    if skipped.is_empty() {
        return None;
    }
    let mut note = String::from(
        "[SKIPPED FILES]\nThese files were supplied with the turn but not included:\n",
    );
    for f in skipped {
        let why = match f.reason {
            SkipReason::TooLarge { limit_bytes } => {
                format!("{} bytes, over the {limit_bytes}-byte limit", f.bytes)
            }
            SkipReason::Binary => "not text".to_owned(),
        };
        note.push_str(&format!("- {} ({why})\n", f.path));
    }
    Some(note)
}

/// Renders whole files as chunks under `header`, numbered from `first`.
pub(crate) fn render_files(
    header: &str,
    note: Option<&str>,
    files: &[StoredFile],
    first: usize,
) -> String {
    let ids: Vec<String> = files.iter().map(file_chunk_id).collect();
    let views = files.iter().zip(&ids).map(|(f, id)| ChunkView {
        id,
        path: &f.path,
        start_line: u32::from(!f.text.is_empty()),
        end_line: u32::try_from(f.text.lines().count()).unwrap_or(u32::MAX),
        language: &f.language,
        text: &f.text,
    });
    render_section(header, note, views, first)
}

/// The `Id:` of a whole file: path plus a short hash, so two versions are told apart.
fn file_chunk_id(file: &StoredFile) -> String {
    let short = file.sha256.get(..12).unwrap_or(&file.sha256);
    format!("file:{}@{short}", file.path)
}
