//! JSON values read without being built: skipped (within serde_json's nesting limit), counted
//! when they are arrays, or reduced to the one number the scan needs. Used by `scan` so a body
//! costs one pass and no allocation per element, whatever it holds.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// A property name, borrowed from the body unless it holds escapes.
pub(super) struct Key<'de>(pub(super) Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a property name")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// The scalar `visit_*` methods of a visitor that treats every scalar the same way.
macro_rules! scalars {
    ($value:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
}

pub(super) use scalars;

/// Any JSON value, read and dropped. Unlike [`IgnoredAny`](serde::de::IgnoredAny) it goes
/// through `deserialize_any`, so serde_json's nesting limit applies (as it did when bodies were
/// parsed into a tree).
pub(super) struct Skip;

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Kind).map(|_| Skip)
    }
}

/// Visits any value, drops it and says what it was.
pub(super) struct Kind;

impl<'de> Visitor<'de> for Kind {
    type Value = &'static str;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok("a boolean")
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok("a number")
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok("a number")
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok("a number")
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok("a string")
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok("null")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok("an array")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<Skip, Skip>()?.is_some() {}
        Ok("an object")
    }
}

/// The number of elements of a value that is an array; `None` for anything else (the typed read
/// reports the wrong type).
pub(super) struct Count(pub(super) Option<usize>);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Option<usize>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            scalars!(None);
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut n = 0;
                while seq.next_element::<Skip>()?.is_some() {
                    n += 1;
                }
                Ok(Some(n))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                Kind.visit_map(map).map(|_| None)
            }
        }
        d.deserialize_any(V).map(Count)
    }
}

/// The number of `Values` of a value that is a `RagScope` condition (an object whose `Values`
/// is an array); `None` otherwise.
pub(super) struct ConditionValues(pub(super) Option<usize>);

impl<'de> Deserialize<'de> for ConditionValues {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Option<usize>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            scalars!(None);
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Kind.visit_seq(seq).map(|_| None)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut values = None;
                while let Some(Key(key)) = map.next_key()? {
                    if key == "Values" {
                        values = map.next_value::<Count>()?.0;
                    } else {
                        map.next_value::<Skip>()?;
                    }
                }
                Ok(values)
            }
        }
        d.deserialize_any(V).map(ConditionValues)
    }
}
