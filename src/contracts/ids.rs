//! Identifier newtypes that can only hold valid values: `SessionId`, `TurnId`, `ContextId`,
//! `RelativePath`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use unicode_normalization::UnicodeNormalization as _;
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory as _};
use uuid::Uuid;

use super::error::ErrorCode;

/// A session identifier: a UUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SessionId(Uuid);

impl SessionId {
    /// Wraps a UUID.
    pub fn new(id: Uuid) -> Self {
        SessionId(id)
    }

    /// A fresh random session id.
    pub fn random() -> Self {
        SessionId(Uuid::new_v4())
    }

    /// The UUID inside.
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for SessionId {
    type Err = (ErrorCode, String);

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().is_empty() {
            return Err((ErrorCode::SessionIdMissing, "SessionId is required".into()));
        }
        Uuid::parse_str(s).map(SessionId).map_err(|e| {
            (ErrorCode::SessionIdInvalid, format!("SessionId `{}` is not a UUID: {e}", clip(s)))
        })
    }
}

/// Maximum length of a `TurnId`.
pub const TURN_ID_MAX_LEN: usize = 128;

/// A client-chosen turn identifier: 1-128 characters of `[A-Za-z0-9._:-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct TurnId(String);

impl TurnId {
    /// The identifier as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TurnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for TurnId {
    type Err = (ErrorCode, String);

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err((ErrorCode::TurnIdMissing, "TurnId is required".into()));
        }
        if s.chars().count() > TURN_ID_MAX_LEN {
            return Err((
                ErrorCode::TurnIdInvalid,
                format!(
                    "TurnId is {} characters long; the limit is {TURN_ID_MAX_LEN}",
                    s.chars().count()
                ),
            ));
        }
        if let Some(bad) = s.chars().find(|c| !is_id_char(*c)) {
            return Err((
                ErrorCode::TurnIdInvalid,
                format!("TurnId contains {bad:?}; only letters, digits and `.`, `_`, `:`, `-` are allowed"),
            ));
        }
        Ok(TurnId(s.to_owned()))
    }
}

impl<'de> Deserialize<'de> for TurnId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(|(_, msg)| serde::de::Error::custom(msg))
    }
}

/// The identifier of a server-configured context (`AgentContextId`, `ConversationContextId`):
/// 1-64 characters of `[A-Za-z0-9._:-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ContextId(String);

impl ContextId {
    /// The identifier as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ContextId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for ContextId {
    type Err = InvalidName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() || s.len() > 64 || !s.chars().all(is_id_char) {
            let rule = "1-64 letters, digits, `.`, `_`, `:` or `-`";
            return Err(InvalidName { value: clip(s), what: "a context id", rule });
        }
        Ok(ContextId(s.to_owned()))
    }
}

impl<'de> Deserialize<'de> for ContextId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A backend instance that receives the replies of all its sessions on one queue,
/// `<prefix>.instance.<name>` (docs/client-protocol.md, "Replies per instance"): 1-64
/// characters of `[A-Za-z0-9._-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct InstanceName(String);

impl InstanceName {
    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InstanceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for InstanceName {
    type Err = InvalidName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if s.is_empty() || s.len() > 64 || !s.chars().all(ok) {
            let rule = "1-64 letters, digits, `.`, `_` or `-`";
            return Err(InvalidName { value: clip(s), what: "an instance name", rule });
        }
        Ok(InstanceName(s.to_owned()))
    }
}

impl<'de> Deserialize<'de> for InstanceName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A tenant's name (`tenants.<name>` in the configuration): 1-32 of `[a-z0-9_-]`, starting
/// with a letter or digit. It is a segment of the tenant's reply queue names, so it has no `.`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct TenantName(String);

impl TenantName {
    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for TenantName {
    type Err = InvalidName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-');
        let first_ok =
            s.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if !first_ok || s.len() > 32 || !s.chars().all(ok) {
            let rule =
                "1-32 lowercase letters, digits, `_` or `-`, starting with a letter or digit";
            return Err(InvalidName { value: clip(s), what: "a tenant name", rule });
        }
        Ok(TenantName(s.to_owned()))
    }
}

impl<'de> Deserialize<'de> for TenantName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// Where a turn's replies (and stream deltas) go: a reply queue of its tenant (all of them in a
/// single-tenant deployment), the backend instance's when the submission named one in
/// `reply_to`, else the session's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplyAddress {
    /// The session's tenant; `None` when no tenant is configured.
    pub tenant: Option<TenantName>,
    /// The backend instance that asked for the replies, if one did.
    pub instance: Option<InstanceName>,
}

/// A workspace-relative path: not absolute, no drive letter, no `..` segment, no NUL, no control
/// or invisible format character; NFKC-normalised, and checked in that form, so look-alikes such
/// as `．．/x` (full-width dots) are the traversal they resemble.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct RelativePath(String);

impl RelativePath {
    /// A path that was checked when its request was validated (read back from an inner message).
    pub(crate) fn trusted(path: String) -> Self {
        RelativePath(path)
    }

    /// The path as sent by the client, NFKC-normalised.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RelativePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for RelativePath {
    type Err = (ErrorCode, String);

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        if raw.is_empty() {
            return Err((ErrorCode::PathMissing, "RelativePath is required".into()));
        }
        if raw.contains('\0') {
            return Err((ErrorCode::PathNul, "RelativePath contains a NUL character".into()));
        }
        if let Some(c) = disguising_character(raw) {
            return Err((
                ErrorCode::PathFormatCharacter,
                format!(
                    "RelativePath `{}` contains U+{:04X}, a control or invisible format character (a \
                     bidi control, a zero-width character, ...) that can disguise a path",
                    clip(raw),
                    u32::from(c)
                ),
            ));
        }
        let p: String = raw.nfkc().collect();
        let shown =
            if p == raw { clip(raw) } else { format!("{}` (NFKC: `{}", clip(raw), clip(&p)) };
        if p.starts_with('/') || p.starts_with('\\') {
            return Err((
                ErrorCode::PathAbsolute,
                format!(
                    "RelativePath `{shown}` is absolute; send it relative to the workspace root"
                ),
            ));
        }
        let bytes = p.as_bytes();
        if bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':' {
            return Err((
                ErrorCode::PathDriveLetter,
                format!("RelativePath `{shown}` starts with a drive letter"),
            ));
        }
        if p.split(['/', '\\']).any(|seg| seg == "..") {
            return Err((
                ErrorCode::PathTraversal,
                format!("RelativePath `{shown}` has a `..` segment"),
            ));
        }
        Ok(RelativePath(p))
    }
}

impl<'de> Deserialize<'de> for RelativePath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(|(_, msg)| serde::de::Error::custom(msg))
    }
}

fn is_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')
}

/// The first character of `s` that can disguise a name: a control character (Unicode Cc; NUL
/// has its own error) or an invisible format character (Cf: bidi controls such as U+202E,
/// zero-width characters such as U+200B, the BOM, ...).
pub(crate) fn disguising_character(s: &str) -> Option<char> {
    s.chars()
        .find(|&c| c != '\0' && (c.is_control() || c.general_category() == GeneralCategory::Format))
}

/// `text` safe for an operator's terminal: control characters (ESC and the rest of C0 and C1)
/// and invisible format characters (bidi overrides, zero-width) are shown escaped (`\u{1b}`),
/// so client-supplied ids and reasons cannot move the cursor, recolour or hide text.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let hidden = |c: char| c == '\0' || disguising_character(c.encode_utf8(&mut [0; 4])).is_some();
    if !text.chars().any(hidden) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hidden(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Shortens user-supplied text quoted back in an error message, escaping what is not printable
/// (NUL included), so a quoted value can always be stored and shown.
pub(crate) fn clip(s: &str) -> String {
    const MAX: usize = 80;
    match s.char_indices().nth(MAX) {
        None => s.escape_debug().to_string(),
        Some((end, _)) => format!("{}…", s[..end].escape_debug()),
    }
}

/// A name that breaks its type's rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not {what}: use {rule}")]
pub struct InvalidName {
    /// The name (clipped).
    pub value: String,
    /// What it was read as.
    pub what: &'static str,
    /// The rule it breaks.
    pub rule: &'static str,
}
