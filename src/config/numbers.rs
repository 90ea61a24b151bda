//! Forms a list setting may take: the environment gives its text (`APTIX__…=4`, `=2, 4`, or an
//! empty value), a file a TOML array.

use serde::de::{Deserializer, Error, SeqAccess, Visitor};

/// A list of numbers given as a list, or as one number (what the environment's
/// `APTIX__AMQP__DRAINING_STAGE_PARTITIONS=4` reads as), or as a comma-separated string; blank
/// items are skipped.
pub(super) fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u16>, D::Error> {
    Ok(d.deserialize_any(Numbers)?.into_iter().flatten().collect())
}

/// Numbers, each `None` where an item is blank.
struct Numbers;

impl<'de> Visitor<'de> for Numbers {
    type Value = Vec<Option<u16>>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list of numbers, a number, or numbers separated by commas")
    }
    fn visit_u64<E: Error>(self, v: u64) -> Result<Self::Value, E> {
        One.visit_u64(v).map(|n| vec![n])
    }
    fn visit_i64<E: Error>(self, v: i64) -> Result<Self::Value, E> {
        One.visit_i64(v).map(|n| vec![n])
    }
    fn visit_str<E: Error>(self, v: &str) -> Result<Self::Value, E> {
        v.split(',').map(|item| One.visit_str(item)).collect()
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Item(n)) = seq.next_element()? {
            out.push(n);
        }
        Ok(out)
    }
}

/// One item of the list.
struct Item(Option<u16>);

impl<'de> serde::Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(One).map(Item)
    }
}

/// One number, or a blank item.
struct One;

impl Visitor<'_> for One {
    type Value = Option<u16>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a number")
    }
    fn visit_u64<E: Error>(self, v: u64) -> Result<Self::Value, E> {
        u16::try_from(v).map(Some).map_err(E::custom)
    }
    fn visit_i64<E: Error>(self, v: i64) -> Result<Self::Value, E> {
        u16::try_from(v).map(Some).map_err(E::custom)
    }
    fn visit_str<E: Error>(self, v: &str) -> Result<Self::Value, E> {
        let v = v.trim();
        if v.is_empty() {
            return Ok(None);
        }
        v.parse().map(Some).map_err(|_| E::custom(format!("`{v}` is not a number")))
    }
}
