//! Request parsing on arbitrary bytes: `validate_bytes` and the session/turn hint never panic,
//! and whatever validates survives the trip between stages (serialized to the wire form and
//! re-checked on the way in) unchanged, with the same fingerprint.
#![no_main]

use aptix::contracts::ValidatedRequest;
use aptix::rules::{turn_hint, validate_bytes, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = turn_hint(data);
    let tight = Limits {
        max_request_bytes: 512,
        max_instruction_chars: 64,
        max_artifacts: 2,
        max_images: 1,
        ..Limits::default()
    };
    let _ = validate_bytes(data, &tight);
    let Ok(request) = validate_bytes(data, &Limits::default()) else { return };
    let wire = serde_json::to_vec(&request).expect("a validated request serializes");
    let again: ValidatedRequest = match serde_json::from_slice(&wire) {
        Ok(r) => r,
        Err(e) => panic!("re-reading a validated request failed: {e}\n{}", String::from_utf8_lossy(&wire)),
    };
    assert_eq!(request, again, "the wire form changed the request");
    assert_eq!(request.fingerprint(), again.fingerprint());
});
