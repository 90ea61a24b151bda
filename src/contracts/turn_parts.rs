//! What a validated user turn is made of: input artifacts, clipboard images and `RagScope`
//! conditions, each built by `crate::rules` (or read back trusted) and never invalid.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::ids::RelativePath;

/// Who supplied an artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Reported by the IDE (open or modified file).
    Ide,
    /// Supplied explicitly by the user.
    User,
}

impl Origin {
    /// Wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Ide => "ide",
            Origin::User => "user",
        }
    }
}

/// Decoded artifact contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArtifactContents {
    /// UTF-8 text (sent as `utf8`, or base64 that decoded to valid UTF-8).
    Text(String),
    /// Bytes that are not UTF-8 text.
    Binary(Vec<u8>),
}

impl ArtifactContents {
    /// The raw bytes, for hashing and size checks.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            ArtifactContents::Text(t) => t.as_bytes(),
            ArtifactContents::Binary(b) => b,
        }
    }
}

/// A validated input artifact.
#[derive(Debug, Clone, PartialEq)]
pub struct InputArtifact {
    pub(crate) path: RelativePath,
    pub(crate) file_name: String,
    pub(crate) contents: ArtifactContents,
    pub(crate) origin: Origin,
    pub(crate) mime_type: Option<String>,
    pub(crate) language: Option<String>,
}

impl InputArtifact {
    /// Workspace-relative path.
    pub fn path(&self) -> &RelativePath {
        &self.path
    }
    /// File name.
    pub fn file_name(&self) -> &str {
        &self.file_name
    }
    /// Decoded contents.
    pub fn contents(&self) -> &ArtifactContents {
        &self.contents
    }
    /// Who supplied it.
    pub fn origin(&self) -> Origin {
        self.origin
    }
    /// MIME type hint.
    pub fn mime_type(&self) -> Option<&str> {
        self.mime_type.as_deref()
    }
    /// Language hint.
    pub fn language(&self) -> Option<&str> {
        self.language.as_deref()
    }
    /// SHA-256 (hex) of the contents.
    pub fn sha256(&self) -> String {
        hex::encode(Sha256::digest(self.contents.as_bytes()))
    }
}

/// A validated clipboard image: `image/*` and base64 that decodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClipboardImage {
    pub(crate) id: String,
    pub(crate) mime_type: String,
    pub(crate) data_base64: String,
    pub(crate) byte_len: usize,
}

impl ClipboardImage {
    /// Client id.
    pub fn id(&self) -> &str {
        &self.id
    }
    /// `image/*` MIME type, lowercase.
    pub fn mime_type(&self) -> &str {
        &self.mime_type
    }
    /// Standard base64 of the image bytes.
    pub fn data_base64(&self) -> &str {
        &self.data_base64
    }
    /// Decoded size in bytes.
    pub fn byte_len(&self) -> usize {
        self.byte_len
    }
    /// `data:<mime>;base64,<data>` as the Responses API's `input_image` expects.
    pub fn data_url(&self) -> String {
        format!("data:{};base64,{}", self.mime_type, self.data_base64)
    }
}

/// A `RagScope` operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScopeOperator {
    /// `==`: the field equals any of the values.
    #[serde(rename = "==")]
    Eq,
    /// `!=`: the field equals none of the values.
    #[serde(rename = "!=")]
    Ne,
    /// `contains`: the field contains every value.
    #[serde(rename = "contains")]
    Contains,
    /// `does_not_contain`: the field contains none of the values.
    #[serde(rename = "does_not_contain")]
    DoesNotContain,
}

impl ScopeOperator {
    /// Wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ScopeOperator::Eq => "==",
            ScopeOperator::Ne => "!=",
            ScopeOperator::Contains => "contains",
            ScopeOperator::DoesNotContain => "does_not_contain",
        }
    }

    /// Parses the wire spelling (exact, case-sensitive).
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Eq, Self::Ne, Self::Contains, Self::DoesNotContain]
            .into_iter()
            .find(|op| op.as_str() == s)
    }
}

/// A validated `RagScope` condition with at least one value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScopeCondition {
    pub(crate) key: String,
    pub(crate) operator: ScopeOperator,
    pub(crate) values: Vec<String>,
}

impl ScopeCondition {
    /// A condition built by a program (a benchmark, a tool), not read from a client.
    pub fn new(key: String, operator: ScopeOperator, values: Vec<String>) -> Self {
        ScopeCondition { key, operator, values }
    }

    /// Payload key.
    pub fn key(&self) -> &str {
        &self.key
    }
    /// Operator.
    pub fn operator(&self) -> ScopeOperator {
        self.operator
    }
    /// Values (never empty).
    pub fn values(&self) -> &[String] {
        &self.values
    }
}
