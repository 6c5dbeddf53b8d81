//! SHA-256 helpers shared by identity capture, the store and catalog digests.
//!
//! Owns the digest text format (`sha256:<64 hex>`) and streaming file hashing. sha2 picks SHA-NI
//! at run time; the dev profile compiles it at opt-level 3 (see Cargo.toml).

use std::io::{self, Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

/// Read/copy buffer: large enough that syscalls vanish next to hashing, small enough for the stack
/// of a helper thread when boxed.
pub const BUF_SIZE: usize = 1 << 20;

/// Lowercase hex of bytes, table-driven (the `hex` crate's encoder goes char by char, which
/// showed up in profiles of the per-call audit path).
pub fn hex_lower(bytes: impl AsRef<[u8]>) -> String {
    let bytes = bytes.as_ref();
    let mut out = Vec::with_capacity(bytes.len() * 2);
    push_hex(bytes, &mut out);
    String::from_utf8(out).expect("hex digits are ASCII")
}

/// Lowercase hex digit pairs of `bytes` onto `out`: into a byte buffer, then one (cheap, ASCII)
/// UTF-8 check by the caller (four digests per call; a `char` push per digit costs more).
fn push_hex(bytes: &[u8], out: &mut Vec<u8>) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.extend_from_slice(&[DIGITS[(b >> 4) as usize], DIGITS[(b & 0x0f) as usize]]);
    }
}

/// `sha256:<hex>` of a byte slice.
pub fn sha256_bytes(bytes: &[u8]) -> String {
    prefixed(&Sha256::digest(bytes))
}

/// Bare hex of a byte slice.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex_lower(Sha256::digest(bytes))
}

pub fn prefixed(raw: &[u8]) -> String {
    // One allocation: the digest of every call's arguments goes through here.
    let mut out = Vec::with_capacity(7 + raw.len() * 2);
    out.extend_from_slice(b"sha256:");
    push_hex(raw, &mut out);
    String::from_utf8(out).expect("hex digits are ASCII")
}

/// Short form for status lines: `sha256:9e4c1b2d…`.
pub fn short(digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    let cut: String = hex.chars().take(8).collect();
    format!("sha256:{cut}…")
}

/// Whether two secrets-derived texts (MACs, proofs) are equal, compared without an early exit:
/// the time taken says nothing about where they first differ. Only their lengths, which are
/// fixed and public, show.
pub fn same_secret_text(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Streams a reader through SHA-256; returns (`sha256:<hex>`, bytes read).
pub fn sha256_reader(mut reader: impl Read) -> io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; BUF_SIZE];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    Ok((prefixed(&hasher.finalize()), total))
}

/// Hashes a file by path: a regular file only, opened without waiting (a named pipe planted
/// where a file was hashed before, such as the wrapper, must not hang the session).
pub fn sha256_file(path: &Path) -> io::Result<(String, u64)> {
    sha256_reader(crate::base::fsutil::open_regular(path)?)
}

/// Copies `reader` into `writer` while hashing the same bytes in one pass: what was hashed is
/// exactly what was written.
pub fn sha256_copy(mut reader: impl Read, mut writer: impl Write) -> io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; BUF_SIZE];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        writer.write_all(&buf[..n])?;
        total += n as u64;
    }
    writer.flush()?;
    Ok((prefixed(&hasher.finalize()), total))
}

/// Digest of a value's canonical JSON encoding (serde_json maps are sorted by key, output is
/// compact), so field order in the source never matters.
pub fn sha256_json(value: &serde_json::Value) -> String {
    sha256_bytes(crate::base::canonical::to_string(value).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_texts_are_equal_only_when_every_byte_is() {
        let mac = "9f".repeat(32);
        assert!(same_secret_text(mac.as_bytes(), mac.clone().as_bytes()));
        let mut last = mac.clone();
        last.replace_range(63..64, "e");
        assert!(!same_secret_text(mac.as_bytes(), last.as_bytes()));
        assert!(!same_secret_text(mac.as_bytes(), &mac.as_bytes()[..63]));
        assert!(!same_secret_text(mac.as_bytes(), b""));
        assert!(same_secret_text(b"", b""));
    }

    #[test]
    fn known_vector() {
        assert_eq!(
            sha256_bytes(b"abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn copy_hashes_what_it_writes() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut out = Vec::new();
        let (d, n) = sha256_copy(&data[..], &mut out).unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(out, data);
        assert_eq!(d, sha256_bytes(&data));
    }

    #[test]
    fn json_digest_ignores_key_order() {
        let a: serde_json::Value = serde_json::from_str(r#"{"a":1,"b":[1,2]}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{ "b":[1,2], "a":1 }"#).unwrap();
        assert_eq!(sha256_json(&a), sha256_json(&b));
        let c: serde_json::Value = serde_json::from_str(r#"{"a":1,"b":[2,1]}"#).unwrap();
        assert_ne!(sha256_json(&a), sha256_json(&c));
    }

    #[test]
    fn hex_matches_the_hex_crate() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(hex_lower(&bytes), hex::encode(&bytes));
        assert_eq!(hex_lower([]), "");
    }

    #[test]
    fn short_form() {
        assert_eq!(short("sha256:9e4c1b2d0000"), "sha256:9e4c1b2d…");
    }
}
