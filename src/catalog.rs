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

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::canonical::{self, Numbers};

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
            tool_digests.insert(name.clone(), crate::hashing::prefixed(&h.finalize()));
        }
        buf.push(b']');
        let digest = crate::hashing::prefixed(&Sha256::digest(&buf));
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

/// A catalog revision: a number local to this run plus the digest it names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CatalogRevision {
    /// 1 for the first catalog seen, +1 for every *different* digest after it.
    #[serde(rename = "revision")]
    pub number: u64,
    pub digest: String,
}

/// Assigns revision numbers: a number changes only when the digest changes, so a restart that
/// serves the same catalog keeps its revision (and the host need not refetch).
#[derive(Debug, Clone, Default)]
pub struct CatalogHistory {
    current: Option<(CatalogRevision, Catalog)>,
}

impl CatalogHistory {
    pub fn new() -> CatalogHistory {
        CatalogHistory::default()
    }

    /// Records a freshly fetched catalog. Returns its revision and, when it replaced a catalog
    /// with a different digest, the diff from that one. The first observation and an unchanged
    /// digest return no diff.
    pub fn observe(&mut self, catalog: Catalog) -> (CatalogRevision, Option<CatalogDiff>) {
        match self.current.take() {
            Some((rev, old)) if old.digest() == catalog.digest() => {
                // Same digest: keep the revision, but hold the newest text (e.g. `_meta`).
                self.current = Some((rev.clone(), catalog));
                (rev, None)
            }
            Some((rev, old)) => {
                let changes = diff(&old, &catalog);
                let next = CatalogRevision {
                    number: rev.number + 1,
                    digest: catalog.digest().to_owned(),
                };
                self.current = Some((next.clone(), catalog));
                (next, Some(changes))
            }
            None => {
                let first = CatalogRevision {
                    number: 1,
                    digest: catalog.digest().to_owned(),
                };
                self.current = Some((first.clone(), catalog));
                (first, None)
            }
        }
    }

    pub fn current(&self) -> Option<&CatalogRevision> {
        self.current.as_ref().map(|(rev, _)| rev)
    }

    pub fn catalog(&self) -> Option<&Catalog> {
        self.current.as_ref().map(|(_, catalog)| catalog)
    }
}

/// Which schema of a tool a [`SchemaChange`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum SchemaKind {
    Input,
    Output,
}

impl SchemaKind {
    fn noun(self) -> &'static str {
        match self {
            SchemaKind::Input => "input",
            SchemaKind::Output => "output",
        }
    }
}

/// One change inside an input or output schema. `path` names a property: `target`, `options.mode`
/// (nested object), `items[]` (array items); the empty path is the schema root.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum SchemaChange {
    /// The schema (or a non-object subschema) appeared, disappeared or was replaced wholesale.
    Replaced {
        path: String,
        old: Option<Value>,
        new: Option<Value>,
    },
    PropertyAdded {
        path: String,
        required: bool,
        #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
        ty: Option<Value>,
        #[serde(rename = "enum", skip_serializing_if = "Option::is_none")]
        enum_values: Option<Vec<Value>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        default: Option<Value>,
    },
    PropertyRemoved {
        path: String,
        required: bool,
        #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
        ty: Option<Value>,
    },
    /// An existing property became required.
    RequiredAdded {
        path: String,
    },
    /// An existing property became optional.
    RequiredRemoved {
        path: String,
    },
    TypeChanged {
        path: String,
        old: Option<Value>,
        new: Option<Value>,
    },
    /// An unrestricted value became restricted to an enum.
    EnumAdded {
        path: String,
        values: Vec<Value>,
    },
    /// An enum restriction was lifted.
    EnumRemoved {
        path: String,
        values: Vec<Value>,
    },
    EnumValuesAdded {
        path: String,
        values: Vec<Value>,
    },
    EnumValuesRemoved {
        path: String,
        values: Vec<Value>,
    },
    /// Same values, different order.
    EnumReordered {
        path: String,
        old: Vec<Value>,
        new: Vec<Value>,
    },
    DefaultAdded {
        path: String,
        value: Value,
    },
    DefaultChanged {
        path: String,
        old: Value,
        new: Value,
    },
    DefaultRemoved {
        path: String,
        old: Value,
    },
    DescriptionChanged {
        path: String,
        old: Option<Value>,
        new: Option<Value>,
    },
    /// Any other keyword (bounds, `format`, `pattern`, `additionalProperties`, `anyOf`, …), or a
    /// change of `required` that is only a reordering.
    KeywordChanged {
        path: String,
        keyword: String,
        old: Option<Value>,
        new: Option<Value>,
    },
}

/// One change to one tool.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(
    tag = "field",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum FieldChange {
    Title {
        old: Option<Value>,
        new: Option<Value>,
    },
    Description {
        old: Option<Value>,
        new: Option<Value>,
    },
    /// One annotation key added (`old: None`), removed (`new: None`) or changed.
    Annotation {
        key: String,
        old: Option<Value>,
        new: Option<Value>,
    },
    /// `annotations` is missing or not an object on one side.
    AnnotationsReplaced {
        old: Option<Value>,
        new: Option<Value>,
    },
    Schema {
        schema: SchemaKind,
        change: SchemaChange,
    },
    Icons {
        old: Option<Value>,
        new: Option<Value>,
    },
    Execution {
        old: Option<Value>,
        new: Option<Value>,
    },
}

/// The changes to one tool present in both catalogs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolChange {
    pub tool: String,
    pub changes: Vec<FieldChange>,
}

/// What changed between two catalogs. Empty exactly when the digests are equal.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct CatalogDiff {
    /// Sorted names.
    pub added: Vec<String>,
    /// Sorted names.
    pub removed: Vec<String>,
    /// Sorted by tool name.
    pub changed: Vec<ToolChange>,
}

/// Field-by-field diff of two catalogs over the hashed fields (see the module doc).
pub fn diff(old: &Catalog, new: &Catalog) -> CatalogDiff {
    let mut out = CatalogDiff::default();
    for name in new.names() {
        if old.tool(name).is_none() {
            out.added.push(name.to_owned());
        }
    }
    for name in old.names() {
        let Some(old_tool) = old.tool(name) else {
            continue;
        };
        let Some(new_tool) = new.tool(name) else {
            out.removed.push(name.to_owned());
            continue;
        };
        let changes = diff_tool(old_tool, new_tool);
        if !changes.is_empty() {
            out.changed.push(ToolChange {
                tool: name.to_owned(),
                changes,
            });
        }
    }
    out
}

fn diff_tool(old: &Value, new: &Value) -> Vec<FieldChange> {
    let mut out = Vec::new();
    let pair = |field| (hashed_field(old, field), hashed_field(new, field));
    let owned = |v: Option<&Value>| v.cloned();

    let (o, n) = pair("title");
    if !same(o, n) {
        out.push(FieldChange::Title {
            old: owned(o),
            new: owned(n),
        });
    }
    let (o, n) = pair("description");
    if !same(o, n) {
        out.push(FieldChange::Description {
            old: owned(o),
            new: owned(n),
        });
    }
    let (o, n) = pair("annotations");
    if !same(o, n) {
        match (o.and_then(Value::as_object), n.and_then(Value::as_object)) {
            (Some(om), Some(nm)) => {
                let keys: BTreeSet<&String> = om.keys().chain(nm.keys()).collect();
                for key in keys {
                    let (ov, nv) = (om.get(key), nm.get(key));
                    if !same(ov, nv) {
                        out.push(FieldChange::Annotation {
                            key: key.clone(),
                            old: owned(ov),
                            new: owned(nv),
                        });
                    }
                }
            }
            _ => out.push(FieldChange::AnnotationsReplaced {
                old: owned(o),
                new: owned(n),
            }),
        }
    }
    for (field, kind) in [
        ("inputSchema", SchemaKind::Input),
        ("outputSchema", SchemaKind::Output),
    ] {
        let (o, n) = pair(field);
        let mut changes = Vec::new();
        diff_schema("", o, n, &mut changes);
        out.extend(changes.into_iter().map(|change| FieldChange::Schema {
            schema: kind,
            change,
        }));
    }
    let (o, n) = pair("icons");
    if !same(o, n) {
        out.push(FieldChange::Icons {
            old: owned(o),
            new: owned(n),
        });
    }
    let (o, n) = pair("execution");
    if !same(o, n) {
        out.push(FieldChange::Execution {
            old: owned(o),
            new: owned(n),
        });
    }
    out
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

fn required_set(schema: &serde_json::Map<String, Value>) -> BTreeSet<String> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| {
            names
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// `properties` of an object schema: absent reads as empty, a non-object as `None`.
fn properties<'a>(
    schema: &'a serde_json::Map<String, Value>,
    empty: &'a serde_json::Map<String, Value>,
) -> Option<&'a serde_json::Map<String, Value>> {
    match schema.get("properties") {
        None => Some(empty),
        Some(v) => v.as_object(),
    }
}

/// Diffs one (sub)schema. Every difference in canonical encoding yields at least one change: the
/// specific keywords get specific entries, anything else falls back to `KeywordChanged`, so a
/// changed digest never renders as an empty diff.
fn diff_schema(path: &str, old: Option<&Value>, new: Option<&Value>, out: &mut Vec<SchemaChange>) {
    if same(old, new) {
        return;
    }
    let (Some(om), Some(nm)) = (
        old.and_then(Value::as_object),
        new.and_then(Value::as_object),
    ) else {
        out.push(SchemaChange::Replaced {
            path: path.to_owned(),
            old: old.cloned(),
            new: new.cloned(),
        });
        return;
    };
    let p = || path.to_owned();

    let (o, n) = (om.get("type"), nm.get("type"));
    if !same(o, n) {
        out.push(SchemaChange::TypeChanged {
            path: p(),
            old: o.cloned(),
            new: n.cloned(),
        });
    }
    let (o, n) = (om.get("description"), nm.get("description"));
    if !same(o, n) {
        out.push(SchemaChange::DescriptionChanged {
            path: p(),
            old: o.cloned(),
            new: n.cloned(),
        });
    }
    let (o, n) = (om.get("enum"), nm.get("enum"));
    if !same(o, n) {
        diff_enum(path, o, n, out);
    }
    match (om.get("default"), nm.get("default")) {
        (None, Some(v)) => out.push(SchemaChange::DefaultAdded {
            path: p(),
            value: v.clone(),
        }),
        (Some(v), None) => out.push(SchemaChange::DefaultRemoved {
            path: p(),
            old: v.clone(),
        }),
        (Some(o), Some(n)) if !same(Some(o), Some(n)) => out.push(SchemaChange::DefaultChanged {
            path: p(),
            old: o.clone(),
            new: n.clone(),
        }),
        _ => {}
    }

    // `properties` and `required` together: a new property's required-ness belongs to its
    // "added" entry; only properties present on both sides get RequiredAdded/RequiredRemoved.
    let (old_req, new_req) = (required_set(om), required_set(nm));
    let mut required_reported = false;
    let props_same = same(om.get("properties"), nm.get("properties"));
    let empty = serde_json::Map::new();
    match (properties(om, &empty), properties(nm, &empty)) {
        (Some(op), Some(np)) => {
            let before = out.len();
            let names: BTreeSet<&String> = op.keys().chain(np.keys()).collect();
            for name in names {
                let sub = join(path, name);
                match (op.get(name), np.get(name)) {
                    (None, Some(added)) => out.push(SchemaChange::PropertyAdded {
                        path: sub,
                        required: new_req.contains(name.as_str()),
                        ty: added.get("type").cloned(),
                        enum_values: added.get("enum").and_then(Value::as_array).cloned(),
                        default: added.get("default").cloned(),
                    }),
                    (Some(removed), None) => out.push(SchemaChange::PropertyRemoved {
                        path: sub,
                        required: old_req.contains(name.as_str()),
                        ty: removed.get("type").cloned(),
                    }),
                    (o, n) => diff_schema(&sub, o, n, out),
                }
            }
            if out.len() == before && !props_same {
                // `properties: {}` versus no `properties`: same meaning, different encoding.
                out.push(SchemaChange::KeywordChanged {
                    path: p(),
                    keyword: "properties".to_owned(),
                    old: om.get("properties").cloned(),
                    new: nm.get("properties").cloned(),
                });
            }
            let in_both = |name: &String| op.contains_key(name) == np.contains_key(name);
            for name in new_req.difference(&old_req).filter(|n| in_both(n)) {
                out.push(SchemaChange::RequiredAdded {
                    path: join(path, name),
                });
                required_reported = true;
            }
            for name in old_req.difference(&new_req).filter(|n| in_both(n)) {
                out.push(SchemaChange::RequiredRemoved {
                    path: join(path, name),
                });
                required_reported = true;
            }
            if old_req != new_req {
                // Names added or removed together with their property were reported above.
                required_reported = true;
            }
        }
        _ if !props_same => out.push(SchemaChange::KeywordChanged {
            path: p(),
            keyword: "properties".to_owned(),
            old: om.get("properties").cloned(),
            new: nm.get("properties").cloned(),
        }),
        _ => {}
    }
    if !required_reported && !same(om.get("required"), nm.get("required")) {
        // Same set of names, different order or shape: still a change to the encoded schema.
        out.push(SchemaChange::KeywordChanged {
            path: p(),
            keyword: "required".to_owned(),
            old: om.get("required").cloned(),
            new: nm.get("required").cloned(),
        });
    }

    let (o, n) = (om.get("items"), nm.get("items"));
    if !same(o, n) {
        diff_schema(&format!("{path}[]"), o, n, out);
    }

    const HANDLED: [&str; 7] = [
        "type",
        "description",
        "enum",
        "default",
        "properties",
        "required",
        "items",
    ];
    let keys: BTreeSet<&String> = om
        .keys()
        .chain(nm.keys())
        .filter(|k| !HANDLED.contains(&k.as_str()))
        .collect();
    for key in keys {
        let (o, n) = (om.get(key), nm.get(key));
        if !same(o, n) {
            out.push(SchemaChange::KeywordChanged {
                path: p(),
                keyword: key.clone(),
                old: o.cloned(),
                new: n.cloned(),
            });
        }
    }
}

fn diff_enum(path: &str, old: Option<&Value>, new: Option<&Value>, out: &mut Vec<SchemaChange>) {
    let p = path.to_owned();
    match (old.and_then(Value::as_array), new.and_then(Value::as_array)) {
        (None, Some(n)) if old.is_none() => out.push(SchemaChange::EnumAdded {
            path: p,
            values: n.clone(),
        }),
        (Some(o), None) if new.is_none() => out.push(SchemaChange::EnumRemoved {
            path: p,
            values: o.clone(),
        }),
        (Some(o), Some(n)) => {
            let (ok, nk): (Vec<String>, Vec<String>) = (
                o.iter().map(canonical).collect(),
                n.iter().map(canonical).collect(),
            );
            let added: Vec<Value> = n
                .iter()
                .zip(&nk)
                .filter(|(_, k)| !ok.contains(k))
                .map(|(v, _)| v.clone())
                .collect();
            let removed: Vec<Value> = o
                .iter()
                .zip(&ok)
                .filter(|(_, k)| !nk.contains(k))
                .map(|(v, _)| v.clone())
                .collect();
            let reported = !added.is_empty() || !removed.is_empty();
            if !added.is_empty() {
                out.push(SchemaChange::EnumValuesAdded {
                    path: p.clone(),
                    values: added,
                });
            }
            if !removed.is_empty() {
                out.push(SchemaChange::EnumValuesRemoved {
                    path: p.clone(),
                    values: removed,
                });
            }
            if !reported {
                // Same members: order (or duplicates) changed; hosts show enums in order.
                out.push(SchemaChange::EnumReordered {
                    path: p,
                    old: o.clone(),
                    new: n.clone(),
                });
            }
        }
        // `enum` that is not an array on one side: not meaningful JSON Schema, show it raw.
        _ => out.push(SchemaChange::KeywordChanged {
            path: p,
            keyword: "enum".to_owned(),
            old: old.cloned(),
            new: new.cloned(),
        }),
    }
}

impl CatalogDiff {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }

    /// `"1 added, 2 changed"`; counts of zero are left out; `"no changes"` when empty.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = [
            (self.added.len(), "added"),
            (self.removed.len(), "removed"),
            (self.changed.len(), "changed"),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        if parts.is_empty() {
            "no changes".to_owned()
        } else {
            parts.join(", ")
        }
    }

    /// One line per change: `+ tool`, `- tool`, `~ tool: what changed`. Values are shown as
    /// compact JSON, so multi-line descriptions stay on one line and defaults stay visible.
    pub fn render_human(&self) -> Vec<String> {
        let mut lines = Vec::new();
        lines.extend(self.added.iter().map(|t| format!("+ {t}")));
        lines.extend(self.removed.iter().map(|t| format!("- {t}")));
        for tool in &self.changed {
            for change in &tool.changes {
                lines.push(format!("~ {}: {}", tool.tool, render_change(change)));
            }
        }
        lines
    }

    /// `{"summary", "added", "removed", "changed": [{"tool", "changes": [{"field", …}]}]}`.
    pub fn to_json(&self) -> Value {
        let mut value = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Some(obj) = value.as_object_mut() {
            obj.insert("summary".to_owned(), Value::String(self.summary()));
        }
        value
    }
}

/// Compact canonical JSON of a value, in full (descriptions and defaults are never cut).
fn show(value: &Value) -> String {
    canonical(value)
}

fn show_opt(value: &Option<Value>) -> String {
    value
        .as_ref()
        .map(show)
        .unwrap_or_else(|| "(none)".to_owned())
}

fn show_summary(value: &Option<Value>) -> String {
    const MAX: usize = 120;
    let full = show_opt(value);
    if full.chars().count() <= MAX {
        full
    } else {
        let cut: String = full.chars().take(MAX).collect();
        format!("{cut}…")
    }
}

fn show_type(ty: &Value) -> String {
    match ty {
        Value::String(s) => s.clone(),
        Value::Array(items) => items
            .iter()
            .map(|t| t.as_str().map(str::to_owned).unwrap_or_else(|| show(t)))
            .collect::<Vec<_>>()
            .join("|"),
        other => show(other),
    }
}

fn show_list(values: &[Value]) -> String {
    show(&Value::Array(values.to_vec()))
}

fn old_new(old: &Option<Value>, new: &Option<Value>) -> String {
    match (old, new) {
        (None, Some(n)) => format!("added {}", show(n)),
        (Some(o), None) => format!("removed (was {})", show(o)),
        _ => format!("{} -> {}", show_opt(old), show_opt(new)),
    }
}

fn render_change(change: &FieldChange) -> String {
    match change {
        FieldChange::Title { old, new } => format!("title {}", old_new(old, new)),
        FieldChange::Description { old, new } => format!("description {}", old_new(old, new)),
        FieldChange::Annotation { key, old, new } => {
            format!("annotations.{key} {}", old_new(old, new))
        }
        FieldChange::AnnotationsReplaced { old, new } => {
            format!("annotations {}", old_new(old, new))
        }
        FieldChange::Schema { schema, change } => render_schema_change(*schema, change),
        FieldChange::Icons { old, new } => format!(
            "icons changed: {} -> {}",
            show_summary(old),
            show_summary(new)
        ),
        FieldChange::Execution { old, new } => {
            format!(
                "execution changed: {} -> {}",
                show_summary(old),
                show_summary(new)
            )
        }
    }
}

fn render_schema_change(kind: SchemaKind, change: &SchemaChange) -> String {
    let noun = kind.noun();
    // "input field `target`" for a property, "input schema" for the root.
    let at = |path: &str| {
        if path.is_empty() {
            format!("{noun} schema")
        } else {
            format!("{noun} field `{path}`")
        }
    };
    match change {
        SchemaChange::Replaced { path, old, new } => match (old, new) {
            (None, Some(n)) => format!("{} added: {}", at(path), show_summary(&Some(n.clone()))),
            (Some(o), None) => format!(
                "{} removed (was {})",
                at(path),
                show_summary(&Some(o.clone()))
            ),
            _ => format!(
                "{} replaced: {} -> {}",
                at(path),
                show_summary(old),
                show_summary(new)
            ),
        },
        SchemaChange::PropertyAdded {
            path,
            required,
            ty,
            enum_values,
            default,
        } => {
            let mut facts = vec![if *required { "required" } else { "optional" }.to_owned()];
            facts.extend(ty.as_ref().map(show_type));
            facts.extend(
                enum_values
                    .as_ref()
                    .map(|v| format!("enum {}", show_list(v))),
            );
            facts.extend(default.as_ref().map(|d| format!("default {}", show(d))));
            format!("{} added ({})", at(path), facts.join(", "))
        }
        SchemaChange::PropertyRemoved { path, required, ty } => {
            let mut facts = vec![
                if *required {
                    "was required"
                } else {
                    "was optional"
                }
                .to_owned(),
            ];
            facts.extend(ty.as_ref().map(show_type));
            format!("{} removed ({})", at(path), facts.join(", "))
        }
        SchemaChange::RequiredAdded { path } => format!("{} now required", at(path)),
        SchemaChange::RequiredRemoved { path } => format!("{} now optional", at(path)),
        SchemaChange::TypeChanged { path, old, new } => {
            let t = |v: &Option<Value>| {
                v.as_ref()
                    .map(show_type)
                    .unwrap_or_else(|| "(none)".to_owned())
            };
            format!("{} type {} -> {}", at(path), t(old), t(new))
        }
        SchemaChange::EnumAdded { path, values } => {
            format!("{} now restricted to enum {}", at(path), show_list(values))
        }
        SchemaChange::EnumRemoved { path, values } => {
            format!(
                "{} no longer restricted to an enum (was {})",
                at(path),
                show_list(values)
            )
        }
        SchemaChange::EnumValuesAdded { path, values } => {
            format!("{} enum values added {}", at(path), show_list(values))
        }
        SchemaChange::EnumValuesRemoved { path, values } => {
            format!("{} enum values removed {}", at(path), show_list(values))
        }
        SchemaChange::EnumReordered { path, old, new } => {
            format!(
                "{} enum reordered {} -> {}",
                at(path),
                show_list(old),
                show_list(new)
            )
        }
        SchemaChange::DefaultAdded { path, value } => {
            format!("{} default added {}", at(path), show(value))
        }
        SchemaChange::DefaultChanged { path, old, new } => {
            format!("{} default {} -> {}", at(path), show(old), show(new))
        }
        SchemaChange::DefaultRemoved { path, old } => {
            format!("{} default removed (was {})", at(path), show(old))
        }
        SchemaChange::DescriptionChanged { path, old, new } => {
            format!("{} description {}", at(path), old_new(old, new))
        }
        SchemaChange::KeywordChanged {
            path,
            keyword,
            old,
            new,
        } => {
            format!(
                "{} `{keyword}` {} -> {}",
                at(path),
                show_summary(old),
                show_summary(new)
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn catalog(tools: Value) -> Catalog {
        Catalog::from_tools(tools.as_array().expect("array").clone()).expect("valid catalog")
    }

    fn publish_preview_v1() -> Value {
        json!({
            "name": "publish_preview",
            "inputSchema": {
                "type": "object",
                "required": ["branch"],
                "properties": { "branch": { "type": "string" } },
                "additionalProperties": false
            }
        })
    }

    fn with(mut base: Value, pointer: &str, value: Value) -> Value {
        let (parent, key) = pointer.rsplit_once('/').expect("pointer has a parent");
        let target = if parent.is_empty() {
            &mut base
        } else {
            base.pointer_mut(parent).expect("parent exists")
        };
        target
            .as_object_mut()
            .expect("object parent")
            .insert(key.to_owned(), value);
        base
    }

    fn without(mut base: Value, pointer: &str) -> Value {
        let (parent, key) = pointer.rsplit_once('/').expect("pointer has a parent");
        let target = if parent.is_empty() {
            &mut base
        } else {
            base.pointer_mut(parent).expect("parent exists")
        };
        target.as_object_mut().expect("object parent").remove(key);
        base
    }

    fn lines(old: Value, new: Value) -> Vec<String> {
        diff(&catalog(json!([old])), &catalog(json!([new]))).render_human()
    }

    #[test]
    fn rejects_bad_tool_lists() {
        let cases = [
            (
                json!([{"name": "a"}, {"name": "a"}]),
                CatalogError::DuplicateName("a".into()),
            ),
            (
                json!([{"name": "a"}, {"title": "no name"}]),
                CatalogError::MissingName { index: 1 },
            ),
            (json!([{"name": 7}]), CatalogError::MissingName { index: 0 }),
            (
                json!([{"name": null}]),
                CatalogError::MissingName { index: 0 },
            ),
            (json!(["a"]), CatalogError::NotAnObject { index: 0 }),
        ];
        for (tools, expected) in cases {
            let got = Catalog::from_tools(tools.as_array().unwrap().clone());
            assert_eq!(got, Err(expected), "{tools}");
        }
    }

    #[test]
    fn accessors_keep_tools_as_received() {
        let tools = json!([{"name": "b", "_meta": {"x": 1}, "vendor": true}, {"name": "a"}]);
        let c = catalog(tools.clone());
        assert_eq!(c.len(), 2);
        assert!(!c.is_empty());
        assert_eq!(c.names().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(c.tools_json(), tools.as_array().unwrap().clone());
        assert_eq!(c.tool("b"), Some(&tools[0]));
        assert_eq!(c.tool("c"), None);
        assert_eq!(
            c.name_set(),
            BTreeSet::from(["a".to_owned(), "b".to_owned()])
        );
        let d = c.digest();
        assert!(d.starts_with("sha256:") && d.len() == 71, "{d}");
        assert!(
            d[7..]
                .chars()
                .all(|ch| ch.is_ascii_hexdigit() && !ch.is_ascii_uppercase()),
            "{d}"
        );
        assert!(Catalog::from_tools(vec![]).unwrap().is_empty());
    }

    #[test]
    fn digest_ignores_tool_order_key_order_meta_unknown_fields_and_nulls() {
        let base = catalog(
            json!([publish_preview_v1(), {"name": "read_item", "annotations": {"readOnlyHint": true}}]),
        );
        // Same content, different text: tools reversed, keys in another order, whitespace.
        let text = r#"[ {"annotations":{"readOnlyHint":true},"name":"read_item"},
            {"inputSchema":{"additionalProperties":false,"properties":{"branch":{"type":"string"}},
             "required":["branch"],"type":"object"},"name":"publish_preview"} ]"#;
        let reordered: Vec<Value> = serde_json::from_str(text).unwrap();
        assert_eq!(catalog(Value::Array(reordered)).digest(), base.digest());
        let noisy = json!([
            {"name": "read_item", "annotations": {"readOnlyHint": true}, "_meta": {"trace": "abc"}, "vendorX": 1,
             "title": null, "outputSchema": null},
            with(publish_preview_v1(), "/_meta", json!({"generatedAt": 12345}))
        ]);
        assert_eq!(catalog(noisy).digest(), base.digest());
        let float = catalog(json!([with(
            publish_preview_v1(),
            "/inputSchema/maxProperties",
            json!(3.0)
        )]));
        let int = catalog(json!([with(
            publish_preview_v1(),
            "/inputSchema/maxProperties",
            json!(3)
        )]));
        assert_eq!(float.digest(), int.digest());
        assert!(diff(&float, &int).is_empty());
    }

    #[test]
    fn every_hashed_field_changes_the_digest() {
        let base = json!({
            "name": "write_item",
            "title": "Write item",
            "description": "Writes an item",
            "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}}},
            "outputSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
            "annotations": {"readOnlyHint": true},
            "icons": [{"src": "https://example.test/a.png"}],
            "execution": {"taskSupport": "forbidden"}
        });
        let d0 = catalog(json!([base.clone()])).digest().to_owned();
        let mutations = [
            with(base.clone(), "/name", json!("write_item2")),
            with(base.clone(), "/title", json!("Write an item")),
            without(base.clone(), "/title"),
            with(
                base.clone(),
                "/description",
                json!("Writes an item and deletes the old one"),
            ),
            with(
                base.clone(),
                "/inputSchema/properties/id/type",
                json!("integer"),
            ),
            with(base.clone(), "/inputSchema/required", json!(["id"])),
            with(
                base.clone(),
                "/outputSchema/properties/ok/type",
                json!("string"),
            ),
            without(base.clone(), "/outputSchema"),
            with(base.clone(), "/annotations/readOnlyHint", json!(false)),
            with(
                base.clone(),
                "/icons",
                json!([{"src": "https://example.test/b.png"}]),
            ),
            with(base.clone(), "/execution/taskSupport", json!("optional")),
        ];
        let mut seen = BTreeSet::from([d0.clone()]);
        for m in mutations {
            let d = catalog(json!([m.clone()])).digest().to_owned();
            assert!(seen.insert(d), "mutation did not produce a new digest: {m}");
        }
        // Adding a tool changes it too; `_meta` and unknown fields do not.
        assert_ne!(catalog(json!([base.clone(), {"name": "x"}])).digest(), d0);
        assert_eq!(
            catalog(json!([with(base.clone(), "/_meta", json!({"a": 1}))])).digest(),
            d0
        );
        assert_eq!(
            catalog(json!([with(base, "/somethingNew", json!(1))])).digest(),
            d0
        );
    }

    #[test]
    fn design_example_publish_preview_gains_target_with_default() {
        let v2 = with(
            publish_preview_v1(),
            "/inputSchema/properties/target",
            json!({"type": "string", "enum": ["preview", "production"], "default": "preview"}),
        );
        let d = diff(
            &catalog(json!([publish_preview_v1()])),
            &catalog(json!([v2])),
        );
        assert_eq!(
            d.render_human(),
            [
                r#"~ publish_preview: input field `target` added (optional, string, enum ["preview","production"], default "preview")"#
            ]
        );
        assert_eq!(d.summary(), "1 changed");
        assert_eq!(
            d.to_json(),
            json!({
                "summary": "1 changed",
                "added": [],
                "removed": [],
                "changed": [{"tool": "publish_preview", "changes": [{
                    "field": "schema", "schema": "input",
                    "change": {"kind": "propertyAdded", "path": "target", "required": false, "type": "string",
                               "enum": ["preview", "production"], "default": "preview"}
                }]}]
            })
        );
    }

    #[test]
    fn table_of_tool_changes() {
        let item = json!({
            "name": "write_item",
            "description": "Writes an item",
            "annotations": {"readOnlyHint": true},
            "inputSchema": {
                "type": "object",
                "required": ["id"],
                "properties": {
                    "id": {"type": "string", "description": "item id"},
                    "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                    "opts": {"type": "object", "properties": {"dry": {"type": "boolean", "default": true}}},
                    "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}}
                }
            }
        });
        let cases: Vec<(&str, Value, Vec<&str>)> = vec![
            (
                "description",
                with(item.clone(), "/description", json!("Writes and publishes")),
                vec![r#"~ write_item: description "Writes an item" -> "Writes and publishes""#],
            ),
            (
                "title added",
                with(item.clone(), "/title", json!("Write")),
                vec![r#"~ write_item: title added "Write""#],
            ),
            (
                "readOnlyHint flipped",
                with(item.clone(), "/annotations/readOnlyHint", json!(false)),
                vec!["~ write_item: annotations.readOnlyHint true -> false"],
            ),
            (
                "annotation added",
                with(item.clone(), "/annotations/destructiveHint", json!(true)),
                vec!["~ write_item: annotations.destructiveHint added true"],
            ),
            (
                "annotation removed",
                without(item.clone(), "/annotations/readOnlyHint"),
                vec!["~ write_item: annotations.readOnlyHint removed (was true)"],
            ),
            (
                "annotations dropped",
                without(item.clone(), "/annotations"),
                vec![r#"~ write_item: annotations removed (was {"readOnlyHint":true})"#],
            ),
            (
                "required field added",
                with(
                    with(
                        item.clone(),
                        "/inputSchema/properties/owner",
                        json!({"type": "string"}),
                    ),
                    "/inputSchema/required",
                    json!(["id", "owner"]),
                ),
                vec!["~ write_item: input field `owner` added (required, string)"],
            ),
            (
                "field removed",
                without(item.clone(), "/inputSchema/properties/mode"),
                vec!["~ write_item: input field `mode` removed (was optional, string)"],
            ),
            (
                "required field removed",
                with(
                    without(item.clone(), "/inputSchema/properties/id"),
                    "/inputSchema/required",
                    json!([]),
                ),
                vec!["~ write_item: input field `id` removed (was required, string)"],
            ),
            (
                "became required",
                with(item.clone(), "/inputSchema/required", json!(["id", "mode"])),
                vec!["~ write_item: input field `mode` now required"],
            ),
            (
                "became optional",
                with(item.clone(), "/inputSchema/required", json!([])),
                vec!["~ write_item: input field `id` now optional"],
            ),
            (
                "type changed",
                with(
                    item.clone(),
                    "/inputSchema/properties/id/type",
                    json!(["integer", "null"]),
                ),
                vec![r#"~ write_item: input field `id` type string -> integer|null"#],
            ),
            (
                "enum value added",
                with(
                    item.clone(),
                    "/inputSchema/properties/mode/enum",
                    json!(["a", "b", "c"]),
                ),
                vec![r#"~ write_item: input field `mode` enum values added ["c"]"#],
            ),
            (
                "enum value removed",
                with(
                    item.clone(),
                    "/inputSchema/properties/mode/enum",
                    json!(["a"]),
                ),
                vec![r#"~ write_item: input field `mode` enum values removed ["b"]"#],
            ),
            (
                "enum reordered",
                with(
                    item.clone(),
                    "/inputSchema/properties/mode/enum",
                    json!(["b", "a"]),
                ),
                vec![r#"~ write_item: input field `mode` enum reordered ["a","b"] -> ["b","a"]"#],
            ),
            (
                "enum introduced",
                with(
                    item.clone(),
                    "/inputSchema/properties/id/enum",
                    json!(["x"]),
                ),
                vec![r#"~ write_item: input field `id` now restricted to enum ["x"]"#],
            ),
            (
                "enum lifted",
                without(item.clone(), "/inputSchema/properties/mode/enum"),
                vec![
                    r#"~ write_item: input field `mode` no longer restricted to an enum (was ["a","b"])"#,
                ],
            ),
            (
                "default changed",
                with(
                    item.clone(),
                    "/inputSchema/properties/mode/default",
                    json!("b"),
                ),
                vec![r#"~ write_item: input field `mode` default "a" -> "b""#],
            ),
            (
                "default added",
                with(
                    item.clone(),
                    "/inputSchema/properties/id/default",
                    json!("new"),
                ),
                vec![r#"~ write_item: input field `id` default added "new""#],
            ),
            (
                "default removed",
                without(item.clone(), "/inputSchema/properties/mode/default"),
                vec![r#"~ write_item: input field `mode` default removed (was "a")"#],
            ),
            (
                "nested default",
                with(
                    item.clone(),
                    "/inputSchema/properties/opts/properties/dry/default",
                    json!(false),
                ),
                vec!["~ write_item: input field `opts.dry` default true -> false"],
            ),
            (
                "nested description",
                with(
                    item.clone(),
                    "/inputSchema/properties/id/description",
                    json!("the item id"),
                ),
                vec![r#"~ write_item: input field `id` description "item id" -> "the item id""#],
            ),
            (
                "root description",
                with(item.clone(), "/inputSchema/description", json!("args")),
                vec![r#"~ write_item: input schema description added "args""#],
            ),
            (
                "items bound",
                with(
                    item.clone(),
                    "/inputSchema/properties/tags/items/maxLength",
                    json!(100),
                ),
                vec!["~ write_item: input field `tags[]` `maxLength` 10 -> 100"],
            ),
            (
                "additionalProperties",
                with(
                    item.clone(),
                    "/inputSchema/additionalProperties",
                    json!(false),
                ),
                vec!["~ write_item: input schema `additionalProperties` (none) -> false"],
            ),
            (
                "output schema added",
                with(item.clone(), "/outputSchema", json!({"type": "object"})),
                vec![r#"~ write_item: output schema added: {"type":"object"}"#],
            ),
            (
                "icons",
                with(item.clone(), "/icons", json!([{"src": "a.png"}])),
                vec![r#"~ write_item: icons changed: (none) -> [{"src":"a.png"}]"#],
            ),
            (
                "execution",
                with(
                    item.clone(),
                    "/execution",
                    json!({"taskSupport": "required"}),
                ),
                vec![r#"~ write_item: execution changed: (none) -> {"taskSupport":"required"}"#],
            ),
        ];
        for (what, new, expected) in cases {
            let got = lines(item.clone(), new.clone());
            assert_eq!(got, expected, "case {what}");
            // The diff is empty exactly when the digest is unchanged.
            let (a, b) = (catalog(json!([item.clone()])), catalog(json!([new])));
            assert_ne!(a.digest(), b.digest(), "case {what}");
        }
        assert!(lines(item.clone(), item.clone()).is_empty());
        // Same required names in another order: still a different encoding, shown raw.
        let two = with(item.clone(), "/inputSchema/required", json!(["id", "mode"]));
        assert_eq!(
            lines(
                two.clone(),
                with(two, "/inputSchema/required", json!(["mode", "id"]))
            ),
            [r#"~ write_item: input schema `required` ["id","mode"] -> ["mode","id"]"#]
        );
    }

    #[test]
    fn output_schema_gets_the_same_treatment() {
        let t = json!({"name": "t", "outputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}}});
        let new = with(
            with(
                t.clone(),
                "/outputSchema/properties/n/type",
                json!("number"),
            ),
            "/outputSchema/properties/unit",
            json!({"type": "string", "default": "ms"}),
        );
        assert_eq!(
            lines(t.clone(), new),
            [
                "~ t: output field `n` type integer -> number",
                r#"~ t: output field `unit` added (optional, string, default "ms")"#
            ]
        );
        assert_eq!(
            lines(t.clone(), without(t, "/outputSchema")),
            [
                r#"~ t: output schema removed (was {"properties":{"n":{"type":"integer"}},"type":"object"})"#
            ]
        );
    }

    #[test]
    fn added_removed_and_summary() {
        let old = catalog(
            json!([{"name": "old_tool"}, {"name": "a", "description": "x"}, {"name": "b"}]),
        );
        let new = catalog(
            json!([{"name": "delete_item"}, {"name": "a", "description": "y"}, {"name": "b", "title": "B"}]),
        );
        let d = diff(&old, &new);
        assert_eq!(d.added, ["delete_item"]);
        assert_eq!(d.removed, ["old_tool"]);
        assert_eq!(d.summary(), "1 added, 1 removed, 2 changed");
        assert_eq!(
            d.render_human(),
            [
                "+ delete_item",
                "- old_tool",
                r#"~ a: description "x" -> "y""#,
                r#"~ b: title added "B""#,
            ]
        );
        assert_eq!(d.to_json()["added"], json!(["delete_item"]));
        let empty = diff(&new, &new);
        assert!(empty.is_empty());
        assert_eq!(empty.summary(), "no changes");
    }

    #[test]
    fn history_numbers_only_new_digests() {
        let mut h = CatalogHistory::new();
        assert!(h.current().is_none());
        let a = catalog(json!([{"name": "a"}]));
        let a_meta = catalog(json!([{"name": "a", "_meta": {"k": 1}}]));
        let b = catalog(json!([{"name": "a"}, {"name": "b"}]));
        let (r1, d1) = h.observe(a.clone());
        assert_eq!((r1.number, d1), (1, None));
        assert_eq!(r1.digest, a.digest());
        let (r1b, d1b) = h.observe(a_meta.clone());
        assert_eq!((r1b.clone(), d1b), (r1.clone(), None));
        assert_eq!(h.catalog(), Some(&a_meta), "newest text is kept");
        let (r2, d2) = h.observe(b.clone());
        assert_eq!(
            r2,
            CatalogRevision {
                number: 2,
                digest: b.digest().to_owned()
            }
        );
        assert_eq!(d2.expect("diff").added, ["b"]);
        // Going back to an earlier catalog is a new revision: numbers never go backwards.
        let (r3, d3) = h.observe(a);
        assert_eq!(r3.number, 3);
        assert_eq!(d3.expect("diff").removed, ["b"]);
        assert_eq!(h.current(), Some(&r3));
        assert_eq!(
            serde_json::to_value(&r3).unwrap(),
            json!({"revision": 3, "digest": r3.digest})
        );
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn leaf() -> impl Strategy<Value = Value> {
            prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                (-3i64..3).prop_map(|n| json!(n)),
                "[a-c]{0,2}".prop_map(Value::String),
            ]
        }

        fn key() -> impl Strategy<Value = String> {
            prop::sample::select(vec![
                "type",
                "enum",
                "default",
                "properties",
                "required",
                "items",
                "description",
                "minimum",
                "x",
                "y",
            ])
            .prop_map(str::to_owned)
        }

        fn value() -> impl Strategy<Value = Value> {
            leaf().prop_recursive(3, 24, 4, |inner| {
                prop_oneof![
                    1 => prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                    3 => prop::collection::btree_map(key(), inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        /// A tool whose `inputSchema` is always an object (where most of the diff logic lives).
        fn tool() -> impl Strategy<Value = Value> {
            (
                "[a-d]",
                prop::collection::btree_map(key(), value(), 1..5),
                prop::collection::btree_map(
                    prop::sample::select(HASHED_FIELDS[1..].to_vec()),
                    value(),
                    0..3,
                ),
            )
                .prop_map(|(name, schema, fields)| {
                    let mut obj = serde_json::Map::new();
                    obj.insert(
                        "inputSchema".into(),
                        Value::Object(schema.into_iter().collect()),
                    );
                    for (k, v) in fields {
                        obj.insert(k.to_owned(), v);
                    }
                    obj.insert("name".into(), json!(name));
                    Value::Object(obj)
                })
        }

        fn tools(size: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Value>> {
            prop::collection::vec(tool(), size).prop_map(|ts| {
                let mut seen = BTreeSet::new();
                ts.into_iter()
                    .filter(|t| seen.insert(t["name"].as_str().unwrap().to_owned()))
                    .collect()
            })
        }

        /// Walks `steps` into `value` (each step picks a child) and replaces what it lands on with
        /// `replacement`, or deletes it from its parent object when `replacement` is `None`.
        fn perturb(value: &mut Value, steps: &[usize], replacement: Option<Value>) {
            let child_key = |v: &Value, step: usize| -> Option<String> {
                let obj = v.as_object()?;
                obj.keys().nth(step % obj.len().max(1)).cloned()
            };
            match (steps.split_first(), value) {
                (Some((&step, rest)), Value::Array(items)) if !items.is_empty() => {
                    let n = items.len();
                    perturb(&mut items[step % n], rest, replacement)
                }
                (Some((&step, rest)), v @ Value::Object(_)) => match child_key(v, step) {
                    Some(key) if rest.is_empty() && replacement.is_none() => {
                        v.as_object_mut().unwrap().remove(&key);
                    }
                    Some(key) => perturb(&mut v[key.as_str()], rest, replacement),
                    None => *v = replacement.unwrap_or(Value::Null),
                },
                (_, v) => *v = replacement.unwrap_or(Value::Null),
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1024))]
            /// Near-miss pairs (one random edit anywhere inside one tool): the diff sees every edit
            /// the digest sees, and nothing else.
            #[test]
            fn diff_sees_every_small_edit(
                a in tools(1..4),
                tool_pick in any::<usize>(),
                steps in prop::collection::vec(any::<usize>(), 1..6),
                replacement in prop::option::of(value()),
            ) {
                let mut b = a.clone();
                let n = b.len();
                let target = &mut b[tool_pick % n];
                let name = target["name"].clone();
                perturb(target, &steps, replacement);
                // Keep the tool addressable: this test is about fields, not names.
                if let Some(obj) = target.as_object_mut() { obj.insert("name".into(), name); } else { return Ok(()); }
                let (ca, cb) = (Catalog::from_tools(a).unwrap(), Catalog::from_tools(b).unwrap());
                let d = diff(&ca, &cb);
                prop_assert_eq!(d.is_empty(), ca.digest() == cb.digest(), "{:?}", d);
                prop_assert!(d.added.is_empty() && d.removed.is_empty());
            }
        }

        proptest! {
            /// The diff is complete and sound with respect to the digest, and order never matters.
            #[test]
            fn diff_is_empty_iff_digests_match(a in tools(0..4), b in tools(0..4)) {
                let (ca, cb) = (Catalog::from_tools(a.clone()).unwrap(), Catalog::from_tools(b).unwrap());
                let d = diff(&ca, &cb);
                prop_assert_eq!(d.is_empty(), ca.digest() == cb.digest(), "{:?}", d);
                prop_assert_eq!(d.render_human().is_empty(), d.is_empty());
                let mut reversed = a;
                reversed.reverse();
                let again = Catalog::from_tools(reversed).unwrap();
                prop_assert_eq!(again.digest(), ca.digest());
            }
        }
    }
}
