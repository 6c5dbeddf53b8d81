//! Catalog revisions: what the server *says* its tools are.
//!
//! Owns the canonical digest of a merged `tools/list` result, the revision numbering of the digests
//! a run has seen ([`CatalogHistory`]), and the field-level diff between two catalogs shown to the
//! human with every status line and approval prompt ([`CatalogDiff`]).
//!
//! Pure: no I/O, no clock, no knowledge of epochs or grants. It must not decide anything about
//! authorization: annotations such as `readOnlyHint` are diffed so a reviewer *sees* them change,
//! and nothing here (or anywhere) uses them for gating; that is `approval`'s business.
//!
//! # What the digest covers, and why
//!
//! Per tool, exactly these fields (the MCP `Tool` fields a host can use to select, fill in,
//! display or restrict a call):
//!
//! | field | why it is hashed |
//! |---|---|
//! | `name` | what the host calls; adding, removing or renaming a tool changes the contract |
//! | `title` | what the human sees in the approval card |
//! | `description` | what the model reads to decide when and how to call; a changed side effect shows up here |
//! | `inputSchema` | the argument contract: required fields, types, enums, defaults, bounds, object shape |
//! | `outputSchema` | the agent uses structured results to pick its next step |
//! | `annotations` | untrusted hints, but shown to the reviewer, so the review must stay accurate |
//! | `icons` | presentation in the host UI, part of what the reviewer is shown |
//! | `execution` | how the call runs (e.g. task support): the host must drive it differently |
//!
//! Not hashed:
//! - `_meta`: protocol and SDK metadata (tracing ids, vendor keys, generated values) that is not
//!   part of the tool's contract; hashing it would mint new revisions, and force refetches, for
//!   changes nobody can act on.
//! - unknown fields: we cannot say what they mean, and SDK upgrades add fields with default
//!   values, which would churn revisions for the same server. A field earns a place in the list
//!   when the spec gives it a meaning a host acts on; adding one bumps [`DIGEST_DOMAIN`].
//!
//! A hashed field whose value is `null` counts as absent (SDKs differ in emitting `null` or
//! omitting). The list is sorted by name, so tool order does not matter; object keys are sorted
//! by their UTF-8 bytes, so key order does not matter; integral floats (`1.0`) are encoded as
//! integers (`1`), as in RFC 8785. Array order (`enum`, `required`) is kept: it is what was sent.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::base::canonical::{self, Numbers};

mod diff;
mod history;
#[cfg(test)]
mod tests;

pub use diff::*;
pub use history::*;

/// Domain-separation prefix hashed before the canonical tool list. Bump the version when the
/// field list or the canonical encoding changes, so old and new digests can never collide.
pub const DIGEST_DOMAIN: &str = "cargo-mcp-dev/catalog/v1\n";

/// Domain-separation prefix of one tool's digest ([`Catalog::tool_digests`]).
pub const TOOL_DIGEST_DOMAIN: &str = "cargo-mcp-dev/catalog-tool/v1\n";

/// The `Tool` fields covered by the digest and the diff, in canonical order (see the module doc).
pub const HASHED_FIELDS: [&str; 8] = [
    "name",
    "title",
    "description",
    "inputSchema",
    "outputSchema",
    "annotations",
    "icons",
    "execution",
];

/// Why a merged `tools/list` result cannot be a catalog.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("tools/list entry {index} is not a JSON object")]
    NotAnObject { index: usize },
    #[error("tools/list entry {index} has no string `name`")]
    MissingName { index: usize },
    #[error("tools/list names tool `{0}` more than once")]
    DuplicateName(String),
}

/// One server's tool list as fetched (all pages merged by the caller), with its digest.
#[derive(Debug, Clone, PartialEq)]
pub struct Catalog {
    /// Tools exactly as received, in the order received.
    tools: Vec<Value>,
    /// Name -> index into `tools`.
    by_name: BTreeMap<String, usize>,
    digest: String,
    /// Name -> digest of that tool's hashed fields (what "this tool changed" means).
    tool_digests: BTreeMap<String, String>,
}

impl Catalog {
    /// Validates names (present, strings, unique) and computes the digest.
    pub fn from_tools(tools: Vec<Value>) -> Result<Catalog, CatalogError> {
        let mut by_name = BTreeMap::new();
        for (index, tool) in tools.iter().enumerate() {
            let obj = tool
                .as_object()
                .ok_or(CatalogError::NotAnObject { index })?;
            let name = obj
                .get("name")
                .and_then(Value::as_str)
                .ok_or(CatalogError::MissingName { index })?;
            if by_name.insert(name.to_owned(), index).is_some() {
                return Err(CatalogError::DuplicateName(name.to_owned()));
            }
        }
        let mut buf: Vec<u8> = DIGEST_DOMAIN.as_bytes().to_vec();
        buf.push(b'[');
        let mut tool_digests = BTreeMap::new();
        // `by_name` iterates in name order: that is what makes the digest order-insensitive.
        for (n, (name, &index)) in by_name.iter().enumerate() {
            if n > 0 {
                buf.push(b',');
            }
            let start = buf.len();
            buf.push(b'{');
            let mut first = true;
            for field in HASHED_FIELDS {
                if let Some(value) = hashed_field(&tools[index], field) {
                    if !first {
                        buf.push(b',');
                    }
                    first = false;
                    canonical::write_str(field, &mut buf);
                    buf.push(b':');
                    canonical::write(value, Numbers::Integral, &mut buf)
                        .expect("the integral policy accepts every number");
                }
            }
            buf.push(b'}');
            let mut h = Sha256::new();
            h.update(TOOL_DIGEST_DOMAIN.as_bytes());
            h.update(&buf[start..]);
            tool_digests.insert(name.clone(), crate::base::hashing::prefixed(&h.finalize()));
        }
        buf.push(b']');
        let digest = crate::base::hashing::prefixed(&Sha256::digest(&buf));
        Ok(Catalog {
            tools,
            by_name,
            digest,
            tool_digests,
        })
    }

    /// `sha256:<64 hex>` over [`DIGEST_DOMAIN`] and the canonical encoding of the hashed fields.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Per tool, the digest of its hashed fields (same encoding as the catalog digest).
    pub fn tool_digests(&self) -> &BTreeMap<String, String> {
        &self.tool_digests
    }

    /// The tool as received, by name.
    pub fn tool(&self, name: &str) -> Option<&Value> {
        self.by_name.get(name).map(|&i| &self.tools[i])
    }

    /// Tool names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.by_name.keys().map(String::as_str)
    }

    /// Tool names as an owned set (what the approval gate is told).
    pub fn name_set(&self) -> BTreeSet<String> {
        self.by_name.keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The tools exactly as received (order, `_meta` and unknown fields included).
    pub fn tools_json(&self) -> Vec<Value> {
        self.tools.clone()
    }
}

/// A hashed field of a tool, with `null` treated as absent.
fn hashed_field<'a>(tool: &'a Value, field: &str) -> Option<&'a Value> {
    tool.get(field).filter(|v| !v.is_null())
}

/// Canonical text of a value, as the digest encodes it (used to compare and show values).
fn canonical(value: &Value) -> String {
    canonical::to_string(value)
}

fn same(a: Option<&Value>, b: Option<&Value>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => canonical(a) == canonical(b),
        _ => false,
    }
}
