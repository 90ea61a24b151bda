//! The packed state against the state kept with its texts, turn after turn, and the stored
//! forms it reads.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::json;

use super::*;
use crate::assemble::{AnswerOutcome, ProviderAnswer, StateUpdate, TurnKind};
use crate::config::AssemblePolicy;

fn chunk(id: usize, size: usize) -> Chunk {
    Chunk {
        id: format!("c{id}"),
        path: format!("src/f{}.rs", id % 3),
        start_line: 1,
        end_line: 9,
        language: "rust".into(),
        // Multi-byte characters: the budgets count characters, not bytes.
        text: format!("// {id} ") + &"é".repeat(size),
        repo: id.is_multiple_of(2).then(|| "r".into()),
        score: Some(0.5),
    }
}

fn file(path: &str, version: usize) -> StoredFile {
    let text = format!("v{version} ") + &"x".repeat(300);
    StoredFile {
        path: path.into(),
        sha256: crate::assemble::sha256_hex(&text),
        language: "rust".into(),
        text,
    }
}

/// Turn `n` of a session: chunks old and new, a file changed now and then, one skipped.
fn update(n: usize) -> (StateUpdate, ProviderAnswer) {
    let update = StateUpdate {
        turn_id: format!("t{n}"),
        kind: TurnKind::UserTurn,
        mode: "Agent".into(),
        instruction: Some(format!("step {n}")),
        new_chain: n.is_multiple_of(4),
        chunks: (n..n + 3).map(|i| chunk(i * 2 % 11, 40 + i * 7)).collect(),
        rehydrated_chunk_ids: Vec::new(),
        files: [file("a.rs", n / 2), file(&format!("b{}.rs", n % 3), n)].into(),
        rehydrated_files: Vec::new(),
        skipped_paths: if n % 5 == 4 { vec!["b1.rs".into()] } else { Vec::new() },
        latched_solution_context: None,
        solution_context_sent_sha256: None,
        boot_prompt_sha256: None,
    };
    let outcome = AnswerOutcome::Final { output_text: format!("done {n}") };
    let at = DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::seconds(n as i64);
    (update, ProviderAnswer { response_id: format!("resp_{n}"), created_at: at, outcome })
}

/// The packed state with its texts put back from `stored`, as stored JSON.
fn in_place(packed: &PackedState, stored: &HashMap<String, String>) -> serde_json::Value {
    let mut value = serde_json::to_value(packed).unwrap();
    value.as_object_mut().unwrap().remove("texts_by_ref");
    for list in ["chunks", "files"] {
        for entry in value["history"][list].as_array_mut().unwrap() {
            let entry = entry.as_object_mut().unwrap();
            let key = entry.remove("text_ref").unwrap();
            let chars = entry.remove("text_chars").unwrap();
            let text = &stored[key.as_str().unwrap()];
            assert_eq!(chars, json!(text.chars().count()));
            entry.insert("text".into(), json!(text));
        }
    }
    value
}

#[test]
fn a_state_kept_by_reference_through_its_turns_is_the_state_kept_with_its_texts() {
    // Small budgets, so chunks, files and turns are cut along the way.
    let policy = AssemblePolicy {
        rehydrate_chunk_chars: 400,
        rehydrate_file_chars: 900,
        rehydrate_transcript_chars: 60,
        ..AssemblePolicy::default()
    };
    let (mut whole, mut packed) = (SessionState::default(), PackedState::default());
    let mut stored: HashMap<String, String> = HashMap::new();
    for n in 0..12 {
        let (update, answer) = update(n);
        whole = whole.apply_answer(&update, &answer, &policy);
        let mut next = packed.apply_answer(&update, &answer, &policy);
        let new = next.take_new_texts();
        assert!(new.len() <= 5, "only this turn's texts are new: {}", new.len());
        stored.extend(new);
        // Each turn reads back what the last one wrote.
        let json = serde_json::to_string(&next).unwrap();
        packed = PackedState::from_stored_json(&json).unwrap();
        assert!(packed.texts_by_ref && packed.version == PackedState::VERSION);
        let mut expected = serde_json::to_value(&whole).unwrap();
        expected["v"] = json!(PackedState::VERSION);
        assert_eq!(in_place(&packed, &stored), expected, "after turn {n}");
        // What assembly reads: the same state with its texts put back.
        let read = packed.clone().with_texts(|key| stored.get(key).cloned()).unwrap();
        assert_eq!(read, SessionState { version: PackedState::VERSION, ..whole.clone() });
    }
    assert!(whole.history.chunks_cut > 0 && !whole.history.files_cut.is_empty());
    assert!(whole.history.transcript_cut > 0);
}

#[test]
fn texts_in_place_are_new_and_a_reference_without_its_length_is_not_packed() {
    let inline = json!({"v": 1, "history": {"chunks": [{"id": "a", "path": "a.rs",
        "start_line": 1, "end_line": 2, "language": "rust", "text": "fn a() {}"}]}});
    let state = PackedState::from_stored_value(&inline).unwrap();
    assert_eq!(state.history.chunks[0].text, PackedText::New("fn a() {}".into()));
    let mut by_ref = inline.clone();
    let entry = by_ref["history"]["chunks"][0].as_object_mut().unwrap();
    entry.remove("text");
    entry.insert("text_ref".into(), json!(crate::assemble::sha256_hex("fn a() {}")));
    entry.insert("text_chars".into(), json!(9));
    assert!(PackedState::from_stored_value(&by_ref).is_err(), "references, unmarked");
    by_ref["texts_by_ref"] = json!(true);
    let state = PackedState::from_stored_json(&by_ref.to_string()).unwrap();
    let mut old = by_ref.clone();
    old["history"]["chunks"][0].as_object_mut().unwrap().remove("text_chars");
    assert!(PackedState::from_stored_value(&old).is_err(), "written before lengths");
    assert_eq!(state.history.chunks[0].cost(), 9);
    assert!(PackedState::from_stored_value(&json!({"v": 9})).is_err(), "a newer version");
    let missing = state.with_texts(|_| None).unwrap_err();
    assert_eq!(missing, crate::assemble::sha256_hex("fn a() {}"), "a text not stored");
}
