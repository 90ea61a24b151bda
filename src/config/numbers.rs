//! Forms a list setting may take where the environment sets it: the `config` crate reads
//! `APTIX__…=4` as a number and `=2,4` as a list of strings, and a file gives a TOML array.

/// A list of numbers given as a list, or as one number (what the environment's
/// `APTIX__AMQP__DRAINING_STAGE_PARTITIONS=4` reads as), or as a comma-separated string.
pub(super) fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u16>, D::Error> {
    struct Numbers;
    impl<'de> serde::de::Visitor<'de> for Numbers {
        type Value = Vec<u16>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of numbers, a number, or numbers separated by commas")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Vec<u16>, E> {
            u16::try_from(v).map(|v| vec![v]).map_err(E::custom)
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Vec<u16>, E> {
            u16::try_from(v).map(|v| vec![v]).map_err(E::custom)
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Vec<u16>, E> {
            let items = v.split(',').map(str::trim).filter(|s| !s.is_empty());
            items
                .map(|n| n.parse().map_err(|_| E::custom(format!("`{n}` is not a number"))))
                .collect()
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u16>, A::Error> {
            let mut out = Vec::new();
            while let Some(n) = seq.next_element()? {
                out.push(n);
            }
            Ok(out)
        }
    }
    d.deserialize_any(Numbers)
}
