//! Per-call cost of checking a `tools/call`'s arguments against the tool's current input
//! schema (issue 33, item 5): the gate's decision with the check against the same decision
//! without it, for the proxy benchmark's `echo` (`{"type":"object"}`, `{"text":"bench"}`) and
//! the inventory fixture's `write_item` (two typed, required properties). Prints nanoseconds
//! per decision (median of 31 batches) and asserts nothing. The schema is compiled at the
//! first call and cached, so what is measured is the per-call path: two catalog lookups,
//! reading the arguments into a `serde_json::Value`, and `Validator::is_valid`.
//!
//! Run: `cargo bench --bench arguments` (for a quick build, without the release profile's
//! fat LTO: `CARGO_PROFILE_BENCH_LTO=false CARGO_PROFILE_BENCH_CODEGEN_UNITS=16`). Under
//! callgrind, `BENCH_ITERS=N BENCH_BATCHES=1 BENCH_ONLY=checked|unchecked
//! BENCH_CASE=echo|write_item` runs one variant of one case alone: the difference of two runs'
//! instruction counts (two values of N) over the difference of N is the cost of one decision.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

use cargo_mcp_dev::identity::epoch::EpochId;
use cargo_mcp_dev::policy::approval::{CheckedCall, Gate, Gating, Policy, ServedCatalog, Serving};
use cargo_mcp_dev::policy::catalog::CatalogRevision;
use serde_json::{Value, json};

fn gate() -> Gate {
    Gate::new(
        Policy {
            gating: Gating::Off,
            ..Policy::default()
        },
        "run-1",
        "bench".into(),
    )
}

const DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let iters = env("BENCH_ITERS", 20_000);
    let batches = env("BENCH_BATCHES", 31);
    let only = std::env::var("BENCH_ONLY").ok();
    let cases: [(&str, Value, &str); 2] = [
        (
            "echo",
            json!({"name": "echo", "inputSchema": {"type": "object"}}),
            r#"{"text":"bench"}"#,
        ),
        (
            "write_item",
            json!({"name": "write_item", "inputSchema": {"type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "format": "int64"}},
                "required": ["sku", "qty"]}}),
            r#"{"sku":"widget","qty":12}"#,
        ),
    ];
    let case = std::env::var("BENCH_CASE").ok();
    for (tool, def, args) in &cases {
        if case.as_deref().is_some_and(|c| c != *tool) {
            continue;
        }
        let mut g = gate();
        // What the session would hand the gate: epoch E1 serving a catalog of this one tool.
        let epoch = EpochId::from("E1");
        let revision = CatalogRevision {
            number: 1,
            digest: "sha256:c".into(),
        };
        let tools = BTreeMap::from([(tool.to_string(), DIGEST.to_string())]);
        let serving = Serving {
            epoch: Some(&epoch),
            catalog: Some(ServedCatalog {
                revision: &revision,
                tools: &tools,
            }),
        };
        let mut run = |checked: bool| {
            let mut samples = Vec::with_capacity(batches);
            for _ in 0..batches {
                let t = Instant::now();
                for _ in 0..iters {
                    let call = checked.then(|| CheckedCall {
                        arguments: Some(black_box(*args)),
                        definition: def,
                        digest: DIGEST,
                    });
                    black_box(g.decide_call_checked(
                        serving,
                        black_box(tool),
                        Some("sha256:a"),
                        call,
                        0,
                    ));
                }
                samples.push(t.elapsed().as_nanos() as f64 / iters as f64);
            }
            samples.sort_by(f64::total_cmp);
            samples[samples.len() / 2]
        };
        let checked = (only.as_deref() != Some("unchecked")).then(|| run(true));
        let unchecked = (only.as_deref() != Some("checked")).then(|| run(false));
        eprintln!(
            "{tool}: decision with the check {checked:?} ns, without {unchecked:?} ns, added {:?} ns",
            checked.zip(unchecked).map(|(a, b)| a - b)
        );
    }
}
