//! The AGN-034 rules for what a user turn attaches: input artifacts (paths, names, encodings,
//! sizes, duplicates) and clipboard images (ids, MIME types, base64 data, sizes).

use std::collections::HashSet;

use base64::Engine as _;

use super::errors::Errors;
use super::{text, Limits};
use crate::contracts::ids::clip;
use crate::contracts::request::{ClipboardImageWire, InputArtifactWire};
use crate::contracts::validated::{ArtifactContents, ClipboardImage, InputArtifact, Origin};
use crate::contracts::{ErrorCode, RelativePath};

pub(super) fn artifacts(
    e: &mut Errors,
    wires: Vec<InputArtifactWire>,
    limits: &Limits,
) -> Option<Vec<InputArtifact>> {
    e.limit("InputArtifacts", "entries", wires.len(), "max_artifacts", limits.max_artifacts);
    let mut paths = HashSet::new();
    let parsed: Vec<Option<InputArtifact>> =
        wires.into_iter().enumerate().map(|(i, a)| artifact(e, i, a, &mut paths, limits)).collect();
    parsed.into_iter().collect()
}

fn artifact(
    e: &mut Errors,
    i: usize,
    a: InputArtifactWire,
    paths: &mut HashSet<String>,
    limits: &Limits,
) -> Option<InputArtifact> {
    let f = |name: &str| format!("InputArtifacts[{i}].{name}");
    let path = artifact_path(
        e,
        &f("RelativePath"),
        a.relative_path.as_deref().unwrap_or(""),
        paths,
        limits,
    );
    let file_name = match a.file_name.filter(|n| !n.trim().is_empty()) {
        None => {
            e.at(ErrorCode::FileNameMissing, f("FileName"), "FileName is required");
            None
        }
        Some(name) => text::file_name(e, &f("FileName"), name, limits),
    };
    let origin = match a.origin.as_deref() {
        Some("ide") => Some(Origin::Ide),
        Some("user") => Some(Origin::User),
        other => {
            let got = other.map_or("nothing".to_owned(), |o| format!("`{}`", clip(o)));
            e.at(
                ErrorCode::OriginInvalid,
                f("Origin"),
                format!("Origin must be `ide` or `user`, got {got}"),
            );
            None
        }
    };
    let mut hints_ok = true;
    for (name, value) in [("MimeType", &a.mime_type), ("Language", &a.language)] {
        if let Some(v) = value {
            hints_ok &= !e.chars_limit(&f(name), v, "max_name_chars", limits.max_name_chars);
        }
    }
    let contents = artifact_contents(e, &f, a.contents, a.encoding.as_deref(), limits);
    Some(InputArtifact {
        path: path?,
        file_name: file_name?,
        contents: contents?,
        origin: origin?,
        mime_type: a.mime_type.filter(|_| hints_ok),
        language: a.language.filter(|l| hints_ok && !l.trim().is_empty()),
    })
}

/// The artifact's path, within `limits.max_path_chars` and unique in the request (compared in
/// its normalised form).
fn artifact_path(
    e: &mut Errors,
    field: &str,
    raw: &str,
    paths: &mut HashSet<String>,
    limits: &Limits,
) -> Option<RelativePath> {
    if e.chars_limit(field, raw, "max_path_chars", limits.max_path_chars) {
        return None;
    }
    match raw.parse::<RelativePath>() {
        // NFKC may lengthen a path (U+FDFA is 18 characters): the limit holds for what is
        // stored and sent on too.
        Ok(p) if e.chars_limit(field, p.as_str(), "max_path_chars", limits.max_path_chars) => None,
        Ok(p) if !paths.insert(p.as_str().to_owned()) => {
            e.at(
                ErrorCode::PathDuplicate,
                field,
                format!("`{}` is sent more than once", clip(p.as_str())),
            );
            None
        }
        Ok(p) => Some(p),
        Err((code, msg)) => {
            e.at(code, field, msg);
            None
        }
    }
}

fn artifact_contents(
    e: &mut Errors,
    f: &dyn Fn(&str) -> String,
    contents: Option<String>,
    encoding: Option<&str>,
    limits: &Limits,
) -> Option<ArtifactContents> {
    let Some(contents) = contents else {
        e.at(ErrorCode::ContentsMissing, f("Contents"), "Contents is required (it may be empty)");
        return None;
    };
    let decoded = match encoding {
        None | Some("utf8") => ArtifactContents::Text(contents),
        Some("base64") => match decode_base64(compact_base64(contents)) {
            Ok(bytes) => text_or_binary(bytes),
            Err(msg) => {
                e.at(
                    ErrorCode::ContentsBase64Invalid,
                    f("Contents"),
                    format!("Contents is not valid base64: {msg}"),
                );
                return None;
            }
        },
        Some(other) => {
            e.at(
                ErrorCode::EncodingInvalid,
                f("Encoding"),
                format!("Encoding must be `utf8` or `base64`, got `{}`", clip(other)),
            );
            return None;
        }
    };
    e.limit(
        &f("Contents"),
        "bytes",
        decoded.as_bytes().len(),
        "max_artifact_bytes",
        limits.max_artifact_bytes,
    );
    Some(decoded)
}

/// Decoded base64 is text when it is UTF-8 without NUL. A NUL makes it binary, as the indexer
/// decides for files on disk: no text file holds one (UTF-16 text does, and is valid UTF-8 byte
/// for byte), and text with NUL could not be stored. Binary files are not sent to the model; the
/// turn's reply warns that they were skipped.
fn text_or_binary(bytes: Vec<u8>) -> ArtifactContents {
    if bytes.contains(&0) {
        return ArtifactContents::Binary(bytes);
    }
    match String::from_utf8(bytes) {
        Ok(text) => ArtifactContents::Text(text),
        Err(err) => ArtifactContents::Binary(err.into_bytes()),
    }
}

pub(super) fn images(
    e: &mut Errors,
    wires: Vec<ClipboardImageWire>,
    limits: &Limits,
) -> Option<Vec<ClipboardImage>> {
    e.limit("ClipboardImages", "entries", wires.len(), "max_images", limits.max_images);
    let mut ids = HashSet::new();
    let parsed: Vec<Option<ClipboardImage>> =
        wires.into_iter().enumerate().map(|(i, img)| image(e, i, img, &mut ids, limits)).collect();
    parsed.into_iter().collect()
}

fn image(
    e: &mut Errors,
    i: usize,
    img: ClipboardImageWire,
    ids: &mut HashSet<String>,
    limits: &Limits,
) -> Option<ClipboardImage> {
    let f = |name: &str| format!("ClipboardImages[{i}].{name}");
    let id = match img.id.filter(|s| !s.is_empty()) {
        None => {
            e.at(ErrorCode::ImageIdMissing, f("Id"), "Id is required");
            None
        }
        Some(id) if e.chars_limit(&f("Id"), &id, "max_name_chars", limits.max_name_chars) => None,
        Some(id) if !ids.insert(id.clone()) => {
            e.at(
                ErrorCode::ImageIdDuplicate,
                f("Id"),
                format!("image Id `{}` appears more than once", clip(&id)),
            );
            None
        }
        Some(id) => Some(id),
    };
    let mime = image_mime(e, &f("MimeType"), img.mime_type, limits);
    let data_base64 = compact_base64(img.data_base64.unwrap_or_default());
    let len = match decode_base64_len(&data_base64) {
        Ok(0) => {
            e.at(
                ErrorCode::ImageBase64Invalid,
                f("DataBase64"),
                "DataBase64 is required and must not be empty",
            );
            None
        }
        Ok(n) => {
            e.limit(&f("DataBase64"), "bytes", n, "max_image_bytes", limits.max_image_bytes);
            Some(n)
        }
        Err(msg) => {
            e.at(
                ErrorCode::ImageBase64Invalid,
                f("DataBase64"),
                format!("DataBase64 is not valid base64: {msg}"),
            );
            None
        }
    };
    Some(ClipboardImage { id: id?, mime_type: mime?, data_base64, byte_len: len? })
}

/// An `image/*` MIME type without parameters, lowercased, within `limits.max_name_chars`.
fn image_mime(e: &mut Errors, field: &str, raw: Option<String>, limits: &Limits) -> Option<String> {
    if raw
        .as_ref()
        .is_some_and(|m| e.chars_limit(field, m, "max_name_chars", limits.max_name_chars))
    {
        return None;
    }
    match raw.map(|m| m.trim().to_ascii_lowercase()) {
        Some(m)
            if m.strip_prefix("image/")
                .is_some_and(|sub| !sub.is_empty() && !sub.contains(['/', ';', ' '])) =>
        {
            Some(m)
        }
        other => {
            let got = other.map_or("nothing".to_owned(), |m| format!("`{}`", clip(&m)));
            e.at(
                ErrorCode::ImageMimeInvalid,
                field,
                format!("MimeType must be an image/* type, got {got}"),
            );
            None
        }
    }
}

/// Base64 without the line breaks MIME allows, reusing the string when it has none.
fn compact_base64(data: String) -> String {
    if data.bytes().any(|b| b.is_ascii_whitespace()) {
        data.chars().filter(|c| !c.is_ascii_whitespace()).collect()
    } else {
        data
    }
}

fn decode_base64(compact: String) -> Result<Vec<u8>, base64::DecodeError> {
    base64::engine::general_purpose::STANDARD.decode(compact.as_bytes())
}

/// Why compact base64 does not decode.
#[derive(Debug, thiserror::Error)]
enum Base64Error {
    /// `=` in the middle.
    #[error("padding `=` before the end")]
    EarlyPadding,
    /// Not base64 (offsets from the start of the data).
    #[error(transparent)]
    Decode(#[from] base64::DecodeError),
    /// The piece buffer was too small (a bug here, never the data's).
    #[error(transparent)]
    Buffer(#[from] base64::DecodeSliceError),
}

/// The decoded size of compact base64, checked in pieces so no copy of the image is made.
fn decode_base64_len(compact: &str) -> Result<usize, Base64Error> {
    // A multiple of 4 characters decodes on its own; padding is only allowed in the last piece.
    const PIECE: usize = 16 * 1024;
    let engine = base64::engine::general_purpose::STANDARD;
    let mut buf = vec![0u8; PIECE / 4 * 3];
    let bytes = compact.as_bytes();
    let mut total = 0;
    for (n, piece) in bytes.chunks(PIECE).enumerate() {
        let last = (n + 1) * PIECE >= bytes.len();
        if !last && piece.contains(&b'=') {
            return Err(Base64Error::EarlyPadding);
        }
        total += engine.decode_slice(piece, &mut buf).map_err(|e| offset_error(e, n * PIECE))?;
    }
    Ok(total)
}

/// A decode error of one piece, with offsets counted from the start of the data.
fn offset_error(e: base64::DecodeSliceError, start: usize) -> Base64Error {
    use base64::{DecodeError, DecodeSliceError};
    let e = match e {
        DecodeSliceError::DecodeError(e) => e,
        DecodeSliceError::OutputSliceTooSmall => return e.into(),
    };
    let shifted = match e {
        DecodeError::InvalidByte(at, b) => DecodeError::InvalidByte(start + at, b),
        DecodeError::InvalidLastSymbol(at, b) => DecodeError::InvalidLastSymbol(start + at, b),
        DecodeError::InvalidLength(n) => DecodeError::InvalidLength(start + n),
        other => other,
    };
    shifted.into()
}
