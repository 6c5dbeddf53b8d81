//! Arguments checked against the current definition (issue 33, item 5): the gate's rule, the
//! bounds on a hostile schema, the cache, and the payload.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::{Value, json};

use super::test_gate::TestGate;
use super::*;
use crate::policy::catalog::CatalogRevision;

const A: &str = "01JQ7R4S4S0QJ7GZP1S2";
const B: &str = "01JQ7R9KQ6K2Y8W4JH0M";

fn write_item() -> Value {
    json!({
        "name": "write_item",
        "description": "Write one item",
        "inputSchema": {
            "type": "object",
            "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
            "required": ["sku", "qty"]
        }
    })
}

/// A gate with nothing gated, at epoch `epoch` and a catalog of `tools` whose digests are
/// `<tag>:<name>`, the host shown it.
fn gate_with(epoch: &str, tag: &str, tools: &[&str]) -> TestGate {
    let mut g = TestGate::new(Gate::new(
        Policy {
            gating: Gating::Off,
            ..Policy::default()
        },
        "run-1",
        "inventory".into(),
    ));
    g.epoch_started(epoch);
    let digests: BTreeMap<String, String> = tools
        .iter()
        .map(|n| (n.to_string(), format!("{tag}:{n}")))
        .collect();
    assert!(g.catalog_fetched(
        epoch,
        CatalogRevision {
            number: 1,
            digest: format!("sha256:{tag}"),
        },
        digests
    ));
    g.host_fetched_catalog(&format!("sha256:{tag}"));
    g
}

/// Judges a call of `def`'s tool (digest `<tag>:<name>`) with `args` (JSON text, `None`: absent).
fn judge(g: &mut TestGate, tag: &str, def: &Value, args: Option<&str>) -> CallDecision {
    let name = def["name"].as_str().unwrap();
    let digest = format!("{tag}:{name}");
    g.decide_call_checked(
        name,
        Some("sha256:args"),
        Some(CheckedCall {
            arguments: args,
            definition: def,
            digest: &digest,
        }),
        0,
    )
}

fn forwarded(d: &CallDecision) -> bool {
    matches!(d, CallDecision::Forward { .. })
}

fn refused(d: CallDecision) -> Denial {
    match d {
        CallDecision::Deny(d) => {
            assert_eq!(d.reason, DenialReason::ArgumentsInvalid, "{d:?}");
            d
        }
        other => panic!("expected arguments_invalid, got {other:?}"),
    }
}

#[test]
fn valid_arguments_pass_and_invalid_are_refused_with_what_did_not_match() {
    let mut g = gate_with(A, "c1", &["write_item"]);
    let def = write_item();
    assert!(forwarded(&judge(
        &mut g,
        "c1",
        &def,
        Some(r#"{"sku":"a","qty":1}"#)
    )));
    let d = refused(judge(&mut g, "c1", &def, Some(r#"{"sku":"a","qty":"1"}"#)));
    assert_eq!(d.mismatches.len(), 1, "{d:?}");
    assert_eq!(d.mismatches[0].path, "/qty");
    assert_eq!(d.mismatches[0].keyword, "type");
    assert!(
        !d.mismatches[0].message.contains("\"1\""),
        "the argument's value is left out: {:?}",
        d.mismatches[0]
    );
    let p = d.payload();
    assert_eq!(p["error"], json!("arguments_invalid"));
    assert!(
        p["reason"]
            .as_str()
            .unwrap()
            .contains("do not match the tool's current definition"),
        "{p}"
    );
    assert_eq!(p["mismatches"][0]["path"], json!("/qty"), "{p}");
    assert_eq!(p["currentCatalog"]["revision"], json!(1), "{p}");
    assert_eq!(p["hostCatalog"], json!("sha256:c1"), "{p}");
    assert_eq!(p["currentEpoch"], json!(A), "{p}");
    assert_eq!(p["tool"], json!("write_item"));
    assert!(d.human_hint().contains("/qty"), "{}", d.human_hint());
    // A missing required property; absent and `null` arguments are an empty object.
    let d = refused(judge(&mut g, "c1", &def, Some(r#"{"sku":"a"}"#)));
    assert_eq!(d.mismatches[0].keyword, "required");
    for args in [None, Some("null")] {
        let d = refused(judge(&mut g, "c1", &def, args));
        assert_eq!(d.mismatches[0].keyword, "required", "{args:?}");
    }
    // The refusal is kept for `status` like any other.
    let last = &g.recent_denials().last().unwrap().denial;
    assert_eq!(last.reason, DenialReason::ArgumentsInvalid);
}

#[test]
fn arguments_that_are_not_an_object_are_refused_whatever_the_schema() {
    for def in [
        write_item(),
        json!({"name": "write_item"}),
        json!({"name": "write_item", "inputSchema": {}}),
    ] {
        let mut g = gate_with(A, "c1", &["write_item"]);
        for args in ["[1]", "\"x\"", "3", "true"] {
            let d = refused(judge(&mut g, "c1", &def, Some(args)));
            assert_eq!(d.mismatches[0].path, "");
            assert!(d.mismatches[0].message.contains("object"), "{d:?}");
        }
    }
}

#[test]
fn a_tool_without_input_schema_or_with_an_empty_one_takes_any_object() {
    for def in [
        json!({"name": "t"}),
        json!({"name": "t", "inputSchema": null}),
        json!({"name": "t", "inputSchema": {}}),
        json!({"name": "t", "inputSchema": {"type": "object"}}),
        json!({"name": "t", "inputSchema": {"type": "object", "properties": {},
               "additionalProperties": true, "$schema": "https://json-schema.org/draft/2020-12/schema"}}),
        json!({"name": "t", "inputSchema": true}),
    ] {
        let mut g = gate_with(A, "c1", &["t"]);
        for args in [None, Some("{}"), Some(r#"{"anything":[1,{"x":null}]}"#)] {
            assert!(
                forwarded(&judge(&mut g, "c1", &def, args)),
                "{def} {args:?}"
            );
        }
        assert!(g.take_input_notices().is_none(), "nothing to say for {def}");
    }
}

#[test]
fn a_schema_that_looks_open_but_is_not_is_checked() {
    for (schema, args) in [
        (json!({"type": "object", "minProperties": 1}), "{}"),
        (
            json!({"type": "object", "additionalProperties": false}),
            r#"{"a":1}"#,
        ),
        (
            json!({"type": "object", "properties": {}, "required": ["a"]}),
            "{}",
        ),
        (json!(false), "{}"),
    ] {
        let def = json!({"name": "t", "inputSchema": schema});
        let mut g = gate_with(A, "c1", &["t"]);
        refused(judge(&mut g, "c1", &def, Some(args)));
    }
}

#[test]
fn additional_properties_are_refused_only_when_the_schema_says_so() {
    let mut open = write_item();
    let mut g = gate_with(A, "c1", &["write_item"]);
    let extra = Some(r#"{"sku":"a","qty":1,"warehouse":"w"}"#);
    assert!(forwarded(&judge(&mut g, "c1", &open, extra)));
    open["inputSchema"]["additionalProperties"] = json!(false);
    let mut g = gate_with(A, "c2", &["write_item"]);
    let d = refused(judge(&mut g, "c2", &open, extra));
    assert_eq!(d.mismatches[0].keyword, "additionalProperties", "{d:?}");
    assert!(d.mismatches[0].message.contains("warehouse"), "{d:?}");
}

#[test]
fn checks_come_after_staleness_and_before_grants() {
    // A gated tool, no grant: a malformed call is refused for its arguments, not sent to a
    // person; a per-call grant is not spent on it.
    let mut g = TestGate::new(Gate::new(
        Policy {
            mode: ApprovalMode::PerCall,
            ..Policy::default()
        },
        "run-1",
        "inventory".into(),
    ));
    g.epoch_started(A);
    g.catalog_fetched(
        A,
        CatalogRevision {
            number: 1,
            digest: "sha256:c1".into(),
        },
        BTreeMap::from([("write_item".to_string(), "c1:write_item".to_string())]),
    );
    g.host_fetched_catalog("sha256:c1");
    let def = write_item();
    refused(judge(&mut g, "c1", &def, Some(r#"{"qty":"x"}"#)));
    assert!(g.pending_requests().0.is_empty(), "nobody is asked");
    g.approve(
        ApprovalRequest {
            epoch: A.into(),
            tools: BTreeSet::from(["write_item".to_string()]),
            credential_scopes: BTreeSet::new(),
        },
        0,
        "g1".into(),
    )
    .unwrap();
    refused(judge(&mut g, "c1", &def, Some(r#"{"qty":"x"}"#)));
    assert_eq!(g.grants().len(), 1, "the per-call grant is kept");
    assert!(forwarded(&judge(
        &mut g,
        "c1",
        &def,
        Some(r#"{"sku":"a","qty":1}"#)
    )));
    assert!(g.grants().is_empty(), "spent on the call that ran");
    // A stale call is refused as stale first (its result carries the definition already).
    let mut g = gate_with(A, "c1", &["write_item"]);
    g.host_view_mut().show_tool(
        "write_item",
        Some(("old:write_item".into(), serde_json::Value::Null)),
        None,
    );
    let d = judge(&mut g, "c1", &def, Some("[]"));
    assert!(
        matches!(&d, CallDecision::Deny(d) if d.reason == DenialReason::CatalogStale),
        "{d:?}"
    );
}

#[test]
fn a_definition_of_another_catalog_is_not_used() {
    // The session's catalog and the gate's disagree (a late answer): no check rather than a
    // check against a definition the gate did not judge.
    let mut g = gate_with(A, "c1", &["write_item"]);
    let def = write_item();
    assert!(forwarded(&judge(&mut g, "other", &def, Some("[]"))));
    assert_eq!(g.input_schemas().compiles(), 0);
}

#[test]
fn the_schema_is_compiled_once_per_definition() {
    let mut g = gate_with(A, "c1", &["write_item", "list_items"]);
    let def = write_item();
    for qty in 0..50 {
        let args = format!(r#"{{"sku":"a","qty":{qty}}}"#);
        assert!(forwarded(&judge(&mut g, "c1", &def, Some(&args))));
    }
    refused(judge(&mut g, "c1", &def, Some("{}")));
    assert_eq!(g.input_schemas().compiles(), 1);
    // A rebuild that serves the same definition compiles nothing.
    g.epoch_started(B);
    g.catalog_fetched(
        B,
        CatalogRevision {
            number: 1,
            digest: "sha256:c1".into(),
        },
        BTreeMap::from([
            ("write_item".to_string(), "c1:write_item".to_string()),
            ("list_items".to_string(), "c1:list_items".to_string()),
        ]),
    );
    assert!(forwarded(&judge(
        &mut g,
        "c1",
        &def,
        Some(r#"{"sku":"a","qty":1}"#)
    )));
    assert_eq!(g.input_schemas().compiles(), 1);
    // A new catalog in which `qty` became a string: compiled again, and judged by it.
    let mut def2 = write_item();
    def2["inputSchema"]["properties"]["qty"] = json!({"type": "string"});
    g.catalog_fetched(
        B,
        CatalogRevision {
            number: 2,
            digest: "sha256:c2".into(),
        },
        BTreeMap::from([("write_item".to_string(), "c2:write_item".to_string())]),
    );
    g.host_fetched_catalog("sha256:c2");
    let d = refused(judge(&mut g, "c2", &def2, Some(r#"{"sku":"a","qty":1}"#)));
    assert_eq!(d.current_catalog.as_ref().unwrap().number, 2);
    assert!(forwarded(&judge(
        &mut g,
        "c2",
        &def2,
        Some(r#"{"sku":"a","qty":"1"}"#)
    )));
    assert_eq!(g.input_schemas().compiles(), 2);
}

/// A schema that is not checked: the call goes through, and the gate says why once.
fn assert_unchecked(def: Value, args: &str, why: &str) {
    let mut g = gate_with(A, "c1", &["t"]);
    let t = Instant::now();
    assert!(forwarded(&judge(&mut g, "c1", &def, Some(args))));
    let notices = g.take_input_notices().expect("a notice");
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0].0, "t");
    assert!(notices[0].1.contains(why), "{notices:?}");
    assert!(forwarded(&judge(&mut g, "c1", &def, Some(args))));
    assert!(g.take_input_notices().is_none(), "said once");
    assert_eq!(
        g.input_schemas().compiles(),
        1,
        "not compiled again per call"
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn a_hostile_or_broken_schema_is_not_checked_and_said_once() {
    // Too deep (built as text: serde_json's own depth limit is not what bounds it here).
    let mut deep = json!({"type": "object"});
    for _ in 0..200 {
        deep = json!({"type": "object", "properties": {"a": deep}});
    }
    assert_unchecked(json!({"name": "t", "inputSchema": deep}), "{}", "nested");
    // Too many values.
    let props: serde_json::Map<String, Value> = (0..20_000)
        .map(|i| (format!("p{i}"), json!(true)))
        .collect();
    assert_unchecked(
        json!({"name": "t", "inputSchema": {"type": "object", "properties": props}}),
        "{}",
        "values",
    );
    // Too much text.
    assert_unchecked(
        json!({"name": "t", "inputSchema": {"properties": {"a": {"description": "x".repeat(300 * 1024)}}}}),
        "{}",
        "KiB",
    );
    // Not a schema the validator compiles.
    assert_unchecked(
        json!({"name": "t", "inputSchema": {"type": 12}}),
        "{}",
        "does not compile",
    );
    // A reference outside the schema is never fetched.
    assert_unchecked(
        json!({"name": "t", "inputSchema": {"$ref": "http://127.0.0.1:9/x.json"}}),
        "{}",
        "does not follow",
    );
    assert_unchecked(
        json!({"name": "t", "inputSchema": {"$ref": "file:///etc/passwd"}}),
        "{}",
        "does not follow",
    );
    // A pattern over the size bound: `regex` refuses to compile it.
    assert_unchecked(
        json!({"name": "t", "inputSchema": {"properties": {"s": {"pattern": "(\\w{1000}){1000}"}}}}),
        r#"{"s":"a"}"#,
        "does not compile",
    );
}

#[test]
fn hostile_schemas_are_bounded_in_time() {
    // Catastrophic backtracking for a backtracking engine; linear for `regex`.
    let def = json!({"name": "t", "inputSchema": {"properties": {"s": {"pattern": "^(a+)+$"}}}});
    let mut g = gate_with(A, "c1", &["t"]);
    let args = format!(r#"{{"s":"{}b"}}"#, "a".repeat(100_000));
    let t = Instant::now();
    let d = refused(judge(&mut g, "c1", &def, Some(&args)));
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "pattern took {:?}",
        t.elapsed()
    );
    assert!(
        d.mismatches[0].message.chars().count() <= 161,
        "{:?}",
        d.mismatches[0]
    );
}

#[test]
fn hostile_references_are_bounded_in_time() {
    // A reference cycle that consumes nothing: compiled, and the validator stops it.
    let cyclic = json!({"name": "t", "inputSchema": {"$ref": "#/$defs/a",
        "$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}}}});
    let mut g = gate_with(A, "c1", &["t"]);
    let t = Instant::now();
    let _ = judge(&mut g, "c1", &cyclic, Some(r#"{"x":1}"#));
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // A chain of references that doubles at each step (2^40 visits): not checked.
    let mut defs = serde_json::Map::new();
    for i in 0..40 {
        let next = format!("#/$defs/d{}", i + 1);
        defs.insert(
            format!("d{i}"),
            json!({"allOf": [{"$ref": next}, {"$ref": next}], "type": "object"}),
        );
    }
    defs.insert("d40".into(), json!({"type": "object"}));
    let doubling = json!({"name": "t", "inputSchema": {"$ref": "#/$defs/d0", "$defs": defs}});
    assert_unchecked(doubling, r#"{"x":1}"#, "expands");
    // A cycle that branches: each level of the arguments is validated twice (2^depth).
    let branching = json!({"name": "t", "inputSchema": {"$ref": "#/$defs/n", "$defs": {"n": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/n"}},
        "allOf": [{"properties": {"x": {"$ref": "#/$defs/n"}}}]}}}});
    let mut deep = String::from("{}");
    for _ in 0..100 {
        deep = format!(r#"{{"x":{deep}}}"#);
    }
    assert_unchecked(branching, &deep, "expands");
    // References this check does not follow.
    for reference in ["#anchor", "other.json#/a", "#/$defs/%61"] {
        let def = json!({"name": "t", "inputSchema": {"$ref": reference, "$defs": {"a": {}}}});
        assert_unchecked(def, "{}", "does not follow");
    }
    // A recursive schema that descends once per turn (a linked list) is checked, at depth.
    let list = json!({"name": "t", "inputSchema": {"$ref": "#/$defs/n", "$defs": {"n": {
        "type": "object", "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/n"}},
        "required": ["v"]}}}});
    let mut g = gate_with(A, "c1", &["t"]);
    let mut good = String::from(r#"{"v":0}"#);
    for i in 0..100 {
        good = format!(r#"{{"v":{i},"next":{good}}}"#);
    }
    assert!(forwarded(&judge(&mut g, "c1", &list, Some(&good))));
    let bad = good.replacen(r#"{"v":0}"#, r#"{"v":"0"}"#, 1);
    let d = refused(judge(&mut g, "c1", &list, Some(&bad)));
    assert!(d.mismatches[0].path.starts_with("/next/next/"), "{d:?}");
    assert!(d.mismatches[0].path.ends_with('…'), "shortened: {d:?}");
    assert_eq!(d.mismatches[0].keyword, "type");
    assert!(g.take_input_notices().is_none());
}

#[test]
fn big_arguments_report_their_first_mismatch_only() {
    // Every element fails: the validator would collect 50,000 errors; the first is enough.
    let def =
        json!({"name": "t", "inputSchema": {"properties": {"a": {"items": {"type": "string"}}}}});
    let mut g = gate_with(A, "c1", &["t"]);
    let args = json!({"a": vec![1; 50_000]}).to_string();
    let d = refused(judge(&mut g, "c1", &def, Some(&args)));
    assert_eq!(d.mismatches.len(), 1, "{d:?}");
    assert_eq!(d.mismatches[0].path, "/a/0");
    let small = json!({"a": [1, 2, 3, 4]}).to_string();
    let d = refused(judge(&mut g, "c1", &def, Some(&small)));
    assert_eq!(d.mismatches.len(), MISMATCHES_REPORTED, "{d:?}");
}

#[test]
fn mismatch_text_is_shortened_and_safe_to_show() {
    let def = json!({"name": "t", "inputSchema": {"type": "object", "additionalProperties": false,
        "properties": {"mode": {"enum": ["\u{1b}]0;owned\u{7}", "\u{202e}evil"]}}}});
    let mut g = gate_with(A, "c1", &["t"]);
    let long = "k\u{1b}[2J".repeat(200);
    let mut args = serde_json::Map::new();
    args.insert("mode".into(), json!("x"));
    args.insert(long, json!(1));
    let args = Value::Object(args).to_string();
    let d = refused(judge(&mut g, "c1", &def, Some(&args)));
    assert_eq!(d.mismatches.len(), 2, "{d:?}");
    for m in &d.mismatches {
        for text in [&m.path, &m.keyword, &m.message] {
            assert!(
                !text.chars().any(|c| crate::screen::sanitize::is_control(c)
                    || crate::screen::sanitize::is_invisible(c)),
                "{text:?}"
            );
            assert!(text.chars().count() <= 161, "{text:?}");
        }
    }
    assert!(d.human_hint().chars().count() < 1000, "{}", d.human_hint());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The decision matches the schema read by hand: `sku` a string, `qty` an integer in
    /// 0..=100, both required, nothing else.
    #[test]
    fn decision_matches_the_schema(
        sku in prop_oneof![Just(None), Just(Some(json!("a"))), Just(Some(json!(3)))],
        qty in prop_oneof![Just(None), (-5i64..105).prop_map(|n| Some(json!(n))),
                           Just(Some(json!("7"))), Just(Some(json!(1.5)))],
        extra in any::<bool>(),
    ) {
        let def = json!({"name": "t", "inputSchema": {"type": "object",
            "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 0, "maximum": 100}},
            "required": ["sku", "qty"], "additionalProperties": false}});
        let mut args = serde_json::Map::new();
        if let Some(s) = &sku { args.insert("sku".into(), s.clone()); }
        if let Some(q) = &qty { args.insert("qty".into(), q.clone()); }
        if extra { args.insert("extra".into(), json!(1)); }
        let valid = sku.as_ref().is_some_and(Value::is_string)
            && qty.as_ref().and_then(Value::as_i64).is_some_and(|n| (0..=100).contains(&n))
            && !extra;
        let mut g = gate_with(A, "c1", &["t"]);
        let text = Value::Object(args).to_string();
        let d = judge(&mut g, "c1", &def, Some(&text));
        prop_assert_eq!(forwarded(&d), valid, "{} -> {:?}", text, d);
    }
}

/// The deepest validation the bounds allow fits in half the 2 MiB stack of the threads that
/// judge calls (the host reader, the server readers): a cycle of references that descends one level of
/// the arguments per turn, each turn as deep as [`MAX_EXPANDED_DEPTH`] lets it be, against
/// arguments nested as deep as serde_json reads. One level deeper per turn is not checked.
#[test]
fn the_deepest_validation_the_bounds_allow_fits_the_stack() {
    let cycle = |hops: usize| {
        let mut defs = serde_json::Map::new();
        for i in 0..hops {
            defs.insert(
                format!("d{i}"),
                json!({"allOf": [{"$ref": format!("#/$defs/d{}", i + 1)}]}),
            );
        }
        defs.insert(
            format!("d{hops}"),
            json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}}),
        );
        json!({"name": "t", "inputSchema": {"$ref": "#/$defs/d0", "$defs": defs}})
    };
    // Each hop is three levels (object, allOf, item), each turn three more (object,
    // properties, x), and the walk unrolls 129 turns: 129 × (3 × hops + 3) + 1 levels.
    let hops = (MAX_EXPANDED_DEPTH / 129 - 3) / 3;
    assert!(129 * (3 * hops + 3) < MAX_EXPANDED_DEPTH);
    assert!(129 * (3 * (hops + 1) + 3) > MAX_EXPANDED_DEPTH);
    let mut deep = String::from("{}");
    for _ in 0..126 {
        deep = format!(r#"{{"x":{deep}}}"#);
    }
    let stack: usize = std::env::var("ARGS_TEST_STACK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 20);
    std::thread::Builder::new()
        .stack_size(stack)
        .spawn(move || {
            let def = cycle(hops);
            let mut g = gate_with(A, "c1", &["t"]);
            let d = judge(&mut g, "c1", &def, Some(&deep));
            assert_eq!(g.take_input_notices(), None, "checked");
            assert!(forwarded(&d), "{d:?}");
            let bad = deep.replacen("{}", "1", 1);
            refused(judge(&mut g, "c1", &def, Some(&bad)));
            let mut g = gate_with(A, "c1", &["t"]);
            let _ = judge(&mut g, "c1", &cycle(hops + 1), Some(&deep));
            let notices = g.take_input_notices().expect("one hop more is not checked");
            assert!(notices[0].1.contains("levels deep"), "{notices:?}");
        })
        .unwrap()
        .join()
        .unwrap();
}
