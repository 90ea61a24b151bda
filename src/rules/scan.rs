//! The pass over a request body that runs before any typed deserialization: JSON syntax, the
//! document's kind, top-level property names, and the length of every list the request may
//! hold (`InputArtifacts`, `ClipboardImages`, `ToolResults`, `RagScope` and each condition's
//! `Values`). It builds nothing per element, so a list over its limit is refused for the price
//! of reading it; then [`known_fields`] borrows each known property's raw JSON for the typed
//! read, so unknown properties never have to be copied or parsed into a tree.

use std::borrow::Cow;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::errors::Errors;
use super::skim::{scalars, ConditionValues, Count, Key, Kind, Skip};
use super::Limits;
use crate::contracts::ids::clip;
use crate::contracts::request::{FORBIDDEN_FIELDS, REQUEST_FIELDS};
use crate::contracts::{ApiError, ErrorCode};

/// What the scan found besides the errors it recorded.
#[derive(Debug)]
pub(super) struct Scanned {
    /// `None` for an object, else what the document is ("an array", "null", ...).
    pub not_object: Option<&'static str>,
    /// A list was over its limit (the errors say which).
    pub over_limit: bool,
}

/// Reads the whole document once. Errors about names and list lengths go to `e`; a syntax error
/// (nesting deeper than serde_json's limit of 128 included) is returned.
pub(super) fn scan(
    text: &str,
    limits: &Limits,
    e: &mut Errors,
) -> Result<Scanned, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let scanned = TopLevel { limits, e }.deserialize(&mut de)?;
    de.end()?;
    Ok(scanned)
}

/// The known top-level properties with their raw JSON, borrowed from `text`, in document order.
pub(super) fn known_fields(
    text: &str,
) -> Result<Vec<(Cow<'_, str>, &RawValue)>, serde_json::Error> {
    struct Known;
    impl<'de> Visitor<'de> for Known {
        type Value = Vec<(Cow<'de, str>, &'de RawValue)>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(Key(key)) = map.next_key()? {
                if REQUEST_FIELDS.contains(&key.as_ref()) {
                    out.push((key, map.next_value::<&RawValue>()?));
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(out)
        }
    }
    serde_json::Deserializer::from_str(text).deserialize_map(Known)
}

/// `request.unknown_field` or `request.forbidden_field` for a top-level name, `None` when known.
pub(super) fn field_name_error(key: &str) -> Option<ApiError> {
    if REQUEST_FIELDS.contains(&key) {
        return None;
    }
    if FORBIDDEN_FIELDS.iter().any(|f| f.eq_ignore_ascii_case(key)) {
        return Some(ApiError::at(
            ErrorCode::RequestForbiddenField,
            key,
            format!(
                "`{}` is server-owned and must not appear in a request (AGN-034 §3)",
                clip(key)
            ),
        ));
    }
    let hint = REQUEST_FIELDS
        .iter()
        .find(|f| f.eq_ignore_ascii_case(key))
        .map(|f| format!("; property names are PascalCase: did you mean `{f}`?"))
        .unwrap_or_default();
    Some(ApiError::at(
        ErrorCode::RequestUnknownField,
        clip(key),
        format!("`{}` is not an AgentExecuteRequest property{hint}", clip(key)),
    ))
}

/// `RagScope`: the number of conditions, and each condition's number of `Values` checked against
/// `limits.max_rag_scope_values` as it goes by.
struct Scope<'a> {
    limits: &'a Limits,
    /// Conditions whose `Values` are over the limit: `(index, count)`, the first few only.
    over: Vec<(usize, usize)>,
    /// How many more were over.
    more: usize,
}

impl<'de> Visitor<'de> for &mut Scope<'_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    scalars!(None);
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut n = 0;
        while let Some(ConditionValues(values)) = seq.next_element()? {
            match values {
                Some(v) if v > self.limits.max_rag_scope_values => {
                    if self.over.len() < self.limits.max_errors {
                        self.over.push((n, v));
                    } else {
                        self.more += 1;
                    }
                }
                _ => {}
            }
            n += 1;
        }
        Ok(Some(n))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Kind.visit_map(map).map(|_| None)
    }
}

impl<'de> DeserializeSeed<'de> for &mut Scope<'_> {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// The top-level document.
struct TopLevel<'a> {
    limits: &'a Limits,
    e: &'a mut Errors,
}

impl TopLevel<'_> {
    /// Records a list's length against its limit; true when over.
    fn list(
        &mut self,
        field: &str,
        count: Option<usize>,
        what: &str,
        key: &str,
        max: usize,
    ) -> bool {
        let n = count.unwrap_or(0);
        self.e.limit(field, what, n, key, max);
        n > max
    }

    fn name(&mut self, key: &str) {
        if self.e.has_room() {
            if let Some(err) = field_name_error(key) {
                self.e.push(err);
            }
        } else if !REQUEST_FIELDS.contains(&key) {
            self.e.count_only();
        }
    }

    fn scope(&mut self, mut scope: Scope<'_>, conditions: Option<usize>) -> bool {
        let l = self.limits;
        let mut over = self.list(
            "RagScope",
            conditions,
            "conditions",
            "max_rag_scope_conditions",
            l.max_rag_scope_conditions,
        );
        for (i, n) in scope.over.drain(..) {
            over = true;
            self.e.limit(
                &format!("RagScope[{i}].Values"),
                "values",
                n,
                "max_rag_scope_values",
                l.max_rag_scope_values,
            );
        }
        for _ in 0..scope.more {
            self.e.count_only();
        }
        over
    }
}

impl<'de> DeserializeSeed<'de> for TopLevel<'_> {
    type Value = Scanned;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Scanned, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TopLevel<'_> {
    type Value = Scanned;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON document")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Scanned, E> {
        Ok(not_object("a boolean"))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Scanned, E> {
        Ok(not_object("a number"))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Scanned, E> {
        Ok(not_object("a number"))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Scanned, E> {
        Ok(not_object("a number"))
    }
    fn visit_str<E>(self, _: &str) -> Result<Scanned, E> {
        Ok(not_object("a string"))
    }
    fn visit_unit<E>(self) -> Result<Scanned, E> {
        Ok(not_object("null"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Scanned, A::Error> {
        Kind.visit_seq(seq).map(not_object)
    }
    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Scanned, A::Error> {
        let l = self.limits;
        let mut over_limit = false;
        while let Some(Key(key)) = map.next_key()? {
            let over = match key.as_ref() {
                "InputArtifacts" => {
                    let n = map.next_value::<Count>()?.0;
                    self.list("InputArtifacts", n, "entries", "max_artifacts", l.max_artifacts)
                }
                "ClipboardImages" => {
                    let n = map.next_value::<Count>()?.0;
                    self.list("ClipboardImages", n, "entries", "max_images", l.max_images)
                }
                "ToolResults" => {
                    let n = map.next_value::<Count>()?.0;
                    self.list("ToolResults", n, "results", "max_tool_results", l.max_tool_results)
                }
                "ToolApprovals" => {
                    let n = map.next_value::<Count>()?.0;
                    self.list(
                        "ToolApprovals",
                        n,
                        "decisions",
                        "max_tool_results",
                        l.max_tool_results,
                    )
                }
                "RagScope" => {
                    let mut scope = Scope { limits: l, over: Vec::new(), more: 0 };
                    let n = map.next_value_seed(&mut scope)?;
                    self.scope(scope, n)
                }
                other => {
                    self.name(other);
                    map.next_value::<Skip>()?;
                    false
                }
            };
            over_limit |= over;
        }
        Ok(Scanned { not_object: None, over_limit })
    }
}

fn not_object(kind: &'static str) -> Scanned {
    Scanned { not_object: Some(kind), over_limit: false }
}
