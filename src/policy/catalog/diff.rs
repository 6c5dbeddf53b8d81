//! The field-level diff between two catalogs, shown to the human with every status line and
//! approval prompt, and to the model in a stale call's result. Owns: diff types, rendering.
//! Must not touch: I/O, authorization (annotations are diffed so a reviewer sees them change,
//! never to gate).

use std::collections::{BTreeSet, HashSet};

use serde::Serialize;
use serde_json::Value;

use super::*;

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
            // Sets for membership: a server's enum can hold millions of values, and a scan per
            // value would hold the session for minutes (red-team round 10). Order is kept.
            let (old_set, new_set): (HashSet<&String>, HashSet<&String>) =
                (ok.iter().collect(), nk.iter().collect());
            let added: Vec<Value> = n
                .iter()
                .zip(&nk)
                .filter(|(_, k)| !old_set.contains(k))
                .map(|(v, _)| v.clone())
                .collect();
            let removed: Vec<Value> = o
                .iter()
                .zip(&ok)
                .filter(|(_, k)| !new_set.contains(k))
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
