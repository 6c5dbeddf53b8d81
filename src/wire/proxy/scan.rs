//! Reading one JSON object's top level without building anything: each member's name and the
//! byte range of its value.
//!
//! Every value is checked against JSON's grammar exactly as `serde_json` checks a value it skips
//! (`ignore_value`: strings without raw control characters and with valid escapes, numbers in
//! JSON's form, any nesting), and a member name is read exactly as `serde_json` reads one (an
//! escaped name is decoded by `serde_json` itself). The differential tests below hold this to
//! what `serde_json` accepts. This runs for every message the proxy reads (issue 15: "no JSON
//! trees on the hot path"); only a failure goes back to `serde_json`, for its error message.
//!
//! Owns bytes only: no policy, no I/O.

use std::borrow::Cow;
use std::ops::Range;

/// The text is not one JSON object (the caller asks `serde_json` why).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invalid;

/// Calls `each(name, value)` for every member of the JSON object that is the whole of `text`
/// (whitespace around it allowed), in order; `value` is the range of the member's value in
/// `text`, without the whitespace around it. Members are reported as they are read: a caller
/// discards what it collected when this returns [`Invalid`].
pub fn object_members(
    text: &str,
    mut each: impl FnMut(Cow<'_, str>, Range<usize>),
) -> Result<(), Invalid> {
    let mut s = Scanner {
        b: text.as_bytes(),
        i: 0,
    };
    s.ws();
    s.eat(b'{')?;
    s.ws();
    if s.peek() == Some(b'}') {
        s.i += 1;
    } else {
        loop {
            s.ws();
            let name = s.name(text)?;
            s.ws();
            s.eat(b':')?;
            s.ws();
            let start = s.i;
            s.value()?;
            each(name, start..s.i);
            s.ws();
            match s.next()? {
                b',' => continue,
                b'}' => break,
                _ => return Err(Invalid),
            }
        }
    }
    s.ws();
    if s.i == s.b.len() {
        Ok(())
    } else {
        Err(Invalid)
    }
}

/// The text of a JSON string value (`"…"`, already checked): borrowed when it has no escapes,
/// decoded by `serde_json` otherwise (which also refuses what it would refuse, such as a lone
/// surrogate). `None` when `raw` is not a string.
pub fn string_value(raw: &str) -> Option<Cow<'_, str>> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    if !inner.contains('\\') {
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(raw).ok().map(Cow::Owned)
}

/// The brackets a value is inside (`true`: an object): a bit each for the first 64 levels (no
/// allocation for any real message), then a vector.
#[derive(Default)]
struct Frames {
    depth: usize,
    bits: u64,
    deeper: Vec<bool>,
}

impl Frames {
    fn push(&mut self, object: bool) {
        if self.depth < 64 {
            self.bits = (self.bits & !(1 << self.depth)) | (u64::from(object) << self.depth);
        } else {
            self.deeper.push(object);
        }
        self.depth += 1;
    }

    fn top(&self) -> Option<bool> {
        let at = self.depth.checked_sub(1)?;
        if at < 64 {
            Some(self.bits & (1 << at) != 0)
        } else {
            self.deeper.last().copied()
        }
    }

    fn pop(&mut self) {
        self.depth -= 1;
        if self.depth >= 64 {
            self.deeper.pop();
        }
    }
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn next(&mut self) -> Result<u8, Invalid> {
        let c = self.peek().ok_or(Invalid)?;
        self.i += 1;
        Ok(c)
    }

    fn eat(&mut self, want: u8) -> Result<(), Invalid> {
        if self.next()? == want {
            Ok(())
        } else {
            Err(Invalid)
        }
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    /// A member name: borrowed when it has no escapes, decoded as `serde_json` decodes a key
    /// (as [`string_value`] does, without looking again for a backslash the scan already saw:
    /// calling it here measured about 400 more instructions per call).
    fn name<'t>(&mut self, text: &'t str) -> Result<Cow<'t, str>, Invalid> {
        let start = self.i;
        if self.peek() != Some(b'"') {
            return Err(Invalid);
        }
        let escaped = self.string()?;
        let raw = &text[start..self.i];
        if escaped {
            serde_json::from_str::<String>(raw)
                .map(Cow::Owned)
                .map_err(|_| Invalid)
        } else {
            Ok(Cow::Borrowed(&raw[1..raw.len() - 1]))
        }
    }

    /// Skips a string starting at its opening quote; says whether it had an escape.
    fn string(&mut self) -> Result<bool, Invalid> {
        self.i += 1; // the opening quote
        let mut escaped = false;
        loop {
            self.skip_plain();
            match self.next()? {
                b'"' => return Ok(escaped),
                b'\\' => {
                    escaped = true;
                    match self.next()? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                        b'u' => {
                            let hex = self.b.get(self.i..self.i + 4).ok_or(Invalid)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return Err(Invalid);
                            }
                            self.i += 4;
                        }
                        _ => return Err(Invalid),
                    }
                }
                _ => return Err(Invalid), // a raw control character
            }
        }
    }

    /// Moves to the next byte that ends a run of plain string bytes (a quote, a backslash or a
    /// control character) or to the end, eight bytes at a time.
    fn skip_plain(&mut self) {
        const ONES: u64 = u64::from_ne_bytes([1; 8]);
        const HIGH: u64 = ONES << 7;
        let zero_byte = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
        while let Some(chunk) = self.b.get(self.i..self.i + 8) {
            let x = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
            let stop = zero_byte(x ^ (ONES * u64::from(b'"')))
                | zero_byte(x ^ (ONES * u64::from(b'\\')))
                | (x.wrapping_sub(ONES * 0x20) & !x & HIGH);
            if stop != 0 {
                // The lowest flagged byte is always a real one (borrows only run upwards).
                self.i += (stop.trailing_zeros() / 8) as usize;
                return;
            }
            self.i += 8;
        }
        while let Some(c) = self.peek() {
            if c == b'"' || c == b'\\' || c < 0x20 {
                return;
            }
            self.i += 1;
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), Invalid> {
        if self.b.get(self.i..self.i + word.len()) == Some(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(Invalid)
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
        self.i - start
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
    fn number(&mut self) -> Result<(), Invalid> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return Err(Invalid),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return Err(Invalid);
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(Invalid);
            }
        }
        Ok(())
    }

    /// One value of any depth, without recursion: `open` holds the enclosing brackets.
    fn value(&mut self) -> Result<(), Invalid> {
        let mut open = Frames::default();
        loop {
            // A value.
            match self.peek().ok_or(Invalid)? {
                b'"' => {
                    self.string()?;
                }
                b'-' | b'0'..=b'9' => self.number()?,
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                c @ (b'[' | b'{') => {
                    self.i += 1;
                    self.ws();
                    let object = c == b'{';
                    if self.peek() == Some(if object { b'}' } else { b']' }) {
                        self.i += 1; // empty
                    } else {
                        open.push(object);
                        if object {
                            self.member_name()?;
                        }
                        self.ws();
                        continue;
                    }
                }
                _ => return Err(Invalid),
            }
            // After a value: a comma and the next one, or closing brackets.
            loop {
                let Some(object) = open.top() else {
                    return Ok(());
                };
                self.ws();
                match (self.next()?, object) {
                    (b',', _) => {
                        self.ws();
                        if object {
                            self.member_name()?;
                            self.ws();
                        }
                        break;
                    }
                    (b']', false) | (b'}', true) => open.pop(),
                    _ => return Err(Invalid),
                }
            }
        }
    }

    /// Inside a nested object: a name (skipped as `serde_json` skips one) and its colon.
    fn member_name(&mut self) -> Result<(), Invalid> {
        if self.peek() != Some(b'"') {
            return Err(Invalid);
        }
        self.string()?;
        self.ws();
        self.eat(b':')?;
        self.ws();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::value::RawValue;

    /// What `serde_json` reads: the members as (decoded name, raw value text), or nothing.
    fn serde_reading(text: &str) -> Option<Vec<(String, String)>> {
        struct Members(Vec<(String, String)>);
        impl<'de> serde::Deserialize<'de> for Members {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> serde::de::Visitor<'de> for V {
                    type Value = Members;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("an object")
                    }
                    fn visit_map<A: serde::de::MapAccess<'de>>(
                        self,
                        mut map: A,
                    ) -> Result<Members, A::Error> {
                        let mut out = Vec::new();
                        while let Some(k) = map.next_key::<String>()? {
                            let v = map.next_value::<&'de RawValue>()?;
                            out.push((k, v.get().to_string()));
                        }
                        Ok(Members(out))
                    }
                }
                d.deserialize_map(V)
            }
        }
        serde_json::from_str::<Members>(text).ok().map(|m| m.0)
    }

    fn our_reading(text: &str) -> Option<Vec<(String, String)>> {
        let mut out = Vec::new();
        object_members(text, |k, v| out.push((k.into_owned(), text[v].to_string())))
            .ok()
            .map(|()| out)
    }

    fn same(text: &str) {
        assert_eq!(our_reading(text), serde_reading(text), "text: {text:?}");
    }

    #[test]
    fn reads_what_serde_json_reads_and_refuses_what_it_refuses() {
        for text in [
            r#"{}"#,
            r#" { } "#,
            "\t{\"a\":1}\r\n",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"b":[1,{"c":2}],"a":"\u00e9\n"}}}"#,
            r#"{"a":[],"b":{},"c":[[]],"d":[{}],"e":{"f":{"g":[1,2,3]}}}"#,
            r#"{"n":-0,"m":0.5e-7,"o":1E+2,"p":-12.25}"#,
            r#"{"t":true,"f":false,"z":null}"#,
            r#"{"\u0069d":1,"\"":2,"\\":3}"#,
            r#"{"a":"\ud800"}"#, // a lone surrogate in a skipped value: serde_json skips it
            r#"{"\ud800":1}"#,   // in a name: serde_json refuses it
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":1e}"#,
            r#"{"a":-}"#,
            r#"{"a":+1}"#,
            r#"{"a":.5}"#,
            r#"{"a":1,}"#,
            r#"{,"a":1}"#,
            r#"{"a" 1}"#,
            r#"{"a":[1,]}"#,
            r#"{"a":[,1]}"#,
            r#"{"a":{"b":1,}}"#,
            r#"{"a":{"b"}}"#,
            r#"{"a":{1:2}}"#,
            r#"{"a":[1}"#,
            r#"{"a":{"b":1]}"#,
            r#"{"a":tru}"#,
            r#"{"a":nul}"#,
            r#"{"a":"\x"}"#,
            r#"{"a":"\u12G4"}"#,
            r#"{"a":"\u12"}"#,
            "{\"a\":\"tab\there\"}",
            "{\"a\":\"\u{1f}\"}",
            r#"{"a":1}}"#,
            r#"{"a":1} x"#,
            r#"{"a":1"#,
            r#"{"a":"#,
            r#"{"a"#,
            r#"{"#,
            r#""#,
            r#"[1]"#,
            r#"1"#,
            r#"{"a":1}{"b":2}"#,
            r#"{"a":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}"#,
        ] {
            same(text);
        }
    }

    #[test]
    fn long_strings_stop_at_the_right_byte() {
        // The eight-byte scan: a stop byte in every position of a chunk, and multi-byte UTF-8.
        for at in 0..24 {
            for stop in ["\\n", "\"", "\u{1}", "é"] {
                let body = format!("{}{}{}", "x".repeat(at), stop, "y".repeat(9));
                same(&format!("{{\"k\":\"{body}\",\"z\":1}}"));
            }
        }
    }

    #[test]
    fn deep_nesting_is_read_without_recursion() {
        let depth = 100_000;
        let text = format!("{{\"a\":{}1{}}}", "[".repeat(depth), "]".repeat(depth));
        same(&text);
        let unclosed = format!("{{\"a\":{}1}}", "[".repeat(depth));
        same(&unclosed);
        // Objects and arrays mixed past the 64 levels kept as bits, closed right and wrong.
        let open: String = (0..200)
            .map(|i| if i % 3 == 0 { "{\"k\":" } else { "[" })
            .collect();
        let close: String = (0..200)
            .rev()
            .map(|i| if i % 3 == 0 { "}" } else { "]" })
            .collect();
        same(&format!("{{\"a\":{open}1{close}}}"));
        let wrong: String = (0..200)
            .rev()
            .map(|i| if i % 3 == 1 { "}" } else { "]" })
            .collect();
        same(&format!("{{\"a\":{open}1{wrong}}}"));
    }

    #[test]
    fn string_values_are_read_as_serde_json_reads_them() {
        assert_eq!(
            string_value(r#""tools/call""#).as_deref(),
            Some("tools/call")
        );
        assert_eq!(
            string_value(r#""tools\/call""#).as_deref(),
            Some("tools/call")
        );
        assert_eq!(string_value(r#""\ud800""#), None);
        assert_eq!(string_value("1"), None);
        assert_eq!(string_value("null"), None);
    }

    /// JSON-shaped text: pieces of valid and invalid JSON put together at random.
    fn jsonish() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("{".to_string()),
            Just("}".to_string()),
            Just("[".to_string()),
            Just("]".to_string()),
            Just(",".to_string()),
            Just(":".to_string()),
            Just(" ".to_string()),
            Just("\"".to_string()),
            Just("\\".to_string()),
            Just("\"k\"".to_string()),
            Just("\"id\"".to_string()),
            Just("\"\\u0069d\"".to_string()),
            Just("\"\\ud83d\\ude00\"".to_string()),
            Just("\"\\ud800\"".to_string()),
            Just("\\u00".to_string()),
            Just("true".to_string()),
            Just("nul".to_string()),
            Just("null".to_string()),
            Just("-".to_string()),
            Just("0".to_string()),
            Just("12".to_string()),
            Just(".5".to_string()),
            Just("e+".to_string()),
            Just("\n".to_string()),
            Just("\u{1}".to_string()),
            Just("é".to_string()),
            "[a-z]{0,12}",
        ];
        proptest::collection::vec(piece, 0..40).prop_map(|p| p.concat())
    }

    /// Valid objects of random shape (so that the accepting side is exercised as much as the
    /// refusing one), then the same text cut short or with one byte changed.
    fn valid_object() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(serde_json::Value::from),
            ".{0,20}".prop_map(serde_json::Value::from),
        ];
        let value = leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
                proptest::collection::btree_map(".{0,8}", inner, 0..6)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        });
        proptest::collection::btree_map(".{0,8}", value, 0..6).prop_map(|m| {
            serde_json::to_string_pretty(&serde_json::Value::Object(m.into_iter().collect()))
                .expect("serializes")
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn random_text_reads_as_serde_json_reads_it(text in jsonish()) {
            prop_assert_eq!(our_reading(&text), serde_reading(&text), "text: {:?}", text);
        }

        #[test]
        fn valid_objects_and_their_damaged_copies_read_as_serde_json_reads_them(
            text in valid_object(),
            cut in any::<prop::sample::Index>(),
            at in any::<prop::sample::Index>(),
            byte in prop::sample::select(vec![b'"', b'\\', b',', b':', b'}', b']', b'{', b'[', b'0', b'-', b'e', b'.', b' ', 1u8]),
        ) {
            prop_assert_eq!(our_reading(&text), serde_reading(&text), "text: {:?}", &text);
            prop_assert!(our_reading(&text).is_some());
            let mut cut_at = cut.index(text.len() + 1);
            while !text.is_char_boundary(cut_at) { cut_at -= 1; }
            let short = &text[..cut_at];
            prop_assert_eq!(our_reading(short), serde_reading(short), "text: {:?}", short);
            let mut bytes = text.clone().into_bytes();
            if !bytes.is_empty() {
                let i = at.index(bytes.len());
                if bytes[i].is_ascii() {
                    bytes[i] = byte;
                    let changed = String::from_utf8(bytes).expect("ASCII for ASCII");
                    prop_assert_eq!(our_reading(&changed), serde_reading(&changed), "text: {:?}", &changed);
                }
            }
        }
    }
}
