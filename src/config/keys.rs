//! The keys that sign what only the pipeline may write: stage messages (`x-aptix-mac`, checked by
//! every stage consumer: `crate::broker`) and file URLs (`crate::files`). HMAC-SHA256 over a
//! domain (what is signed), its fields and a body, so a signature made for one use is never
//! valid for another. Several keys verify at once (a rotation: the first signs).

use std::sync::Arc;

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

/// Keys shorter than this are refused: a MAC is only as strong as its key.
pub const MIN_KEY_BYTES: usize = 16;

/// The keys that sign and verify stage messages. `Debug` shows how many, never a key.
#[derive(Clone)]
pub struct MessageKeys(Arc<Vec<Vec<u8>>>);

impl std::fmt::Debug for MessageKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MessageKeys({} key(s))", self.0.len())
    }
}

impl MessageKeys {
    /// The keys, the first signing; `None` when there is none or one is shorter than
    /// [`MIN_KEY_BYTES`].
    pub fn new(keys: Vec<Vec<u8>>) -> Option<Self> {
        let usable = !keys.is_empty() && keys.iter().all(|k| k.len() >= MIN_KEY_BYTES);
        usable.then(|| MessageKeys(Arc::new(keys)))
    }

    /// The MAC of `body` under `fields` (the first names the domain: `aptix.stage/v1`, ...),
    /// signed with the first key (hex).
    pub fn sign(&self, fields: &[&str], body: &[u8]) -> String {
        hex::encode(mac(&self.0[0], fields, body).finalize().into_bytes())
    }

    /// Whether `given` is the MAC of `body` under `fields` and any of the keys (in constant
    /// time).
    pub fn verify(&self, fields: &[&str], body: &[u8], given: &str) -> bool {
        let Ok(given) = hex::decode(given) else { return false };
        self.0.iter().any(|key| mac(key, fields, body).verify_slice(&given).is_ok())
    }
}

/// The signature of a file URL: who owns the file, its content hash, and until when (Unix
/// seconds) the URL serves it.
pub fn file_signature(keys: &MessageKeys, owner: &str, sha256: &str, expires: i64) -> String {
    keys.sign(&["aptix.file/v1", owner, sha256, &expires.to_string()], b"")
}

/// The URL of `owner`'s file `sha256` under `base`, served until `expires` (Unix seconds), as
/// `crate::files` checks it: `<base>/files/<sha256>?owner=&expires=&sig=`. Owners are tenant
/// names (`[a-z0-9-]`) or empty, so nothing needs escaping.
pub fn file_url(base: &str, keys: &MessageKeys, owner: &str, sha256: &str, expires: i64) -> String {
    let sig = file_signature(keys, owner, sha256, expires);
    format!("{base}/files/{sha256}?owner={owner}&expires={expires}&sig={sig}")
}

/// Whether `signature` is a file URL's for those facts under any of the keys.
pub fn file_signature_valid(
    keys: &MessageKeys,
    owner: &str,
    sha256: &str,
    expires: i64,
    signature: &str,
) -> bool {
    keys.verify(&["aptix.file/v1", owner, sha256, &expires.to_string()], b"", signature)
}

fn mac(key: &[u8], fields: &[&str], body: &[u8]) -> Hmac<Sha256> {
    // Each field ends with a newline, which no type, queue name, hash or tenant holds, so no
    // two inputs hash the same.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        unreachable!("HMAC takes keys of any length")
    };
    for field in fields {
        mac.update(field.as_bytes());
        mac.update(b"\n");
    }
    mac.update(body);
    mac
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(k: &[&[u8]]) -> MessageKeys {
        MessageKeys::new(k.iter().map(|k| k.to_vec()).collect()).unwrap()
    }

    #[test]
    fn a_mac_binds_its_domain_fields_and_body() {
        let k = keys(&[b"0123456789abcdef0123"]);
        let mac = k.sign(&["s", "turn", "p.retrieve"], b"{}");
        assert!(k.verify(&["s", "turn", "p.retrieve"], b"{}", &mac));
        assert!(!k.verify(&["s", "turn", "p.invoke"], b"{}", &mac), "another queue");
        assert!(!k.verify(&["s", "dead", "p.retrieve"], b"{}", &mac), "another type");
        assert!(!k.verify(&["f", "turn", "p.retrieve"], b"{}", &mac), "another domain");
        assert!(!k.verify(&["s", "turnp", ".retrieve"], b"{}", &mac), "fields shifted");
        assert!(!k.verify(&["s", "turn", "p.retrieve"], b"{ }", &mac), "another body");
        assert!(!k.verify(&["s", "turn", "p.retrieve"], b"{}", "zz"), "not hex");
        assert!(!k.verify(&["s", "turn", "p.retrieve"], b"{}", ""), "missing");
    }

    #[test]
    fn a_rotation_verifies_with_either_key_and_signs_with_the_first() {
        let (old, new) = (b"old-key-0123456789".as_slice(), b"new-key-0123456789".as_slice());
        let before = keys(&[old]);
        let during = keys(&[new, old]);
        let mac = before.sign(&["q"], b"x");
        assert!(during.verify(&["q"], b"x", &mac));
        assert!(!before.verify(&["q"], b"x", &during.sign(&["q"], b"x")));
        assert!(keys(&[new]).verify(&["q"], b"x", &during.sign(&["q"], b"x")));
    }

    #[test]
    fn short_or_missing_keys_are_refused() {
        assert!(MessageKeys::new(vec![]).is_none());
        assert!(MessageKeys::new(vec![b"short".to_vec()]).is_none());
        let k = MessageKeys::new(vec![b"0123456789abcdef".to_vec()]).unwrap();
        assert!(!format!("{k:?}").contains("0123"));
    }
}
