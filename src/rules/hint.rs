//! The `(SessionId, TurnId)` of a body that may be invalid, so its error reply can still reach
//! the session's queue. Read with a visitor that keeps those two strings and skips every other
//! value without building it, so any body costs one pass and no memory beyond it.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::contracts::{SessionId, TurnId};

/// The `(SessionId, TurnId)` a possibly invalid body names, as far as they can be read: both
/// `None` when the body is not UTF-8, not well-formed JSON or not an object; either `None` when
/// it is absent, not a string or malformed. The last occurrence of a repeated property wins.
pub fn turn_hint(bytes: &[u8]) -> (Option<SessionId>, Option<String>) {
    // Checked first, as validation does: a body that is not UTF-8 names no one.
    let Ok(text) = std::str::from_utf8(bytes) else {
        return (None, None);
    };
    crate::metrics::metrics().json("parse", "request_hint");
    let Ok(hint) = serde_json::from_str::<Hint<'_>>(text) else {
        return (None, None);
    };
    let session = hint.session.and_then(|s| s.parse().ok());
    let turn = hint.turn.filter(|t| t.parse::<TurnId>().is_ok()).map(Cow::into_owned);
    (session, turn)
}

/// Best-effort `SessionId` of a message that may be invalid (see [`turn_hint`]).
pub fn session_hint(bytes: &[u8]) -> Option<SessionId> {
    turn_hint(bytes).0
}

/// The two properties of a request object that address its reply.
struct Hint<'de> {
    session: Option<Cow<'de, str>>,
    turn: Option<Cow<'de, str>>,
}

impl<'de> Deserialize<'de> for Hint<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(HintVisitor)
    }
}

struct HintVisitor;

impl<'de> Visitor<'de> for HintVisitor {
    type Value = Hint<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Hint<'de>, A::Error> {
        let mut hint = Hint { session: None, turn: None };
        while let Some(key) = map.next_key::<Field>()? {
            match key {
                Field::Session => hint.session = map.next_value::<Text<'de>>()?.0,
                Field::Turn => hint.turn = map.next_value::<Text<'de>>()?.0,
                Field::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(hint)
    }
}

/// Which property a key names; compared in place, never copied.
enum Field {
    Session,
    Turn,
    Other,
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Field;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a property name")
            }
            fn visit_str<E>(self, s: &str) -> Result<Field, E> {
                Ok(match s {
                    "SessionId" => Field::Session,
                    "TurnId" => Field::Turn,
                    _ => Field::Other,
                })
            }
        }
        d.deserialize_identifier(V)
    }
}

/// A string value, or `None` for any other JSON value (skipped, not built).
struct Text<'de>(Option<Cow<'de, str>>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Some(Cow::Borrowed(s))))
            }
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Text(Some(Cow::Owned(s.to_owned()))))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Text(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Text(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Text(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Text(None))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Text(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Text(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Text(None))
            }
        }
        d.deserialize_any(V)
    }
}
