//! Stage messages are authenticated: every message the pipeline publishes to a stage queue
//! carries an HMAC-SHA256 (`x-aptix-mac`) over its AMQP type, the queue it is for and its body,
//! under a key only the workers hold, and a stage consumer dead-letters a message whose MAC does
//! not verify before its stage sees it. Only what the pipeline wrote is trusted: a stage-shaped
//! body a client got into a stage queue (a replayed dead letter, a queue's dead-letter routing)
//! is data, never an instruction. Several keys verify at once (a rotation: the first signs).

use std::sync::Arc;

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

/// The header that carries a stage message's MAC (hex).
pub const MAC_HEADER: &str = "x-aptix-mac";
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

    /// The MAC of a message of AMQP type `kind` for `queue` with `body`, signed with the first
    /// key (hex).
    pub fn sign(&self, kind: &str, queue: &str, body: &[u8]) -> String {
        hex::encode(mac(&self.0[0], kind, queue, body).finalize().into_bytes())
    }

    /// Whether `given` is the MAC of that message under any of the keys (in constant time).
    pub fn verify(&self, kind: &str, queue: &str, body: &[u8], given: &str) -> bool {
        let Ok(given) = hex::decode(given) else { return false };
        self.0.iter().any(|key| mac(key, kind, queue, body).verify_slice(&given).is_ok())
    }
}

fn mac(key: &[u8], kind: &str, queue: &str, body: &[u8]) -> Hmac<Sha256> {
    // Every length is fixed by a separator that cannot occur in a type or a queue name, so no
    // two messages hash the same input.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        unreachable!("HMAC takes keys of any length")
    };
    for part in [b"aptix.stage/v1".as_slice(), kind.as_bytes(), queue.as_bytes()] {
        mac.update(part);
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
    fn a_mac_binds_type_queue_and_body() {
        let k = keys(&[b"0123456789abcdef0123"]);
        let mac = k.sign("turn", "p.retrieve", b"{}");
        assert!(k.verify("turn", "p.retrieve", b"{}", &mac));
        assert!(!k.verify("turn", "p.invoke", b"{}", &mac), "another queue");
        assert!(!k.verify("dead", "p.retrieve", b"{}", &mac), "another type");
        assert!(!k.verify("turn", "p.retrieve", b"{ }", &mac), "another body");
        assert!(!k.verify("turn", "p.retrieve", b"{}", "zz"), "not hex");
        assert!(!k.verify("turn", "p.retrieve", b"{}", ""), "missing");
    }

    #[test]
    fn a_rotation_verifies_with_either_key_and_signs_with_the_first() {
        let (old, new) = (b"old-key-0123456789".as_slice(), b"new-key-0123456789".as_slice());
        let before = keys(&[old]);
        let during = keys(&[new, old]);
        let mac = before.sign("turn", "q", b"x");
        assert!(during.verify("turn", "q", b"x", &mac));
        assert!(!before.verify("turn", "q", b"x", &during.sign("turn", "q", b"x")));
        assert!(keys(&[new]).verify("turn", "q", b"x", &during.sign("turn", "q", b"x")));
    }

    #[test]
    fn short_or_missing_keys_are_refused() {
        assert!(MessageKeys::new(vec![]).is_none());
        assert!(MessageKeys::new(vec![b"short".to_vec()]).is_none());
        let k = MessageKeys::new(vec![b"0123456789abcdef".to_vec()]).unwrap();
        assert!(!format!("{k:?}").contains("0123"));
    }
}
