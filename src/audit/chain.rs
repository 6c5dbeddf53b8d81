//! The hash chain, pure: canonical encoding of a record, its hash, its MAC, the anchor MAC and the
//! exact line format. Owns the bytes that are hashed and sealed. Must not touch files, clocks,
//! environment or keys on disk (the writer and the verifier bring those).
//!
//! # Canonical encoding (what `hash` covers)
//!
//! `hash = lowercase hex of SHA-256(C)` where `C` is the record **without** `hash` and `mac`,
//! encoded as compact JSON with object keys sorted, at every depth:
//!
//! ```text
//! {"data":D,"epoch":E,"prev":"P","run":"R","seq":N,"time":"T","type":"Y","v":1}
//! ```
//!
//! * Objects: keys sorted by their UTF-8 bytes (Rust `str` order), `{"k":v,...}`, no whitespace.
//! * Arrays: `[a,b]`, no whitespace. `null`, `true`, `false` as such.
//! * Strings: as `serde_json` writes them: UTF-8 as is; only `"`, `\` and control characters are
//!   escaped (`\"` `\\` `\b` `\f` `\n` `\r` `\t`, other controls as `\u00xx`, lowercase hex).
//! * Numbers: integers only, in decimal without sign for non-negative values, `-` for negative
//!   ones. A non-integer number is refused ([`ChainError::NonIntegerNumber`]): floats have no
//!   text form that every JSON implementation reproduces, so a verifier could not recompute
//!   the hash. Write durations in whole milliseconds, ratios as strings.
//!
//! # MACs
//!
//! * Record: `mac = lowercase hex of HMAC-SHA256(key, the 32 raw bytes of the hash)`.
//! * Anchor: `mac = lowercase hex of HMAC-SHA256(key, ASCII "SEQ:HASH")`, e.g. `"12:9f…"` with the
//!   hash in lowercase hex. The two messages differ in length (32 vs ≥ 66 bytes), so a record MAC
//!   can never stand in for an anchor MAC.
//!
//! # Line format
//!
//! One record per line, ending in `\n`, fields in this order, `data` in canonical encoding:
//!
//! ```text
//! {"v":1,"seq":N,"time":"T","type":"Y","run":"R","epoch":E,"prev":"P","data":D,"hash":"H","mac":"M"}
//! ```
//!
//! The verifier re-renders each parsed record and requires the exact same bytes, so duplicate
//! keys, escapes that decode to the same text, or extra whitespace are reported even though they
//! would parse to the same values.

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fmt;

/// The record format version written in `v`.
pub const FORMAT_VERSION: u64 = 1;

/// `prev` of the first record of a log (seq 1): 64 zeros.
pub const GENESIS_PREV: &str = "0000000000000000000000000000000000000000000000000000000000000000";

type HmacSha256 = Hmac<Sha256>;

/// Why a record cannot be encoded or sealed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("non-integer number {0} in record data (the canonical encoding accepts integers only)")]
    NonIntegerNumber(String),
    #[error("{field} is not 64 lowercase hex digits: {value:?}")]
    BadHex { field: &'static str, value: String },
    #[error("not a valid record: {0}")]
    Parse(String),
}

/// The per-user secret that seals records and anchors. 32 bytes; never printed.
#[derive(Clone)]
pub struct AuditKey {
    bytes: [u8; AuditKey::LEN],
    /// The HMAC state after the key block, prepared once: sealing a record then costs two
    /// compressions instead of four (two records per call).
    keyed: HmacSha256,
}

impl PartialEq for AuditKey {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for AuditKey {}

impl AuditKey {
    pub const LEN: usize = 32;

    pub fn from_bytes(bytes: [u8; AuditKey::LEN]) -> Self {
        // HMAC accepts keys of any length; 32 bytes cannot fail.
        let keyed =
            <HmacSha256 as KeyInit>::new_from_slice(&bytes).expect("HMAC accepts any key length");
        AuditKey { bytes, keyed }
    }

    fn hmac(&self) -> HmacSha256 {
        self.keyed.clone()
    }
}

impl fmt::Debug for AuditKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuditKey(<redacted>)")
    }
}

/// One audit record as it appears on a line. `hash` and `mac` are empty until [`Record::seal`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub v: u64,
    pub seq: u64,
    /// RFC 3339, UTC, milliseconds: `2025-06-01T12:00:00.123Z`.
    pub time: String,
    #[serde(rename = "type")]
    pub record_type: String,
    /// The agent run id (minted when the host connection starts).
    pub run: String,
    /// The execution epoch current when the record was written, if any.
    pub epoch: Option<String>,
    /// `hash` of the previous record, or [`GENESIS_PREV`] for seq 1.
    pub prev: String,
    pub data: Value,
    pub hash: String,
    pub mac: String,
}

impl Record {
    /// Parses one line (without its `\n`). Unknown or duplicate fields are refused.
    pub fn from_line(line: &str) -> Result<Record, ChainError> {
        serde_json::from_str(line).map_err(|e| ChainError::Parse(e.to_string()))
    }

    /// The canonical encoding that `hash` covers (see the module doc).
    pub fn canonical_body(&self) -> Result<Vec<u8>, ChainError> {
        let mut data = Vec::with_capacity(256);
        canonical_json(&self.data, &mut data)?;
        Ok(self.body_with_data(&data))
    }

    fn body_with_data(&self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(data.len() + 256);
        self.header().body_into(data, &mut out);
        out
    }

    /// The fields around `data` and the seal, borrowed: what [`Header`] renders.
    fn header(&self) -> Header<'_> {
        Header {
            v: self.v,
            seq: self.seq,
            time: &self.time,
            record_type: &self.record_type,
            run: &self.run,
            epoch: self.epoch.as_deref(),
            prev: &self.prev,
        }
    }

    /// The hash this record should carry: hex SHA-256 of [`Record::canonical_body`].
    pub fn compute_hash(&self) -> Result<String, ChainError> {
        Ok(crate::base::hashing::hex_lower(Sha256::digest(
            self.canonical_body()?,
        )))
    }

    /// Sets `hash` and `mac` from the other fields.
    pub fn seal(&mut self, key: &AuditKey) -> Result<(), ChainError> {
        self.seal_to_line(key).map(|_| ())
    }

    /// Seals and renders in one pass (the writer's hot path encodes `data` once).
    pub(crate) fn seal_to_line(&mut self, key: &AuditKey) -> Result<Vec<u8>, ChainError> {
        let mut data = Vec::with_capacity(256);
        canonical_json(&self.data, &mut data)?;
        Ok(self.seal_encoded_to_line(key, &data))
    }

    /// As [`Record::seal_to_line`] with `data` given as its canonical encoding (`self.data` is
    /// not read): the per-call records are encoded straight from their typed fields.
    pub(crate) fn seal_encoded_to_line(&mut self, key: &AuditKey, data: &[u8]) -> Vec<u8> {
        let mut line = Vec::with_capacity(data.len() + 400);
        let (hash, mac) = self.header().seal_into(
            key,
            data,
            &mut Vec::with_capacity(data.len() + 256),
            &mut line,
        );
        self.hash = hash.as_str().to_string();
        self.mac = mac.as_str().to_string();
        line
    }

    /// The record's line, without the trailing `\n` (see the module doc for the field order).
    pub fn to_line(&self) -> Result<Vec<u8>, ChainError> {
        let mut data = Vec::with_capacity(256);
        canonical_json(&self.data, &mut data)?;
        Ok(self.line_with_data(&data))
    }

    fn line_with_data(&self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(data.len() + 400);
        self.header()
            .line_into(data, &self.hash, &self.mac, &mut out);
        out
    }
}

/// A record's fields other than `data`, `hash` and `mac`, borrowed: the one renderer of both
/// the hashed body and the line, for [`Record`] and for the writer, which seals from the log's
/// own buffers without a [`Record`] (no string per field per record, two records per call).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Header<'a> {
    pub v: u64,
    pub seq: u64,
    pub time: &'a str,
    pub record_type: &'a str,
    pub run: &'a str,
    pub epoch: Option<&'a str>,
    pub prev: &'a str,
}

/// A record hash or MAC in lowercase hex, on the stack.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Hex64([u8; 64]);

impl fmt::Debug for Hex64 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Hex64 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Hex64 {
    fn of(bytes: &[u8]) -> Hex64 {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 64];
        for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
            pair[0] = DIGITS[(b >> 4) as usize];
            pair[1] = DIGITS[(b & 0x0f) as usize];
        }
        Hex64(out)
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("hex digits are ASCII")
    }
}

impl Header<'_> {
    /// Appends the canonical encoding that `hash` covers (see the module doc).
    fn body_into(&self, data: &[u8], out: &mut Vec<u8>) -> BodySpans {
        out.extend_from_slice(b"{\"data\":");
        out.extend_from_slice(data);
        out.extend_from_slice(b",\"epoch\":");
        let epoch = span(out, |out| {
            crate::base::canonical::write_opt_str(self.epoch, out)
        });
        out.extend_from_slice(b",\"prev\":");
        let prev = span(out, |out| crate::base::canonical::write_str(self.prev, out));
        out.extend_from_slice(b",\"run\":");
        let run = span(out, |out| crate::base::canonical::write_str(self.run, out));
        out.extend_from_slice(b",\"seq\":");
        let seq = span(out, |out| crate::base::canonical::write_u64(self.seq, out));
        out.extend_from_slice(b",\"time\":");
        let time = span(out, |out| crate::base::canonical::write_str(self.time, out));
        out.extend_from_slice(b",\"type\":");
        let record_type = span(out, |out| {
            crate::base::canonical::write_str(self.record_type, out)
        });
        out.extend_from_slice(b",\"v\":");
        let v = span(out, |out| crate::base::canonical::write_u64(self.v, out));
        out.push(b'}');
        BodySpans {
            epoch,
            prev,
            run,
            seq,
            time,
            record_type,
            v,
        }
    }

    /// Appends the record's line, without its `\n` (see the module doc for the field order).
    fn line_into(&self, data: &[u8], hash: &str, mac: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"v\":");
        crate::base::canonical::write_u64(self.v, out);
        out.extend_from_slice(b",\"seq\":");
        crate::base::canonical::write_u64(self.seq, out);
        out.extend_from_slice(b",\"time\":");
        crate::base::canonical::write_str(self.time, out);
        out.extend_from_slice(b",\"type\":");
        crate::base::canonical::write_str(self.record_type, out);
        out.extend_from_slice(b",\"run\":");
        crate::base::canonical::write_str(self.run, out);
        out.extend_from_slice(b",\"epoch\":");
        crate::base::canonical::write_opt_str(self.epoch, out);
        out.extend_from_slice(b",\"prev\":");
        crate::base::canonical::write_str(self.prev, out);
        out.extend_from_slice(b",\"data\":");
        out.extend_from_slice(data);
        out.extend_from_slice(b",\"hash\":");
        crate::base::canonical::write_str(hash, out);
        out.extend_from_slice(b",\"mac\":");
        crate::base::canonical::write_str(mac, out);
        out.push(b'}');
    }

    /// Seals the record and appends its line to `line` (`body` is scratch space, cleared
    /// first); returns the record's hash and MAC.
    pub(crate) fn seal_into(
        &self,
        key: &AuditKey,
        data: &[u8],
        body: &mut Vec<u8>,
        line: &mut Vec<u8>,
    ) -> (Hex64, Hex64) {
        body.clear();
        let spans = self.body_into(data, body);
        let digest = Sha256::digest(&body[..]);
        let mut mac = key.hmac();
        mac.update(&digest);
        let hash = Hex64::of(&digest);
        let mac = Hex64::of(&mac.finalize().into_bytes());
        // The line from the body's rendered fields ([`Header::line_into`]'s bytes, which the
        // tests and every `audit verify` check): each field escaped once, not twice. Written
        // out field by field: a loop over (name, field) pairs measured 400 more instructions
        // per record (its copies lose their constant lengths).
        let field = |r: &std::ops::Range<usize>| &body[r.clone()];
        line.extend_from_slice(b"{\"v\":");
        line.extend_from_slice(field(&spans.v));
        line.extend_from_slice(b",\"seq\":");
        line.extend_from_slice(field(&spans.seq));
        line.extend_from_slice(b",\"time\":");
        line.extend_from_slice(field(&spans.time));
        line.extend_from_slice(b",\"type\":");
        line.extend_from_slice(field(&spans.record_type));
        line.extend_from_slice(b",\"run\":");
        line.extend_from_slice(field(&spans.run));
        line.extend_from_slice(b",\"epoch\":");
        line.extend_from_slice(field(&spans.epoch));
        line.extend_from_slice(b",\"prev\":");
        line.extend_from_slice(field(&spans.prev));
        line.extend_from_slice(b",\"data\":");
        line.extend_from_slice(data);
        // Hex digits: nothing to escape.
        line.extend_from_slice(b",\"hash\":\"");
        line.extend_from_slice(&hash.0);
        line.extend_from_slice(b"\",\"mac\":\"");
        line.extend_from_slice(&mac.0);
        line.extend_from_slice(b"\"}");
        (hash, mac)
    }
}

/// Where [`Header::body_into`] rendered each field (value text, in the body).
struct BodySpans {
    epoch: std::ops::Range<usize>,
    prev: std::ops::Range<usize>,
    run: std::ops::Range<usize>,
    seq: std::ops::Range<usize>,
    time: std::ops::Range<usize>,
    record_type: std::ops::Range<usize>,
    v: std::ops::Range<usize>,
}

/// The range of `out` that `write` appends.
fn span(out: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>)) -> std::ops::Range<usize> {
    let start = out.len();
    write(out);
    start..out.len()
}

/// What a verifier needs from one parsed line: the recomputed hash and the writer's rendering,
/// from one encoding of `data` (the verifier's hot path).
pub(crate) struct Recomputed {
    pub digest: [u8; 32],
    pub hash: String,
    pub line: Vec<u8>,
}

impl Record {
    /// The hash this record should carry and the exact line the writer would have written.
    pub(crate) fn recompute(&self, data_scratch: &mut Vec<u8>) -> Result<Recomputed, ChainError> {
        data_scratch.clear();
        canonical_json(&self.data, data_scratch)?;
        let digest: [u8; 32] = Sha256::digest(self.body_with_data(data_scratch)).into();
        Ok(Recomputed {
            digest,
            hash: crate::base::hashing::hex_lower(digest),
            line: self.line_with_data(data_scratch),
        })
    }
}

/// The key's HMAC state, prepared once: checking many record MACs (a verifier, the writer's
/// tail check) then costs two compressions each instead of four.
pub(crate) struct MacChecker(HmacSha256);

impl MacChecker {
    pub(crate) fn new(key: &AuditKey) -> MacChecker {
        MacChecker(key.hmac())
    }

    /// As [`verify_record_mac`], for a hash already in bytes (the verifier recomputed it).
    pub(crate) fn verify_digest(
        &self,
        digest: &[u8; 32],
        mac_hex: &str,
    ) -> Result<bool, ChainError> {
        let tag = decode_digest("mac", mac_hex)?;
        let mut mac = self.0.clone();
        mac.update(digest);
        Ok(mac.verify_slice(&tag).is_ok())
    }
}

/// Whether `s` is a SHA-256 digest in lowercase hex (the only spelling the writer produces).
pub fn is_digest_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn decode_digest(field: &'static str, value: &str) -> Result<[u8; 32], ChainError> {
    let bad = || ChainError::BadHex {
        field,
        value: value.to_owned(),
    };
    // Lowercase hex only (the one spelling the writer produces), decoded without the generic
    // decoder: the verifier decodes one MAC per record.
    let bytes = value.as_bytes();
    if bytes.len() != 64 {
        return Err(bad());
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        match (nibble(pair[0]), nibble(pair[1])) {
            (Some(h), Some(l)) => out[i] = (h << 4) | l,
            _ => return Err(bad()),
        }
    }
    Ok(out)
}

/// `mac` for a record whose hash is `hash_hex`.
pub fn record_mac(key: &AuditKey, hash_hex: &str) -> Result<String, ChainError> {
    let digest = decode_digest("hash", hash_hex)?;
    let mut mac = key.hmac();
    mac.update(&digest);
    Ok(crate::base::hashing::hex_lower(mac.finalize().into_bytes()))
}

/// Checks a record MAC in constant time. Malformed hex in either field is an error.
pub fn verify_record_mac(
    key: &AuditKey,
    hash_hex: &str,
    mac_hex: &str,
) -> Result<bool, ChainError> {
    let digest = decode_digest("hash", hash_hex)?;
    let tag = decode_digest("mac", mac_hex)?;
    let mut mac = key.hmac();
    mac.update(&digest);
    Ok(mac.verify_slice(&tag).is_ok())
}

/// HMAC-SHA256 of `message` under the key, for uses outside the log (e.g. the keyed digest of a
/// declared env value). Callers start `message` with their own domain tag, so no such tag can
/// collide with a record MAC (over 32 raw bytes) or an anchor MAC (over `seq:hash`).
pub fn keyed_digest(key: &AuditKey, message: &[u8]) -> String {
    let mut mac = key.hmac();
    mac.update(message);
    crate::base::hashing::hex_lower(mac.finalize().into_bytes())
}

/// `mac` of an anchor naming head `seq` with hash `hash_hex`.
pub fn anchor_mac(key: &AuditKey, seq: u64, hash_hex: &str) -> String {
    let mut mac = key.hmac();
    mac.update(format!("{seq}:{hash_hex}").as_bytes());
    crate::base::hashing::hex_lower(mac.finalize().into_bytes())
}

/// Checks an anchor MAC in constant time.
pub fn verify_anchor_mac(
    key: &AuditKey,
    seq: u64,
    hash_hex: &str,
    mac_hex: &str,
) -> Result<bool, ChainError> {
    let tag = decode_digest("anchor mac", mac_hex)?;
    let mut mac = key.hmac();
    mac.update(format!("{seq}:{hash_hex}").as_bytes());
    Ok(mac.verify_slice(&tag).is_ok())
}

/// A record's `data` as the writer receives it: a JSON tree, or the canonical encoding a typed
/// record wrote directly (the two records of every call skip the tree and its allocations).
#[derive(Debug, Clone, PartialEq)]
pub enum RecordData {
    Tree(Value),
    /// Exactly the bytes [`canonical_json`] gives for the same data (the typed encoders are
    /// tested against it).
    Canonical(Vec<u8>),
}

impl From<Value> for RecordData {
    fn from(v: Value) -> Self {
        RecordData::Tree(v)
    }
}

impl RecordData {
    /// The data as a tree (parsing a canonical encoding back; for readers and tests).
    pub fn into_value(self) -> Value {
        match self {
            RecordData::Tree(v) => v,
            RecordData::Canonical(b) => {
                serde_json::from_slice(&b).expect("a canonical encoding is JSON")
            }
        }
    }
}

/// Appends the canonical encoding of `value` to `out` (see the module doc): the crate's one
/// encoder ([`crate::base::canonical`]) with integers only.
pub fn canonical_json(value: &Value, out: &mut Vec<u8>) -> Result<(), ChainError> {
    crate::base::canonical::write(value, crate::base::canonical::Numbers::IntegersOnly, out)
        .map_err(|e| ChainError::NonIntegerNumber(e.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Record {
        Record {
            v: FORMAT_VERSION,
            seq: 1,
            time: "2025-06-01T12:00:00.123Z".into(),
            record_type: "tool_called".into(),
            run: "run-1".into(),
            epoch: Some("E1".into()),
            prev: GENESIS_PREV.into(),
            data: json!({"tool": "write", "callId": 7, "b": [true, null, -3]}),
            hash: String::new(),
            mac: String::new(),
        }
    }

    const SAMPLE_BODY: &str = concat!(
        r#"{"data":{"b":[true,null,-3],"callId":7,"tool":"write"},"epoch":"E1","prev":""#,
        "0000000000000000000000000000000000000000000000000000000000000000",
        r#"","run":"run-1","seq":1,"time":"2025-06-01T12:00:00.123Z","type":"tool_called","v":1}"#
    );

    proptest::proptest! {
        /// The writer builds a sealed line from the body's rendered fields; it is byte for byte
        /// the line [`Header::line_into`] renders (what `audit verify` compares against), for
        /// any field text, escapes included.
        #[test]
        fn the_sealed_line_is_the_rendered_line(
            seq in proptest::prelude::any::<u64>(),
            time in ".{0,30}",
            record_type in ".{1,20}",
            run in ".{1,30}",
            epoch in proptest::option::of(".{0,30}"),
            prev in ".{0,70}",
        ) {
            let mut r = Record { seq, time, record_type, run, epoch, prev, ..sample() };
            let sealed = r.seal_to_line(&AuditKey::from_bytes([9; 32])).unwrap();
            proptest::prop_assert_eq!(
                String::from_utf8(sealed).unwrap(),
                String::from_utf8(r.to_line().unwrap()).unwrap()
            );
        }
    }

    #[test]
    fn canonical_body_is_sorted_compact_json() {
        let body = sample().canonical_body().unwrap();
        assert_eq!(std::str::from_utf8(&body).unwrap(), SAMPLE_BODY);
    }

    #[test]
    fn body_agrees_with_generic_canonical_encoder() {
        let r = sample();
        let as_value = json!({
            "v": r.v, "seq": r.seq, "time": r.time, "type": r.record_type, "run": r.run,
            "epoch": r.epoch, "prev": r.prev, "data": r.data,
        });
        let mut generic = Vec::new();
        canonical_json(&as_value, &mut generic).unwrap();
        assert_eq!(generic, r.canonical_body().unwrap());
    }

    #[test]
    fn hash_is_pinned() {
        // Pinned so that any change to the canonical encoding is a deliberate format change.
        let h = sample().compute_hash().unwrap();
        assert_eq!(h, hex::encode(Sha256::digest(SAMPLE_BODY.as_bytes())));
        assert_eq!(
            h,
            "51c8d7b81c4f9f473bb471eddfaf6f3b8aca131532636f39b0f1416f45886117"
        );
    }

    #[test]
    fn nested_keys_sort_bytewise_and_strings_escape() {
        let mut out = Vec::new();
        canonical_json(
            &json!({"b": {"z": 1, "a": "x\"y\n\u{1}é"}, "B": 0, "a": []}),
            &mut out,
        )
        .unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"B":0,"a":[],"b":{"a":"x\"y\n\u0001é","z":1}}"#
        );
    }

    #[test]
    fn floats_are_refused_even_when_nested() {
        let mut out = Vec::new();
        let err = canonical_json(&json!({"a": [{"d": 1.5}]}), &mut out).unwrap_err();
        assert_eq!(err, ChainError::NonIntegerNumber("1.5".into()));
        let mut r = sample();
        r.data = json!({"durationMs": 0.25});
        assert!(matches!(
            r.seal(&AuditKey::from_bytes([1; 32])),
            Err(ChainError::NonIntegerNumber(_))
        ));
    }

    #[test]
    fn extreme_integers_encode_exactly() {
        let mut out = Vec::new();
        canonical_json(&json!([u64::MAX, i64::MIN, 0]), &mut out).unwrap();
        assert_eq!(out, format!("[{},{},0]", u64::MAX, i64::MIN).into_bytes());
    }

    #[test]
    fn seal_then_parse_round_trips_and_macs_verify() {
        let key = AuditKey::from_bytes([7; 32]);
        let mut r = sample();
        let line = r.seal_to_line(&key).unwrap();
        assert_eq!(line, r.to_line().unwrap());
        assert!(line.starts_with(br#"{"v":1,"seq":1,"time":"#));
        let parsed = Record::from_line(std::str::from_utf8(&line).unwrap()).unwrap();
        assert_eq!(parsed, r);
        assert_eq!(parsed.compute_hash().unwrap(), r.hash);
        assert_eq!(record_mac(&key, &r.hash).unwrap(), r.mac);
        assert!(verify_record_mac(&key, &r.hash, &r.mac).unwrap());
        assert!(!verify_record_mac(&AuditKey::from_bytes([8; 32]), &r.hash, &r.mac).unwrap());
    }

    #[test]
    fn changing_any_hashed_field_changes_the_hash() {
        let base = sample().compute_hash().unwrap();
        type Mutation = Box<dyn Fn(&mut Record)>;
        let mutations: Vec<Mutation> = vec![
            Box::new(|r| r.v = 2),
            Box::new(|r| r.seq = 2),
            Box::new(|r| r.time.push('0')),
            Box::new(|r| r.record_type = "tool_result".into()),
            Box::new(|r| r.run = "run-2".into()),
            Box::new(|r| r.epoch = None),
            Box::new(|r| r.prev = "1".repeat(64)),
            Box::new(|r| r.data["tool"] = json!("read")),
        ];
        for (i, m) in mutations.iter().enumerate() {
            let mut r = sample();
            m(&mut r);
            assert_ne!(
                r.compute_hash().unwrap(),
                base,
                "mutation {i} did not change the hash"
            );
        }
    }

    #[test]
    fn parse_refuses_unknown_and_duplicate_fields() {
        let key = AuditKey::from_bytes([7; 32]);
        let mut r = sample();
        let line = String::from_utf8(r.seal_to_line(&key).unwrap()).unwrap();
        let extra = line.replacen("{\"v\":1,", "{\"v\":1,\"x\":0,", 1);
        assert!(
            Record::from_line(&extra)
                .unwrap_err()
                .to_string()
                .contains("unknown field")
        );
        let dup = line.replacen("{\"v\":1,", "{\"v\":1,\"v\":1,", 1);
        assert!(
            Record::from_line(&dup)
                .unwrap_err()
                .to_string()
                .contains("duplicate field")
        );
    }

    #[test]
    fn anchor_mac_binds_seq_and_hash() {
        let key = AuditKey::from_bytes([3; 32]);
        let h = "a".repeat(64);
        let m = anchor_mac(&key, 12, &h);
        assert!(verify_anchor_mac(&key, 12, &h, &m).unwrap());
        assert!(!verify_anchor_mac(&key, 13, &h, &m).unwrap());
        assert!(!verify_anchor_mac(&key, 12, &"b".repeat(64), &m).unwrap());
        assert_ne!(m, record_mac(&key, &h).unwrap());
    }

    #[test]
    fn malformed_hex_is_an_error_not_a_mismatch() {
        let key = AuditKey::from_bytes([3; 32]);
        assert!(matches!(
            record_mac(&key, "ABC"),
            Err(ChainError::BadHex { field: "hash", .. })
        ));
        let upper = "A".repeat(64);
        assert!(!is_digest_hex(&upper));
        assert!(verify_record_mac(&key, &"a".repeat(64), &upper).is_err());
    }

    #[test]
    fn key_debug_is_redacted() {
        assert_eq!(
            format!("{:?}", AuditKey::from_bytes([0x41; 32])),
            "AuditKey(<redacted>)"
        );
    }
}
