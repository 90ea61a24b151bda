//! `validate` never panics: arbitrary bytes, and arbitrary JSON shaped like a request.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use aptix::rules::{validate_bytes, Limits};
use proptest::prelude::*;
use serde_json::{Map, Value};

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
        "[A-Za-z0-9+/=]{0,16}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((field_name(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "SessionId",
            "TurnId",
            "Instruction",
            "InputArtifacts",
            "ClipboardImages",
            "RagScope",
            "SolutionContextText",
            "Stream",
            "ToolResults",
            "ToolCallId",
            "ExecutionMs",
            "ResultJson",
            "ErrorMessage",
            "RelativePath",
            "FileName",
            "Contents",
            "Origin",
            "Encoding",
            "Key",
            "Operator",
            "Values",
            "Id",
            "MimeType",
            "DataBase64",
            "Mode",
        ])
        .prop_map(str::to_owned),
        ".{0,8}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = validate_bytes(&bytes, &Limits::default());
    }

    #[test]
    fn never_panics_on_json(mut value in json_value(), sid in any::<bool>()) {
        if let (Value::Object(map), true) = (&mut value, sid) {
            map.insert("SessionId".into(), "5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f".into());
        }
        let bytes = serde_json::to_vec(&value).unwrap();
        match validate_bytes(&bytes, &Limits::default()) {
            Ok(v) => {
                // Whatever passes must survive its own wire round trip.
                let again = serde_json::to_vec(&v).unwrap();
                prop_assert!(validate_bytes(&again, &Limits::default()).is_ok());
            }
            Err(errors) => prop_assert!(!errors.0.is_empty()),
        }
    }
}
