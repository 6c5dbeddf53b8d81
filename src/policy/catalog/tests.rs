//! Digest, revision and diff tests.

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
    let old =
        catalog(json!([{"name": "old_tool"}, {"name": "a", "description": "x"}, {"name": "b"}]));
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

/// The catalog diff compares enum values with `Vec::contains` on both sides: quadratic in the
/// enum's length. A server that lists one tool whose input schema has a large enum and then
/// changes it (one `list_changed`) makes the session spend its lock in `diff_enum`, stalling
/// every host call: 60,000 values (~1 MB page) took 68 s here (debug), 25,000 ~12 s; a 64 MiB
/// page holds millions (red-team round 10). Sets make it milliseconds; a DoS bound, not a speed
/// goal: the margin is a thousandfold.
#[test]
fn an_enum_diff_is_not_quadratic() {
    use crate::policy::catalog::{Catalog, diff};
    let n = 25_000;
    let schema = |shift: usize| {
        let values: Vec<String> = (0..n).map(|i| format!("v{}", i + shift)).collect();
        json!({"type": "object", "properties": {"mode": {"type": "string", "enum": values}}})
    };
    let old = Catalog::from_tools(vec![json!({"name": "t", "inputSchema": schema(0)})]).unwrap();
    let new = Catalog::from_tools(vec![json!({"name": "t", "inputSchema": schema(n)})]).unwrap();
    let started = std::time::Instant::now();
    let d = diff(&old, &new);
    let took = started.elapsed();
    assert_eq!(d.changed.len(), 1);
    assert!(
        took < std::time::Duration::from_secs(3),
        "diffing one {n}-value enum took {took:?}"
    );
}
