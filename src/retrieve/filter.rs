//! `RagScope` conditions and the request's `Repo` as one backend-neutral [`FilterSpec`], and its
//! translation to a Qdrant Edge filter and a Qdrant server filter (same semantics in both).
//!
//! Mapping (conditions are ANDed):
//! - keys: `path` (aliases `file`, `filepath`, `relativepath`), `language` (`lang`), `repo`
//!   (`repository`), case-insensitive, `_`/`-` ignored. Any other key maps to no payload field:
//!   the condition is ignored and a [`UserWarning`] says so (AGN-034 calls scope advisory).
//! - `==`: the field equals any of the values; `!=`: it equals none of them.
//! - `contains` / `does_not_contain` on `path`: every / none of the values is a whole path
//!   component, a run of components, a file stem or an extension, case-insensitively
//!   (`ui/primitives`, `Button.tsx`, `Button`, `.tsx`; not `primitiv`). This is the indexed
//!   `path_segs` keyword array; see [`super::payload::path_components`].
//! - `contains` / `does_not_contain` on other fields: exact substring of the stored value.

use crate::contracts::{ScopeCondition, ScopeOperator, UserWarning};

use super::payload::{path_query, PATH_SEGS};
#[cfg(feature = "embedded-store")]
use super::RetrieveError;

/// Warning code put on the final response when a scope condition was ignored.
pub const SCOPE_KEY_IGNORED: &str = "retrieval.scope_key_ignored";

/// Warning code put on the final response when substring values past
/// [`MAX_SUBSTRING_VALUES`] were left out of the filter.
pub const SCOPE_SUBSTRINGS_CUT: &str = "retrieval.scope_substrings_cut";

/// Most `contains` / `does_not_contain` values on `language` and `repo` one search applies.
/// Each is an unindexed scan of every candidate point (11–16 ms per condition at 20k points,
/// measured for `super::payload::path_components`), and a request may name 2,048 values:
/// enough to hold the store's query slots, shared by every tenant, for seconds per search.
/// RagScope is advisory (AGN-034), so the rest are left out with a warning.
pub const MAX_SUBSTRING_VALUES: usize = 8;

/// One field condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cond {
    /// The keyword field equals any of the values.
    Keyword {
        /// Payload field.
        field: &'static str,
        /// Accepted values (at least one).
        values: Vec<String>,
    },
    /// The field's value contains this substring.
    Substring {
        /// Payload field.
        field: &'static str,
        /// The substring.
        value: String,
    },
}

/// A backend-neutral filter: every `must` holds and no `must_not` holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilterSpec {
    /// Conditions that must all hold.
    pub must: Vec<Cond>,
    /// Conditions none of which may hold.
    pub must_not: Vec<Cond>,
}

impl FilterSpec {
    /// Whether the filter restricts nothing.
    pub fn is_empty(&self) -> bool {
        self.must.is_empty() && self.must_not.is_empty()
    }
}

/// The payload field a `RagScope` key refers to, if any.
pub fn payload_field(key: &str) -> Option<&'static str> {
    let k: String =
        key.chars().filter(|c| !matches!(c, '_' | '-' | ' ')).collect::<String>().to_lowercase();
    match k.as_str() {
        "path" | "file" | "filepath" | "relativepath" => Some("path"),
        "language" | "lang" => Some("language"),
        "repo" | "repository" => Some("repo"),
        _ => None,
    }
}

/// Builds the filter for a request's `Repo` and `RagScope`, with a warning per ignored condition.
pub fn build(repo: Option<&str>, scope: &[ScopeCondition]) -> (FilterSpec, Vec<UserWarning>) {
    let mut spec = FilterSpec::default();
    let mut warnings = Vec::new();
    let mut substrings = 0usize;
    let mut cut = 0usize;
    if let Some(repo) = repo.filter(|r| !r.trim().is_empty()) {
        spec.must.push(Cond::Keyword { field: "repo", values: vec![repo.to_owned()] });
    }
    for cond in scope {
        let Some(field) = payload_field(cond.key()) else {
            warnings.push(UserWarning {
                code: SCOPE_KEY_IGNORED.to_owned(),
                message: format!(
                    "RagScope key `{}` matches no indexed field (path, language, repo); the condition was ignored",
                    cond.key()
                ),
            });
            continue;
        };
        // Language tags are stored lower-case; let `Rust` match `rust`.
        let norm =
            |v: &String| if field == "language" { v.trim().to_lowercase() } else { v.clone() };
        let values: Vec<String> = cond.values().iter().map(norm).collect();
        match cond.operator() {
            ScopeOperator::Eq => spec.must.push(Cond::Keyword { field, values }),
            ScopeOperator::Ne => spec.must_not.push(Cond::Keyword { field, values }),
            ScopeOperator::Contains | ScopeOperator::DoesNotContain => {
                let mut kept = Vec::new();
                for v in &values {
                    let c = contains(field, v);
                    if matches!(c, Cond::Substring { .. }) {
                        if substrings == MAX_SUBSTRING_VALUES {
                            cut += 1;
                            continue;
                        }
                        substrings += 1;
                    }
                    kept.push(c);
                }
                if cond.operator() == ScopeOperator::Contains {
                    spec.must.extend(kept);
                } else {
                    spec.must_not.extend(kept);
                }
            }
        }
    }
    if cut > 0 {
        warnings.push(UserWarning {
            code: SCOPE_SUBSTRINGS_CUT.to_owned(),
            message: format!(
                "RagScope names {} `contains`/`does_not_contain` values on language or repo; the first {MAX_SUBSTRING_VALUES} were applied and {cut} left out",
                MAX_SUBSTRING_VALUES + cut
            ),
        });
    }
    (spec, warnings)
}

fn contains(field: &'static str, value: &str) -> Cond {
    if field == "path" {
        Cond::Keyword { field: PATH_SEGS, values: vec![path_query(value)] }
    } else {
        Cond::Substring { field, value: value.to_owned() }
    }
}

/// The filter as Qdrant Edge understands it; `None` when it restricts nothing.
#[cfg(feature = "embedded-store")]
pub fn to_edge(spec: &FilterSpec) -> Result<Option<qdrant_edge::Filter>, RetrieveError> {
    use qdrant_edge::{Condition, FieldCondition, JsonPath, Match, MatchText};
    if spec.is_empty() {
        return Ok(None);
    }
    let convert = |conds: &[Cond]| -> Result<Option<Vec<Condition>>, RetrieveError> {
        if conds.is_empty() {
            return Ok(None);
        }
        conds
            .iter()
            .map(|c| {
                let (field, m) = match c {
                    Cond::Keyword { field, values } if values.len() == 1 => {
                        (*field, Match::from(values[0].clone()))
                    }
                    Cond::Keyword { field, values } => (*field, Match::from(values.clone())),
                    Cond::Substring { field, value } => {
                        (*field, Match::Text(MatchText::from(value.clone())))
                    }
                };
                let key = field.parse::<JsonPath>().map_err(|_| {
                    RetrieveError::Config(format!("`{field}` is not a payload path"))
                })?;
                Ok(Condition::Field(FieldCondition::new_match(key, m)))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    };
    Ok(Some(qdrant_edge::Filter {
        should: None,
        min_should: None,
        must: convert(&spec.must)?,
        must_not: convert(&spec.must_not)?,
    }))
}

/// The filter as the Qdrant server's gRPC API understands it; `None` when it restricts nothing.
pub fn to_server(spec: &FilterSpec) -> Option<qdrant_client::qdrant::Filter> {
    use qdrant_client::qdrant::{Condition, Filter};
    if spec.is_empty() {
        return None;
    }
    let convert = |conds: &[Cond]| -> Vec<Condition> {
        conds
            .iter()
            .map(|c| match c {
                Cond::Keyword { field, values } if values.len() == 1 => {
                    Condition::matches(*field, values[0].clone())
                }
                Cond::Keyword { field, values } => Condition::matches(*field, values.clone()),
                Cond::Substring { field, value } => Condition::matches_text(*field, value.clone()),
            })
            .collect()
    };
    Some(Filter {
        must: convert(&spec.must),
        must_not: convert(&spec.must_not),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests;
