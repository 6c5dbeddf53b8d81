//! The one canonical JSON encoding behind every digest: identity components, catalog digests
//! (whole and per tool) and the audit chain.
//!
//! Owns: the byte encoding. Must not touch: hashing, I/O.
//!
//! The encoding: no whitespace; object keys sorted by their UTF-8 bytes (explicitly, so the
//! result does not depend on serde_json's `preserve_order` feature being off); strings escaped
//! as serde_json escapes them (deterministic); arrays in their order. Numbers follow a
//! [`Numbers`] policy, the only thing the three users differ in.

use std::fmt::Write as _;

use serde_json::Value;

/// How numbers other than integers are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numbers {
    /// Integers only; any other number is refused. The audit chain: a float has no single
    /// decimal text, so a verifier in another language could not recompute the hash.
    IntegersOnly,
    /// Integral floats (`1.0`) as integers (`1`), as in RFC 8785; other floats as serde_json
    /// prints them. Catalogs and identity: servers and configs write what they write.
    Integral,
}

/// A number the [`Numbers::IntegersOnly`] policy refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("non-integer number {0} has no canonical encoding")]
pub struct NonInteger(pub String);

/// Appends the canonical encoding of `value` to `out`.
pub fn write(value: &Value, numbers: Numbers, out: &mut Vec<u8>) -> Result<(), NonInteger> {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(n, numbers, out)?,
        Value::String(s) => write_str(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, numbers, out)?;
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(k, out);
                out.push(b':');
                write(v, numbers, out)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

/// The canonical encoding of `value` as bytes.
pub fn to_vec(value: &Value, numbers: Numbers) -> Result<Vec<u8>, NonInteger> {
    let mut out = Vec::new();
    write(value, numbers, &mut out)?;
    Ok(out)
}

/// The canonical encoding under [`Numbers::Integral`], which accepts every value.
pub fn to_string(value: &Value) -> String {
    let bytes = to_vec(value, Numbers::Integral).expect("the integral policy accepts every number");
    String::from_utf8(bytes).expect("JSON text is UTF-8")
}

/// A JSON string literal, or `null`.
pub fn write_opt_str(s: Option<&str>, out: &mut Vec<u8>) {
    match s {
        Some(s) => write_str(s, out),
        None => out.extend_from_slice(b"null"),
    }
}

/// A non-negative integer in decimal (no `String` per number), or `null`.
pub fn write_opt_u64(n: Option<u64>, out: &mut Vec<u8>) {
    match n {
        Some(n) => write_u64(n, out),
        None => out.extend_from_slice(b"null"),
    }
}

/// A non-negative integer in decimal, appended.
pub fn write_u64(n: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// A JSON string literal.
pub fn write_str(s: &str, out: &mut Vec<u8>) {
    // Fast path (most strings: names, ids, hex digests): nothing to escape, so the literal is the
    // bytes in quotes, exactly what serde_json writes. The audit verifier renders every string
    // of every record; serde_json's escaper goes byte by byte.
    // (A fold without short-circuit: the compiler vectorizes it.)
    let needs_escape = s.bytes().fold(false, |acc, b| {
        acc | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if !needs_escape {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        return;
    }
    serde_json::to_writer(&mut *out, s).expect("writing a str into a Vec cannot fail");
}

fn write_number(
    n: &serde_json::Number,
    numbers: Numbers,
    out: &mut Vec<u8>,
) -> Result<(), NonInteger> {
    // 2^53: beyond it an f64 no longer holds every integer, so leave such values as printed.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    let mut text = String::new();
    if let Some(u) = n.as_u64() {
        let _ = write!(text, "{u}");
    } else if let Some(i) = n.as_i64() {
        let _ = write!(text, "{i}");
    } else {
        match (numbers, n.as_f64()) {
            (Numbers::IntegersOnly, _) => return Err(NonInteger(n.to_string())),
            // `-0.0` becomes `0`, like RFC 8785.
            (Numbers::Integral, Some(f)) if f.fract() == 0.0 && f.abs() < EXACT => {
                let _ = write!(text, "{}", f as i64);
            }
            (Numbers::Integral, _) => {
                let _ = write!(text, "{n}");
            }
        }
    }
    out.extend_from_slice(text.as_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {

    #[test]
    fn write_str_matches_serde_json() {
        let samples = [
            "",
            "plain",
            "with \"quote\"",
            "back\\slash",
            "tab\there",
            "nl\n",
            "\u{1}\u{1f}",
            "\u{7f} del",
            "é ü 中文 🦀",
            "\u{202e}rtl",
            "</script>",
            "a/b",
        ];
        for s in samples {
            let mut ours = Vec::new();
            write_str(s, &mut ours);
            assert_eq!(ours, serde_json::to_vec(s).unwrap(), "{s:?}");
        }
        for b in 0u8..=0x7f {
            let s = format!("x{}y", b as char);
            let mut ours = Vec::new();
            write_str(&s, &mut ours);
            assert_eq!(ours, serde_json::to_vec(&s).unwrap(), "{b:#x}");
        }
    }

    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn keys_sorted_compact_and_numbers_by_policy() {
        let v = json!({"b": [1, 2.0, -0.0], "a": {"z": "é\n", "y": null}});
        assert_eq!(to_string(&v), r#"{"a":{"y":null,"z":"é\n"},"b":[1,2,0]}"#);
        assert_eq!(
            to_vec(&json!({"x": 1.5}), Numbers::IntegersOnly),
            Err(NonInteger("1.5".into()))
        );
        assert_eq!(to_string(&json!(1.5)), "1.5");
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|i| json!(i)),
            ".{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// For integer-only values the three former encoders agreed with serde_json's sorted
        /// compact output; the one encoder keeps every digest recorded before it.
        #[test]
        fn matches_serde_json_for_integer_values(v in arb_json()) {
            let ours = to_vec(&v, Numbers::IntegersOnly).unwrap();
            prop_assert_eq!(String::from_utf8(ours).unwrap(), serde_json::to_string(&v).unwrap());
            prop_assert_eq!(to_string(&v), serde_json::to_string(&v).unwrap());
        }
    }
}
