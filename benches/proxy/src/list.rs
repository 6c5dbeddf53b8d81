//! Phase `list`: `tools/list` round trips through direct / relay / run (and hops-relay on the
//! default catalog), for the fake server's default two-tool catalog (the latency variants) and for
//! a generated catalog of `--list-big-tools` tools (~366 bytes each, as in issue 15) served by a
//! separate set of processes started with `FAKE_TOOLS`.

use crate::{
    Conn, DIRECT, Opts, RELAY, RUN, Server, Variants, cpu_snapshot, met, progress, start_variants,
    summarize,
};
use serde_json::{Value, json};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What one catalog's measurement gives, per variant (indexed like `Variants::conns`).
struct ListRun {
    /// Round-trip times, µs.
    samples: Vec<Vec<f64>>,
    /// Size of the answer line (bytes, without the newline) and its number of tools.
    bytes: Vec<usize>,
    tools: Vec<usize>,
    /// On-CPU ns of (proxy, server) over the measured lists.
    cpu: Vec<(u64, u64)>,
}

impl Conn {
    /// One timed `tools/list` round trip (µs); the answer stays in `self.line`.
    fn timed_list(&mut self) -> f64 {
        let id = self.alloc_id();
        let line = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/list\",\"params\":{{}}}}\n"
        );
        self.timed_line(id, &line) as f64 / 1000.0
    }

    /// Checks the answer in `self.line` (after the timer); returns (bytes, tools).
    fn list_answer(&self) -> (usize, usize) {
        let v: Value = serde_json::from_str(&self.line).unwrap();
        let tools = v["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{}: tools/list failed: {:.300}", self.name, self.line));
        (self.line.trim_end().len(), tools.len())
    }
}

/// `rounds` lists per variant after a warm-up, the variants taking turns in rotating order.
fn measure(v: &mut Variants, rounds: usize) -> ListRun {
    let k = v.conns.len();
    for _ in 0..(rounds / 10).max(5) {
        for c in &mut v.conns {
            c.timed_list();
            c.list_answer();
        }
    }
    let mut r = ListRun {
        samples: vec![Vec::with_capacity(rounds); k],
        bytes: vec![0; k],
        tools: vec![0; k],
        cpu: vec![(0, 0); k],
    };
    let before = cpu_snapshot(v);
    for i in 0..rounds {
        for j in 0..k {
            let c = (i + j) % k;
            r.samples[c].push(v.conns[c].timed_list());
            (r.bytes[c], r.tools[c]) = v.conns[c].list_answer();
        }
    }
    let after = cpu_snapshot(v);
    for c in 0..k {
        r.cpu[c] = (after[c].0 - before[c].0, after[c].1 - before[c].1);
    }
    r
}

/// Quiet before each spaced list: longer than `run`'s work after answering a 1,000-tool list.
const SPACING: Duration = Duration::from_millis(100);

/// Spaced lists: before each, `SPACING` of quiet, so whatever a proxy does after answering the
/// previous one is over; right after each answer, one timed `tools/call echo`, which waits for
/// whatever the proxy still does with this list. Returns (list µs, call µs) per variant.
fn measure_spaced(v: &mut Variants, rounds: usize) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let k = v.conns.len();
    let mut lists = vec![Vec::with_capacity(rounds); k];
    let mut calls = vec![Vec::with_capacity(rounds); k];
    for i in 0..rounds {
        for j in 0..k {
            let c = (i + j) % k;
            std::thread::sleep(SPACING);
            let conn = &mut v.conns[c];
            lists[c].push(conn.timed_list());
            // Read off the count only (no parse) so the call goes out at once.
            assert!(
                conn.line.contains("\"tools\":["),
                "{}: {:.300}",
                conn.name,
                conn.line
            );
            calls[c].push(conn.timed_echo() as f64 / 1000.0);
        }
    }
    (lists, calls)
}

fn report_spaced(names: &[String], r: &(Vec<Vec<f64>>, Vec<Vec<f64>>), ms: bool, out: &mut String) {
    let (unit, div) = if ms { ("ms", 1000.0) } else { ("µs", 1.0) };
    let rounds = r.0[0].len();
    out.push_str(&format!(
        "Spaced: {rounds} more lists per variant, each after {} ms of quiet (so a proxy's work after its previous answer is over), each followed at once by a timed `tools/call echo` (which waits for whatever the proxy still does with the list it just answered); rotating order.\n\n| variant | n | spaced list p50 ({unit}) | min | p50 / direct | call right after the list: p50 (µs) | max (µs) |\n|---|---|---|---|---|---|---|\n",
        SPACING.as_millis()
    ));
    let d = summarize(&r.0[DIRECT]).p50;
    for (i, name) in names.iter().enumerate() {
        let l = summarize(&r.0[i]);
        let c = summarize(&r.1[i]);
        out.push_str(&format!(
            "| {name} | {} | {:.3} | {:.3} | {:.3} | {:.1} | {:.1} |\n",
            l.n,
            l.p50 / div,
            l.min / div,
            l.p50 / d,
            c.p50,
            c.max
        ));
    }
    out.push('\n');
}

const VERBS: [&str; 10] = [
    "list", "get", "create", "update", "delete", "search", "archive", "export", "sync", "review",
];
const NOUNS: [&str; 10] = [
    "issues",
    "pull_requests",
    "comments",
    "files",
    "branches",
    "releases",
    "deployments",
    "invoices",
    "customers",
    "tickets",
];

/// A realistic tool (~366 bytes as JSON): a one-sentence description, an input schema of 2–4
/// properties.
fn tool(i: usize) -> Value {
    let verb = VERBS[i % VERBS.len()];
    let noun = NOUNS[(i / VERBS.len()) % NOUNS.len()];
    let thing = noun.replace('_', " ");
    let mut props = serde_json::Map::new();
    props.insert(
        "project".into(),
        json!({"type": "string", "description": format!("Project key, e.g. ACME-{i}.")}),
    );
    props.insert(
        "query".into(),
        json!({"type": "string", "description": format!("Filter for {thing} to {verb}.")}),
    );
    if !i.is_multiple_of(3) {
        props.insert(
            "limit".into(),
            json!({"type": "integer", "minimum": 1, "maximum": 100, "default": 20}),
        );
    }
    if i.is_multiple_of(2) {
        props.insert(
            "dry_run".into(),
            json!({"type": "boolean", "default": false}),
        );
    }
    json!({
        "name": format!("{verb}_{noun}_{i:04}"),
        "description": format!(
            "{}{} {thing} in the selected project.",
            verb[..1].to_uppercase(),
            &verb[1..]
        ),
        "inputSchema": {"type": "object", "properties": props, "required": ["project"]},
    })
}

/// Writes the large catalog (echo first, so the harness's readiness call is a listed tool).
fn write_catalog(o: &Opts) -> PathBuf {
    let mut tools = vec![json!({
        "name": "echo",
        "description": "Echo the arguments back (read-only)",
        "inputSchema": {"type": "object"},
        "annotations": {"readOnlyHint": true}
    })];
    tools.extend((1..o.list_big_tools).map(tool));
    let path = o.work.join(format!("tools-{}.json", o.list_big_tools));
    fs::write(
        &path,
        serde_json::to_vec(&json!({ "tools": tools })).unwrap(),
    )
    .unwrap();
    path
}

fn report(names: &[String], r: &ListRun, title: &str, ms: bool, out: &mut String) {
    let rounds = r.samples[0].len();
    let (unit, div) = if ms { ("ms", 1000.0) } else { ("µs", 1.0) };
    out.push_str(&format!("### {title}\n\n"));
    out.push_str(&format!(
        "{rounds} `tools/list` round trips per variant after a warm-up; the variants take turns list by list (rotating order); times in {unit} from the write of the request to the end of the answer line.\n\n"
    ));
    out.push_str(&format!("| variant | n | answer bytes | tools | p50 | p90 | p99 | min | max | p50 / direct | p50 / relay | proxy CPU {unit}/list | server CPU {unit}/list |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"));
    let s: Vec<_> = r.samples.iter().map(|x| summarize(x)).collect();
    let per = |ns: u64| ns as f64 / 1000.0 / div / rounds as f64;
    for (i, name) in names.iter().enumerate() {
        let x = &s[i];
        out.push_str(&format!(
            "| {name} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {:.3} |\n",
            x.n,
            r.bytes[i],
            r.tools[i],
            x.p50 / div,
            x.p90 / div,
            x.p99 / div,
            x.min / div,
            x.max / div,
            x.p50 / s[DIRECT].p50,
            x.p50 / s[RELAY].p50,
            if i == DIRECT {
                "-".into()
            } else {
                format!("{:.3}", per(r.cpu[i].0))
            },
            per(r.cpu[i].1)
        ));
    }
    let paired = |a: usize, b: usize| {
        let q: Vec<f64> = (0..rounds)
            .map(|i| r.samples[a][i] / r.samples[b][i])
            .collect();
        summarize(&q).p50
    };
    out.push_str(&format!(
        "\nRatios of p50: run / relay {:.3}, run / direct {:.3}, relay / direct {:.3}; medians of the per-round paired ratios: run / relay {:.3}, run / direct {:.3}. Added p50 over direct: relay {:.3} {unit}, run {:.3} {unit}.\n\n",
        s[RUN].p50 / s[RELAY].p50,
        s[RUN].p50 / s[DIRECT].p50,
        s[RELAY].p50 / s[DIRECT].p50,
        paired(RUN, RELAY),
        paired(RUN, DIRECT),
        (s[RELAY].p50 - s[DIRECT].p50) / div,
        (s[RUN].p50 - s[DIRECT].p50) / div,
    ));
}

fn goal(out: &mut String, what: &str, r: f64) {
    out.push_str(&format!(
        "GOAL {what} <= 1.10: {r:.3} -> {}\n\n",
        met(r <= 1.10)
    ));
}

fn p50(r: &ListRun, i: usize) -> f64 {
    summarize(&r.samples[i]).p50
}

pub(crate) fn list_phase(o: &Opts, srv: &Server, v: &mut Variants, out: &mut String) {
    out.push_str("## 5. `tools/list` round trip\n\n");
    progress(&format!(
        "list: default catalog, {} lists per variant, rotating order",
        o.list_calls
    ));
    let names: Vec<String> = v.conns.iter().map(|c| c.name.clone()).collect();
    let small = measure(v, o.list_calls);
    report(
        &names,
        &small,
        "Default catalog (the fake server's two tools; the latency variants)",
        false,
        out,
    );
    report_spaced(&names, &measure_spaced(v, o.list_spaced), false, out);
    goal(
        out,
        "tools/list p50 two tools run/relay",
        p50(&small, RUN) / p50(&small, RELAY),
    );

    let file = write_catalog(o);
    progress(&format!(
        "list: {}-tool catalog ({}), new direct / relay / run processes",
        o.list_big_tools,
        file.display()
    ));
    let env: [(&str, &Path); 1] = [("FAKE_TOOLS", &file)];
    let mut big_v = start_variants(o, srv, "list-big", &env, false);
    progress(&format!(
        "list: {}-tool catalog, {} lists per variant, rotating order",
        o.list_big_tools, o.list_big_calls
    ));
    let big = measure(&mut big_v, o.list_big_calls);
    let names: Vec<String> = big_v.conns.iter().map(|c| c.name.clone()).collect();
    report(
        &names,
        &big,
        &format!(
            "{} tools (`FAKE_TOOLS={}`: descriptions and input schemas of 2–4 properties each; separate server processes)",
            o.list_big_tools,
            file.display()
        ),
        true,
        out,
    );
    report_spaced(
        &names,
        &measure_spaced(&mut big_v, o.list_spaced),
        true,
        out,
    );
    goal(
        out,
        &format!("tools/list p50 {} tools run/relay", o.list_big_tools),
        p50(&big, RUN) / p50(&big, RELAY),
    );
    goal(
        out,
        &format!("tools/list p50 {} tools run/direct", o.list_big_tools),
        p50(&big, RUN) / p50(&big, DIRECT),
    );
    for c in big_v.conns {
        c.close();
    }
}
