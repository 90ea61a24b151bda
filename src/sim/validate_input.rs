//! Validation of `input` items: message roles, content part types per role (`input_text` for
//! user/system/developer, `output_text`/`refusal` for assistant, never Chat's `text`), image
//! parts (`image_url` a string holding an http(s) URL or a base64 data URL of a real JPEG, PNG,
//! GIF or WebP), and the tool-call item shapes.

use base64::Engine as _;
use serde_json::{Map, Value};

use super::errors::ApiFailure;

const ROLES: &str = "'assistant', 'system', 'developer', and 'user'";
const PART_TYPES: &str =
    "'input_text', 'input_image', 'output_text', 'refusal', 'input_file', 'computer_screenshot', and 'summary_text'";
const KNOWN_PARTS: &[&str] = &[
    "input_text",
    "input_image",
    "output_text",
    "refusal",
    "input_file",
    "computer_screenshot",
    "summary_text",
];
const ITEM_TYPES: &str =
    "'message', 'function_call', 'function_call_output', 'reasoning', and 'item_reference'";

/// Checks `input[i]`.
pub(crate) fn item(i: usize, item: &Value) -> Result<(), ApiFailure> {
    let p = format!("input[{i}]");
    let Some(obj) = item.as_object() else {
        return Err(ApiFailure::invalid_type(&p, "an object", item));
    };
    match obj.get("type").map(|t| t.as_str().ok_or(t)) {
        None | Some(Ok("message")) => message(&p, obj),
        Some(Ok("function_call_output")) => {
            require_string(obj, &p, "call_id")?;
            match obj.get("output") {
                None => Err(ApiFailure::missing(&format!("{p}.output"))),
                Some(Value::String(_) | Value::Array(_)) => Ok(()),
                Some(other) => Err(ApiFailure::invalid_type(
                    &format!("{p}.output"),
                    "a string or an array",
                    other,
                )),
            }
        }
        Some(Ok("function_call")) => {
            for key in ["call_id", "name", "arguments"] {
                require_string(obj, &p, key)?;
            }
            Ok(())
        }
        Some(Ok("reasoning" | "item_reference")) => Ok(()),
        Some(Ok(other)) => Err(ApiFailure::invalid_value(&format!("{p}.type"), other, ITEM_TYPES)),
        Some(Err(other)) => Err(ApiFailure::invalid_type(&format!("{p}.type"), "a string", other)),
    }
}

fn require_string(obj: &Map<String, Value>, p: &str, key: &str) -> Result<(), ApiFailure> {
    match obj.get(key) {
        Some(Value::String(_)) => Ok(()),
        None | Some(Value::Null) => Err(ApiFailure::missing(&format!("{p}.{key}"))),
        Some(other) => Err(ApiFailure::invalid_type(&format!("{p}.{key}"), "a string", other)),
    }
}

fn message(p: &str, obj: &Map<String, Value>) -> Result<(), ApiFailure> {
    let role = match obj.get("role") {
        None => return Err(ApiFailure::missing(&format!("{p}.role"))),
        Some(Value::String(r))
            if ["user", "assistant", "system", "developer"].contains(&r.as_str()) =>
        {
            r.as_str()
        }
        Some(Value::String(r)) => {
            return Err(ApiFailure::invalid_value(&format!("{p}.role"), r, ROLES))
        }
        Some(other) => {
            return Err(ApiFailure::invalid_type(&format!("{p}.role"), "a string", other))
        }
    };
    let parts = match obj.get("content") {
        None => return Err(ApiFailure::missing(&format!("{p}.content"))),
        Some(Value::String(_)) => return Ok(()),
        Some(Value::Array(parts)) => parts,
        Some(other) => {
            return Err(ApiFailure::invalid_type(
                &format!("{p}.content"),
                "a string or an array",
                other,
            ))
        }
    };
    for (j, part) in parts.iter().enumerate() {
        let pp = format!("{p}.content[{j}]");
        let Some(part) = part.as_object() else {
            return Err(ApiFailure::invalid_type(&pp, "an object", part));
        };
        let kind = match part.get("type") {
            None => return Err(ApiFailure::missing(&format!("{pp}.type"))),
            Some(Value::String(t)) if KNOWN_PARTS.contains(&t.as_str()) => t.as_str(),
            Some(Value::String(t)) => {
                return Err(ApiFailure::invalid_value(&format!("{pp}.type"), t, PART_TYPES))
            }
            Some(other) => {
                return Err(ApiFailure::invalid_type(&format!("{pp}.type"), "a string", other))
            }
        };
        if role == "assistant" {
            if !["output_text", "refusal"].contains(&kind) {
                return Err(ApiFailure::invalid_value(&pp, kind, "'output_text' and 'refusal'"));
            }
        } else if !["input_text", "input_image", "input_file"].contains(&kind) {
            return Err(ApiFailure::invalid_value(
                &pp,
                kind,
                "'input_text', 'input_image', and 'input_file'",
            ));
        }
        match kind {
            "input_text" | "output_text" => require_string(part, &pp, "text")?,
            "refusal" => require_string(part, &pp, "refusal")?,
            "input_image" => image(&pp, part)?,
            "input_file"
                if !["file_id", "file_data", "file_url"].iter().any(|k| part.contains_key(*k)) =>
            {
                return Err(ApiFailure::missing(&format!("{pp}.file_data")));
            }
            _ => {}
        }
    }
    Ok(())
}

fn image(pp: &str, part: &Map<String, Value>) -> Result<(), ApiFailure> {
    let param = format!("{pp}.image_url");
    match part.get("image_url") {
        Some(Value::String(url)) => image_url(&param, url)?,
        None | Some(Value::Null) if part.get("file_id").is_some_and(Value::is_string) => {}
        None | Some(Value::Null) => return Err(ApiFailure::missing(&param)),
        Some(other) => return Err(ApiFailure::invalid_type(&param, "an image URL", other)),
    }
    match part.get("detail") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(d)) if ["low", "high", "auto", "original"].contains(&d.as_str()) => {
            Ok(())
        }
        Some(Value::String(d)) => Err(ApiFailure::invalid_value(
            &format!("{pp}.detail"),
            d,
            "'low', 'high', 'auto', and 'original'",
        )),
        Some(other) => Err(ApiFailure::invalid_type(&format!("{pp}.detail"), "a string", other)),
    }
}

fn image_url(param: &str, url: &str) -> Result<(), ApiFailure> {
    if url.starts_with("https://") || url.starts_with("http://") {
        return Ok(());
    }
    let bad_url = || {
        let message = format!(
            "Invalid '{param}'. Expected a base64-encoded data URL with an image MIME type \
             (e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got an invalid value."
        );
        ApiFailure::invalid(message, Some(param), Some("invalid_value"))
    };
    let Some((mime, data)) = url.strip_prefix("data:").and_then(|rest| rest.split_once(";base64,"))
    else {
        return Err(bad_url());
    };
    if !mime.starts_with("image/") {
        return Err(ApiFailure::invalid(
            "Invalid MIME type. Only image types are supported.",
            Some(param),
            Some("invalid_image_format"),
        ));
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(data).map_err(|_| bad_url())?;
    let is_image = bytes.starts_with(b"\x89PNG\r\n\x1a\n")
        || bytes.starts_with(b"\xff\xd8\xff")
        || bytes.starts_with(b"GIF8")
        || (bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP");
    if !is_image {
        return Err(ApiFailure::invalid(
            "The image data you provided does not represent a valid image. Please check your input and try again \
             with one of the supported image formats: ['image/jpeg', 'image/png', 'image/gif', 'image/webp'].",
            Some(param),
            Some("invalid_value"),
        ));
    }
    Ok(())
}
