//! Issue 13's validation rules: lists over their limits refused before anything is built per
//! element, NUL refused in every stored string, echoed values clipped, error lists capped,
//! names and paths without disguising characters and NFKC-normalised, the session hint read
//! without building the document.

use std::time::{Duration, Instant};

use aptix::contracts::{ArtifactContents, ErrorCode, ValidatedRequest};
use aptix::rules::{session_hint, turn_hint, validate_bytes, Limits};
use serde_json::{json, Value};

use super::{artifact, cont, errors_of, image, many_unknown, user, SID};

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

fn all_errors(body: &[u8], limits: &Limits) -> Vec<aptix::contracts::ApiError> {
    validate_bytes(body, limits).expect_err("expected errors").0
}

/// `{"SessionId":..,"TurnId":..,"<field>":[<item>,<item>,...]}` with `n` items, built as text.
fn long_list(field: &str, item: &str, n: usize) -> Vec<u8> {
    let mut body = format!(r#"{{"SessionId":"{SID}","TurnId":"t-1","{field}":["#);
    body.reserve(n * (item.len() + 1) + 2);
    for i in 0..n {
        if i > 0 {
            body.push(',');
        }
        body.push_str(item);
    }
    body.push_str("]}");
    body.into_bytes()
}

#[test]
fn huge_lists_are_refused_with_one_error_before_deserialization() {
    // The review's body: 280,000 empty artifacts in 840 KB once gave 800,001 errors (139 MB).
    let cases = [
        ("InputArtifacts", "{}", "max_artifacts"),
        ("ClipboardImages", "{}", "max_images"),
        ("ToolResults", "{}", "max_tool_results"),
        ("RagScope", "{}", "max_rag_scope_conditions"),
    ];
    for (field, item, key) in cases {
        let body = long_list(field, item, 280_000);
        assert!(body.len() < 900_000, "{field}: {} bytes", body.len());
        let started = Instant::now();
        let errors = all_errors(&body, &Limits::default());
        let elapsed = started.elapsed();
        assert_eq!(errors.len(), 1, "{field}: {errors:?}");
        assert_eq!(errors[0].code, ErrorCode::LimitExceeded);
        assert_eq!(errors[0].field.as_deref(), Some(field));
        assert!(
            errors[0].message.contains("280000") && errors[0].message.contains(key),
            "{errors:?}"
        );
        assert!(elapsed < Duration::from_secs(5), "{field}: {elapsed:?}");
    }
}

#[test]
fn huge_rag_scope_values_are_refused_before_deserialization() {
    // The review saw 500,000 values accepted; 900,000 still fit in the 4 MiB request limit.
    let values = vec!["\"v\""; 900_000];
    let body = format!(
        r#"{{"SessionId":"{SID}","TurnId":"t-1","Instruction":"x","RagScope":[{{"Key":"path","Operator":"==","Values":[{}]}}]}}"#,
        values.join(",")
    );
    let errors = all_errors(body.as_bytes(), &Limits::default());
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].field.as_deref(), Some("RagScope[0].Values"));
    assert!(errors[0].message.contains("max_rag_scope_values"), "{}", errors[0].message);
    assert!(errors[0].message.contains("900000"), "{}", errors[0].message);
}

#[test]
fn over_limit_lists_are_reported_with_bad_names_and_capped() {
    // Unknown names and an over-limit list together; a million conditions over their Values
    // limit still give a capped list.
    let mut body = long_list("RagScope", r#"{"Values":[1,2,3]}"#, 1_000);
    body.splice(1..1, br#""Mode":"x","sessionId":1,"#.iter().copied());
    let tight = Limits { max_rag_scope_values: 2, max_errors: 5, ..Limits::default() };
    let errors = all_errors(&body, &tight);
    let codes: Vec<ErrorCode> = errors.iter().map(|e| e.code).collect();
    assert_eq!(codes[..2], [ErrorCode::RequestForbiddenField, ErrorCode::RequestUnknownField]);
    assert_eq!(errors[2].field.as_deref(), Some("RagScope"), "{errors:?}");
    assert_eq!(errors[3].field.as_deref(), Some("RagScope[0].Values"), "{errors:?}");
    assert_eq!(errors.len(), 6, "{errors:?}");
    assert_eq!(errors[5].code, ErrorCode::RequestTooManyErrors);
    assert!(errors[5].message.starts_with("998 more problems"), "{}", errors[5].message);
}

#[test]
fn error_lists_are_capped_with_a_count_of_the_rest() {
    let errors = all_errors(&bytes(&many_unknown(2000)), &Limits::default());
    assert_eq!(errors.len(), 21);
    assert!(errors[..20].iter().all(|e| e.code == ErrorCode::RequestUnknownField));
    assert_eq!(errors[20].code, ErrorCode::RequestTooManyErrors);
    assert!(errors[20].message.contains("1980 more") && errors[20].message.contains("max_errors"));
    // Rule errors count against the same cap: 64 broken artifacts, 3 errors each.
    let broken: Vec<Value> = (0..64)
        .map(|i| {
            artifact(json!({"RelativePath": format!("/abs{i}"), "FileName": null, "Origin": "x"}))
        })
        .collect();
    let errors = all_errors(&bytes(&user(json!({"InputArtifacts": broken}))), &Limits::default());
    assert_eq!(errors.len(), 21, "{errors:?}");
    assert!(errors[20].message.starts_with("172 more problems"), "{}", errors[20].message);
    // Within the cap nothing is left out.
    let errors = all_errors(&bytes(&many_unknown(20)), &Limits::default());
    assert_eq!(errors.len(), 20);
    assert!(errors.iter().all(|e| e.code == ErrorCode::RequestUnknownField));
}

#[test]
fn nul_is_refused_in_every_stored_string() {
    let nul = "a\u{0}b";
    let scope =
        |k: &str, v: Value| json!({"RagScope": [{"Key": k, "Operator": "==", "Values": v}]});
    let cases = [
        (user(json!({"Instruction": nul})), "Instruction"),
        (user(json!({"SolutionContextText": nul})), "SolutionContextText"),
        (user(json!({"WorkspaceId": nul})), "WorkspaceId"),
        (user(json!({"Repo": nul})), "Repo"),
        (user(json!({"Language": nul})), "Language"),
        (
            user(json!({"InputArtifacts": [artifact(json!({"FileName": nul}))]})),
            "InputArtifacts[0].FileName",
        ),
        (
            user(json!({"InputArtifacts": [artifact(json!({"Contents": nul}))]})),
            "InputArtifacts[0].Contents",
        ),
        (
            user(
                json!({"InputArtifacts": [artifact(json!({"Contents": nul, "Encoding": "utf8"}))]}),
            ),
            "InputArtifacts[0].Contents",
        ),
        (
            user(json!({"InputArtifacts": [artifact(json!({"MimeType": nul}))]})),
            "InputArtifacts[0].MimeType",
        ),
        (
            user(json!({"InputArtifacts": [artifact(json!({"Language": nul}))]})),
            "InputArtifacts[0].Language",
        ),
        (user(json!({"ClipboardImages": [image(json!({"Id": nul}))]})), "ClipboardImages[0].Id"),
        (
            user(json!({"ClipboardImages": [image(json!({"MimeType": "image/p\u{0}ng"}))]})),
            "ClipboardImages[0].MimeType",
        ),
        (user(scope(nul, json!(["x"]))), "RagScope[0].Key"),
        (user(scope("path", json!(["x", nul]))), "RagScope[0].Values[1]"),
        (
            cont(
                json!({"ToolResults": [{"ToolCallId": nul, "ExecutionMs": 1, "ResultJson": "1"}]}),
            ),
            "ToolResults[0].ToolCallId",
        ),
        (
            cont(
                json!({"ToolResults": [{"ToolCallId": "c", "ExecutionMs": 1, "ResultJson": "\"a\u{0}\""}]}),
            ),
            "ToolResults[0].ResultJson",
        ),
        (
            cont(
                json!({"ToolResults": [{"ToolCallId": "c", "ExecutionMs": 1, "ErrorMessage": nul}]}),
            ),
            "ToolResults[0].ErrorMessage",
        ),
    ];
    for (body, field) in cases {
        let errors = all_errors(&bytes(&body), &Limits::default());
        let hit = errors.iter().find(|e| e.code == ErrorCode::RequestNulCharacter);
        let hit = hit.unwrap_or_else(|| panic!("{field}: {errors:?}"));
        assert_eq!(hit.field.as_deref(), Some(field), "{errors:?}");
        assert!(hit.message.contains("U+0000"), "{}", hit.message);
        for e in &errors {
            assert!(
                !e.message.contains('\0') && !e.field.as_deref().unwrap_or("").contains('\0'),
                "{e:?}"
            );
        }
    }
    // Fields with their own grammar keep their specific code.
    let path = user(json!({"InputArtifacts": [artifact(json!({"RelativePath": nul}))]}));
    let codes: Vec<ErrorCode> =
        errors_of(&bytes(&path), &Limits::default()).into_iter().map(|e| e.0).collect();
    assert_eq!(codes, [ErrorCode::PathNul]);
    let turn = user(json!({"TurnId": nul}));
    let codes: Vec<ErrorCode> =
        errors_of(&bytes(&turn), &Limits::default()).into_iter().map(|e| e.0).collect();
    assert_eq!(codes, [ErrorCode::TurnIdInvalid]);
}

#[test]
fn base64_that_decodes_to_text_with_nul_is_binary() {
    // "a\0b" and UTF-16LE "hi": valid UTF-8 bytes, but no text file holds NUL.
    for (b64, raw) in [("YQBi", b"a\0b".to_vec()), ("aABpAA==", b"h\0i\0".to_vec())] {
        let body = user(
            json!({"InputArtifacts": [artifact(json!({"Encoding": "base64", "Contents": b64}))]}),
        );
        let v = validate_bytes(&bytes(&body), &Limits::default()).unwrap();
        let ValidatedRequest::UserTurn(t) = &v else { panic!("not a user turn") };
        assert_eq!(t.artifacts()[0].contents(), &ArtifactContents::Binary(raw));
        // It travels between stages as base64 again, never as text.
        let wire = serde_json::to_value(&v).unwrap();
        assert_eq!(wire["InputArtifacts"][0]["Encoding"], "base64");
    }
    let body = user(
        json!({"InputArtifacts": [artifact(json!({"Encoding": "base64", "Contents": "aGk="}))]}),
    );
    let v = validate_bytes(&bytes(&body), &Limits::default()).unwrap();
    let ValidatedRequest::UserTurn(t) = &v else { panic!("not a user turn") };
    assert_eq!(t.artifacts()[0].contents(), &ArtifactContents::Text("hi".into()));
}

#[test]
fn echoed_values_are_clipped_and_replies_stay_small() {
    let big = "x".repeat(7_000_000);
    let roomy =
        Limits { max_request_bytes: 64 << 20, max_name_chars: 10_000_000, ..Limits::default() };
    let cases = [
        // A 7 MB image Id, over its limit; then twice (duplicate, echoed).
        (
            user(json!({"ClipboardImages": [image(json!({"Id": big}))]})),
            Limits { max_request_bytes: 64 << 20, ..Limits::default() },
        ),
        (
            user(
                json!({"ClipboardImages": [image(json!({"Id": big})), image(json!({"Id": big}))]}),
            ),
            roomy.clone(),
        ),
        (
            cont(
                json!({"ToolResults": [{"ToolCallId": big, "ExecutionMs": 1, "ResultJson": "1"}, {"ToolCallId": big, "ExecutionMs": 1, "ResultJson": "1"}]}),
            ),
            roomy.clone(),
        ),
        // Echoed by serde (wrong type), as a property name, as an enumeration value.
        (user(json!({"Stream": big})), roomy.clone()),
        (user(json!({ big.clone(): 1 })), roomy.clone()),
        (user(json!({"InputArtifacts": [artifact(json!({ big.clone(): 1 }))]})), roomy.clone()),
        (user(json!({"InputArtifacts": [artifact(json!({"Origin": big}))]})), roomy.clone()),
        (user(json!({"SessionId": big})), roomy.clone()),
        (
            user(json!({"InputArtifacts": [artifact(json!({"RelativePath": format!("/{big}")}))]})),
            Limits { max_path_chars: usize::MAX, ..roomy.clone() },
        ),
    ];
    for (i, (body, limits)) in cases.into_iter().enumerate() {
        let errors = all_errors(&bytes(&body), &limits);
        let reply = serde_json::to_vec(&errors).unwrap();
        assert!(reply.len() < 4_000, "case {i}: a {} byte error list: {errors:?}", reply.len());
    }
}

#[test]
fn paths_and_names_cannot_disguise_themselves() {
    let path = |p: &str| user(json!({"InputArtifacts": [artifact(json!({"RelativePath": p}))]}));
    let name = |n: &str| user(json!({"InputArtifacts": [artifact(json!({"FileName": n}))]}));
    let cases = [
        (path("src/\u{202e}cod.exe"), ErrorCode::PathFormatCharacter, "RelativePath"),
        (path("src/a\u{200b}.rs"), ErrorCode::PathFormatCharacter, "RelativePath"),
        (path("src/\u{2066}a.rs"), ErrorCode::PathFormatCharacter, "RelativePath"),
        (path("\u{feff}src/a.rs"), ErrorCode::PathFormatCharacter, "RelativePath"),
        (path("src/a\n.rs"), ErrorCode::PathFormatCharacter, "RelativePath"),
        (path("\u{ff0e}\u{ff0e}/etc/passwd"), ErrorCode::PathTraversal, "RelativePath"),
        (path("src/\u{2025}/x"), ErrorCode::PathTraversal, "RelativePath"),
        (path("src\u{ff0f}..\u{ff0f}x"), ErrorCode::PathTraversal, "RelativePath"),
        (path("\u{ff0f}etc/passwd"), ErrorCode::PathAbsolute, "RelativePath"),
        (path("\u{ff23}\u{ff1a}\\x"), ErrorCode::PathDriveLetter, "RelativePath"),
        (name("lib\u{202e}sr.exe"), ErrorCode::PathFormatCharacter, "FileName"),
        (name("lib\u{200d}.rs"), ErrorCode::PathFormatCharacter, "FileName"),
        (name("lib\t.rs"), ErrorCode::PathFormatCharacter, "FileName"),
    ];
    for (body, code, field) in cases {
        let errors = errors_of(&bytes(&body), &Limits::default());
        let field = format!("InputArtifacts[0].{field}");
        assert!(
            errors.iter().any(|(c, f)| *c == code && f.as_deref() == Some(&field)),
            "{body}: expected {code} at {field}, got {errors:?}"
        );
    }
}

#[test]
fn paths_and_names_are_kept_nfkc_normalised() {
    let body = user(json!({"InputArtifacts": [
        artifact(json!({"RelativePath": "\u{ff53}rc/ca\u{0066}e\u{0301}.rs", "FileName": "\u{fb01}le.rs"}))
    ]}));
    let v = validate_bytes(&bytes(&body), &Limits::default()).unwrap();
    let ValidatedRequest::UserTurn(t) = &v else { panic!("not a user turn") };
    assert_eq!(t.artifacts()[0].path().as_str(), "src/caf\u{e9}.rs");
    assert_eq!(t.artifacts()[0].file_name(), "file.rs");
    // The same file spelled two ways is one path.
    let twice = user(json!({"InputArtifacts": [
        artifact(json!({"RelativePath": "src/lib.rs"})),
        artifact(json!({"RelativePath": "\u{ff53}rc/lib.rs"}))
    ]}));
    let errors = errors_of(&bytes(&twice), &Limits::default());
    assert!(
        errors.contains(&(ErrorCode::PathDuplicate, Some("InputArtifacts[1].RelativePath".into())))
    );
    // The normalised form survives the trip between stages unchanged.
    let again: ValidatedRequest = serde_json::from_slice(&serde_json::to_vec(&v).unwrap()).unwrap();
    assert_eq!(again, v);
}

#[test]
fn deep_nesting_is_invalid_json_wherever_it_is() {
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    for field in ["Instruction", "Junk", "InputArtifacts", "RagScope"] {
        let body = format!(r#"{{"SessionId":"{SID}","TurnId":"t","{field}":{}}}"#, deep(300));
        let errors = all_errors(body.as_bytes(), &Limits::default());
        assert_eq!(errors.len(), 1, "{field}: {errors:?}");
        assert_eq!(errors[0].code, ErrorCode::RequestInvalidJson, "{field}: {errors:?}");
        assert!(errors[0].message.contains("recursion limit"), "{}", errors[0].message);
        // The session can still be told.
        assert_eq!(session_hint(body.as_bytes()).map(|s| s.to_string()).as_deref(), Some(SID));
    }
    let ok =
        format!(r#"{{"SessionId":"{SID}","TurnId":"t","Instruction":"x","Junk":{}}}"#, deep(100));
    let codes: Vec<ErrorCode> =
        all_errors(ok.as_bytes(), &Limits::default()).iter().map(|e| e.code).collect();
    assert_eq!(codes, [ErrorCode::RequestUnknownField]);
}

#[test]
fn turn_hint_reads_without_building_the_document() {
    let t = |b: &[u8]| {
        let (s, t) = turn_hint(b);
        (s.map(|s| s.to_string()), t)
    };
    let sid = Some(SID.to_owned());
    // Escaped keys and values, other properties of any shape and size.
    let escaped = format!(
        r#"{{"Junk":{{"a":[1,{{"b":null}}]}},"Session\u0049d":"{SID}","TurnId":"t\u002d1"}}"#
    );
    assert_eq!(t(escaped.as_bytes()), (sid.clone(), Some("t-1".into())));
    // The last of repeated properties wins; a non-string or malformed one reads as absent.
    let repeated = format!(r#"{{"SessionId":"nope","SessionId":"{SID}","TurnId":"a b"}}"#);
    assert_eq!(t(repeated.as_bytes()), (sid.clone(), None));
    assert_eq!(t(format!(r#"{{"SessionId":"{SID}","TurnId":{{"x":1}}}}"#).as_bytes()), (sid, None));
    // Nothing from a body that is not a well-formed UTF-8 JSON object.
    let mut latin1 = format!(r#"{{"SessionId":"{SID}","Instruction":"caf"#).into_bytes();
    latin1.extend_from_slice(b"\xe9\"}");
    for body in [&latin1[..], b"[1]", b"{\"SessionId\":", b"{} x"] {
        assert_eq!(t(body), (None, None), "{}", String::from_utf8_lossy(body));
    }
}

#[test]
fn result_json_is_checked_without_a_tree_but_with_the_nesting_limit() {
    let result = |json: String| {
        cont(json!({"ToolResults": [{"ToolCallId": "c", "ExecutionMs": 1, "ResultJson": json}]}))
    };
    let many: Vec<String> = (0..50_000).map(|i| format!("{{\"k\":{i}}}")).collect();
    let ok = result(format!("[{}]", many.join(",")));
    assert!(validate_bytes(&bytes(&ok), &Limits::default()).is_ok());
    let deep = result(format!("{}{}", "[".repeat(300), "]".repeat(300)));
    let codes: Vec<ErrorCode> =
        errors_of(&bytes(&deep), &Limits::default()).into_iter().map(|e| e.0).collect();
    assert_eq!(codes, [ErrorCode::ToolResultJsonInvalid]);
    let trailing = result("{} x".into());
    let codes: Vec<ErrorCode> =
        errors_of(&bytes(&trailing), &Limits::default()).into_iter().map(|e| e.0).collect();
    assert_eq!(codes, [ErrorCode::ToolResultJsonInvalid]);
}

#[test]
fn large_images_are_measured_piece_by_piece_like_a_whole_decode() {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let data: Vec<u8> = (0..100_003u32).map(|i| (i * 7 % 251) as u8).collect();
    let encoded = b64.encode(&data);
    let mime_style: String = encoded
        .as_bytes()
        .chunks(76)
        .map(|l| String::from_utf8_lossy(l).into_owned() + "\r\n")
        .collect();
    for text in [encoded.clone(), mime_style] {
        let body = user(json!({"ClipboardImages": [image(json!({"DataBase64": text}))]}));
        let v = validate_bytes(&bytes(&body), &Limits::default()).unwrap();
        let ValidatedRequest::UserTurn(t) = &v else { panic!("not a user turn") };
        assert_eq!(t.images()[0].byte_len(), data.len());
        assert_eq!(t.images()[0].data_base64(), encoded);
    }
    // A bad symbol deep inside is reported at its offset in the whole; padding in the middle fails.
    let mut bad = encoded.clone();
    bad.replace_range(70_001..70_002, "!");
    let mut padded = encoded.clone();
    padded.replace_range(16_380..16_384, "YQ==");
    for (text, needle) in [(bad, "offset 70001"), (padded, "")] {
        let body = user(json!({"ClipboardImages": [image(json!({"DataBase64": text}))]}));
        let errors = all_errors(&bytes(&body), &Limits::default());
        assert_eq!(errors[0].code, ErrorCode::ImageBase64Invalid, "{errors:?}");
        assert!(errors[0].message.contains(needle), "{}", errors[0].message);
    }
}

#[test]
fn default_limits_are_the_example_file() {
    let file: toml::Value = toml::from_str(aptix::config::DEFAULTS_TOML).unwrap();
    let limits: Limits = file["limits"].clone().try_into().unwrap();
    assert_eq!(limits, Limits::default());
    assert_eq!(limits.max_request_bytes, 4 * 1024 * 1024);
    assert_eq!(limits.max_artifact_bytes, 2 * 1024 * 1024);
    assert_eq!(limits.max_image_bytes, 2 * 1024 * 1024);
    assert_eq!(limits.max_errors, 20);
}

#[test]
fn corpus_expectations_hold_for_the_stateless_rules() {
    // The same expectations `tests/bad_input.rs` checks through the pipeline, checked here in
    // milliseconds for every case the stateless rules decide alone.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/bad");
    let manifest = std::fs::read_to_string(dir.join("expected.tsv")).unwrap();
    let stateless = |c: &str| c.starts_with("request.") || c.starts_with("validation.");
    let mut checked = 0;
    for line in manifest.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        let cols: Vec<&str> = line.split('\t').collect();
        let (file, setup, expected) = (cols[0], cols[1], cols[2]);
        let body = std::fs::read(dir.join(file)).unwrap();
        let result = validate_bytes(&body, &Limits::default());
        let got: Vec<String> = match &result {
            Ok(_) => Vec::new(),
            Err(e) => e.0.iter().map(|e| e.code.as_str().to_owned()).collect(),
        };
        let (routed, codes) = match expected.split_once(':') {
            Some(("dead", code)) => (false, vec![code.to_owned()]),
            Some(("reply", codes)) => (true, expand(codes)),
            _ => (true, Vec::new()),
        };
        if setup != "-" || !codes.iter().all(|c| stateless(c)) {
            continue;
        }
        assert_eq!(session_hint(&body).is_some(), routed, "{file}: session hint");
        let got = if routed { got } else { got.into_iter().take(1).collect() };
        assert_eq!(got, codes, "{file}");
        checked += 1;
    }
    assert!(checked > 120, "only {checked} corpus cases checked");
}

/// `a,b*3` → `[a, b, b, b]`, as in `expected.tsv`.
fn expand(codes: &str) -> Vec<String> {
    let mut out = Vec::new();
    for item in codes.split(',') {
        match item.split_once('*') {
            Some((code, n)) => out.extend(std::iter::repeat_n(code.to_owned(), n.parse().unwrap())),
            None => out.push(item.to_owned()),
        }
    }
    out
}

#[test]
fn wire_form_by_reference_is_the_converted_wire_form() {
    use aptix::contracts::AgentExecuteRequest;
    use sha2::{Digest as _, Sha256};
    let bodies = [
        user(json!({
            "InputArtifacts": [artifact(json!({"MimeType": "text/x-rust", "Language": "rust"})),
                artifact(json!({"RelativePath": "docs/a.bin", "Encoding": "base64", "Contents": "AP8=", "Origin": "user"})),
                artifact(json!({"RelativePath": "q.txt", "Contents": "say \"hi\"\n\t\u{1}é"}))],
            "ClipboardImages": [image(json!({"MimeType": "IMAGE/PNG"}))],
            "RagScope": [{"Key": "path", "Operator": "does_not_contain", "Values": ["tests/", "b"]}],
            "Stream": true, "Repo": "acme/billing", "WorkspaceId": "w", "Language": "C#",
            "SolutionContextText": "ctx", "ConversationContextId": "default", "AgentContextId": "a"
        })),
        user(
            json!({"Stream": false, "Instruction": null, "InputArtifacts": [artifact(json!({}))]}),
        ),
        cont(json!({"ToolResults": [
            {"ToolCallId": "call_1", "ExecutionMs": 5, "ResultJson": "[1,2]"},
            {"ToolCallId": "call_2", "ExecutionMs": 9, "ErrorMessage": "file \"x\" not found"}]})),
    ];
    for body in bodies {
        let v = validate_bytes(&bytes(&body), &Limits::default()).unwrap();
        let converted = serde_json::to_vec(&AgentExecuteRequest::from(v.clone())).unwrap();
        assert_eq!(
            String::from_utf8(serde_json::to_vec(&v).unwrap()).unwrap(),
            String::from_utf8(converted.clone()).unwrap()
        );
        assert_eq!(v.fingerprint(), hex::encode(Sha256::digest(&converted)));
    }
}
