//! The AGN-034 rules for what a user turn attaches: input artifacts (paths, encodings,
//! sizes, duplicates) and clipboard images (ids, MIME types, base64 data, sizes).

use std::collections::HashSet;

use base64::Engine as _;

use super::rules::Errors;
use super::Limits;
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
    let path = match a.relative_path.as_deref().unwrap_or("").parse::<RelativePath>() {
        Ok(p) if !paths.insert(p.as_str().to_owned()) => {
            e.at(ErrorCode::PathDuplicate, f("RelativePath"), format!("`{p}` is sent more than once"));
            None
        }
        Ok(p) => Some(p),
        Err((code, msg)) => {
            e.at(code, f("RelativePath"), msg);
            None
        }
    };
    let file_name = a.file_name.filter(|n| !n.trim().is_empty());
    if file_name.is_none() {
        e.at(ErrorCode::FileNameMissing, f("FileName"), "FileName is required");
    }
    let origin = match a.origin.as_deref() {
        Some("ide") => Some(Origin::Ide),
        Some("user") => Some(Origin::User),
        other => {
            let got = other.map_or("nothing".to_owned(), |o| format!("`{}`", crate::contracts::ids::clip(o)));
            e.at(ErrorCode::OriginInvalid, f("Origin"), format!("Origin must be `ide` or `user`, got {got}"));
            None
        }
    };
    let contents = artifact_contents(e, &f, a.contents, a.encoding.as_deref(), limits);
    Some(InputArtifact {
        path: path?,
        file_name: file_name?,
        contents: contents?,
        origin: origin?,
        mime_type: a.mime_type,
        language: a.language.filter(|l| !l.trim().is_empty()),
    })
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
        Some("base64") => match decode_base64(&contents) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => ArtifactContents::Text(text),
                Err(err) => ArtifactContents::Binary(err.into_bytes()),
            },
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
                format!("Encoding must be `utf8` or `base64`, got `{}`", crate::contracts::ids::clip(other)),
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

pub(super) fn images(
    e: &mut Errors,
    wires: Vec<ClipboardImageWire>,
    limits: &Limits,
) -> Option<Vec<ClipboardImage>> {
    e.limit("ClipboardImages", "entries", wires.len(), "max_images", limits.max_images);
    let mut ids = HashSet::new();
    let parsed: Vec<Option<ClipboardImage>> = wires
        .into_iter()
        .enumerate()
        .map(|(i, img)| {
            let f = |name: &str| format!("ClipboardImages[{i}].{name}");
            let id = match img.id.filter(|s| !s.is_empty()) {
                None => {
                    e.at(ErrorCode::ImageIdMissing, f("Id"), "Id is required");
                    None
                }
                Some(id) if !ids.insert(id.clone()) => {
                    e.at(
                        ErrorCode::ImageIdDuplicate,
                        f("Id"),
                        format!("image Id `{id}` appears more than once"),
                    );
                    None
                }
                Some(id) => Some(id),
            };
            let mime = img.mime_type.map(|m| m.trim().to_ascii_lowercase());
            let mime = match mime {
                Some(m)
                    if m.strip_prefix("image/")
                        .is_some_and(|sub| !sub.is_empty() && !sub.contains(['/', ';', ' '])) =>
                {
                    Some(m)
                }
                other => {
                    let got = other
                        .map_or("nothing".to_owned(), |m| format!("`{}`", crate::contracts::ids::clip(&m)));
                    e.at(
                        ErrorCode::ImageMimeInvalid,
                        f("MimeType"),
                        format!("MimeType must be an image/* type, got {got}"),
                    );
                    None
                }
            };
            let data = img.data_base64.unwrap_or_default();
            let len = match decode_base64(&data) {
                Ok(bytes) if !bytes.is_empty() => {
                    e.limit(
                        &f("DataBase64"),
                        "bytes",
                        bytes.len(),
                        "max_image_bytes",
                        limits.max_image_bytes,
                    );
                    Some(bytes.len())
                }
                Ok(_) => {
                    e.at(
                        ErrorCode::ImageBase64Invalid,
                        f("DataBase64"),
                        "DataBase64 is required and must not be empty",
                    );
                    None
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
            let data_base64: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
            Some(ClipboardImage { id: id?, mime_type: mime?, data_base64, byte_len: len? })
        })
        .collect();
    parsed.into_iter().collect()
}

fn decode_base64(data: &str) -> Result<Vec<u8>, String> {
    let compact: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD.decode(compact.as_bytes()).map_err(|e| e.to_string())
}
