//! The shared filter translation, checked for both backends.

use super::*;
use qdrant_client::qdrant::{condition::ConditionOneOf, r#match::MatchValue};

fn cond(key: &str, operator: ScopeOperator, values: &[&str]) -> ScopeCondition {
    ScopeCondition {
        key: key.into(),
        operator,
        values: values.iter().map(|v| v.to_string()).collect(),
    }
}

fn kw(field: &'static str, values: &[&str]) -> Cond {
    Cond::Keyword { field, values: values.iter().map(|v| v.to_string()).collect() }
}

#[test]
fn each_operator_maps_to_the_documented_condition() {
    let scope = [
        cond("Path", ScopeOperator::Eq, &["src/a.rs", "src/b.rs"]),
        cond("language", ScopeOperator::Ne, &["Markdown"]),
        cond("path", ScopeOperator::Contains, &["/UI/primitives/"]),
        cond("file_path", ScopeOperator::DoesNotContain, &["tests", ".md"]),
        cond("lang", ScopeOperator::Contains, &["scr"]),
    ];
    let (spec, warnings) = build(Some("acme/web"), &scope);
    assert!(warnings.is_empty());
    assert_eq!(
        spec.must,
        vec![
            kw("repo", &["acme/web"]),
            kw("path", &["src/a.rs", "src/b.rs"]),
            kw(PATH_SEGS, &["ui/primitives"]),
            Cond::Substring { field: "language", value: "scr".into() },
        ]
    );
    assert_eq!(
        spec.must_not,
        vec![kw("language", &["markdown"]), kw(PATH_SEGS, &["tests"]), kw(PATH_SEGS, &[".md"])]
    );
}

#[test]
fn unknown_keys_are_ignored_with_a_warning() {
    let (spec, warnings) = build(None, &[cond("team", ScopeOperator::Eq, &["x"])]);
    assert!(spec.is_empty());
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].code, SCOPE_KEY_IGNORED);
    assert!(warnings[0].message.contains("`team`"));
    assert!(to_edge(&spec).unwrap().is_none());
    assert!(to_server(&spec).is_none());
}

#[cfg(feature = "embedded-store")]
#[test]
fn edge_translation_keeps_must_and_must_not() {
    let (spec, _) = build(
        Some("r"),
        &[
            cond("path", ScopeOperator::Ne, &["a", "b"]),
            cond("language", ScopeOperator::Contains, &["us"]),
        ],
    );
    let f = to_edge(&spec).unwrap().unwrap();
    let text = format!("{f:?}");
    let must = f.must.unwrap();
    let must_not = f.must_not.unwrap();
    assert_eq!((must.len(), must_not.len()), (2, 1));
    assert!(f.should.is_none());
    let json = qdrant_edge::external::serde_json::to_value(&must[0]).unwrap();
    assert_eq!(json["key"], "repo");
    assert_eq!(json["match"]["value"], "r");
    let json = qdrant_edge::external::serde_json::to_value(&must[1]).unwrap();
    assert_eq!(json["match"]["text"], "us", "{text}");
    let json = qdrant_edge::external::serde_json::to_value(&must_not[0]).unwrap();
    assert_eq!(json["key"], "path");
    assert_eq!(json["match"]["any"], serde_json::json!(["a", "b"]));
}

fn server_match(c: &qdrant_client::qdrant::Condition) -> (String, MatchValue) {
    match c.condition_one_of.clone() {
        Some(ConditionOneOf::Field(f)) => (f.key, f.r#match.and_then(|m| m.match_value).unwrap()),
        other => panic!("not a field condition: {other:?}"),
    }
}

#[test]
fn server_translation_matches_the_edge_one() {
    let (spec, _) = build(
        Some("r"),
        &[
            cond("path", ScopeOperator::Contains, &["src/ui"]),
            cond("language", ScopeOperator::Eq, &["rust", "go"]),
            cond("language", ScopeOperator::DoesNotContain, &["ty"]),
        ],
    );
    let f = to_server(&spec).unwrap();
    assert_eq!(f.must.len(), 3);
    assert_eq!(f.must_not.len(), 1);
    assert_eq!(server_match(&f.must[0]), ("repo".into(), MatchValue::Keyword("r".into())));
    assert_eq!(server_match(&f.must[1]), (PATH_SEGS.into(), MatchValue::Keyword("src/ui".into())));
    let (key, m) = server_match(&f.must[2]);
    assert_eq!(key, "language");
    assert!(matches!(m, MatchValue::Keywords(k) if k.strings == ["rust", "go"]));
    assert_eq!(server_match(&f.must_not[0]), ("language".into(), MatchValue::Text("ty".into())));
}

#[test]
fn substring_values_past_the_bound_are_left_out_with_a_warning() {
    let many: Vec<String> = (0..64).map(|i| format!("zq{i:02}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let scope = [
        cond("language", ScopeOperator::DoesNotContain, &many),
        cond("repo", ScopeOperator::Contains, &many),
        // Indexed lookups are not counted: every one of them is kept.
        cond("path", ScopeOperator::DoesNotContain, &many),
    ];
    let (spec, warnings) = build(None, &scope);
    let substrings =
        |conds: &[Cond]| conds.iter().filter(|c| matches!(c, Cond::Substring { .. })).count();
    assert_eq!(substrings(&spec.must) + substrings(&spec.must_not), MAX_SUBSTRING_VALUES);
    assert_eq!(spec.must_not.len(), MAX_SUBSTRING_VALUES + 64, "every path value kept");
    assert!(spec.must.is_empty(), "the bound was spent on the first condition");
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].code, SCOPE_SUBSTRINGS_CUT);
    assert!(warnings[0].message.contains("120 left out"), "{}", warnings[0].message);
    // Within the bound, nothing is left out and nothing is said.
    let (spec, warnings) = build(None, &[cond("repo", ScopeOperator::Contains, &many[..8])]);
    assert_eq!((spec.must.len(), warnings.len()), (8, 0));
}
