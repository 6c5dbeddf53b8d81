//! First contact against a simulated real host (issue 33): every interleaving of a discover
//! probe, the fallback `initialize`, `initialized`, the first list and call, and a build that
//! ends early, late, or broken then fixed. The host behaves as Claude Code does: it gives up on
//! its probe after 3 s (a late answer to it would drop the connection) and on `initialize`
//! after 30 s, and lists and calls at once after its handshake.
//!
//! What must hold in every run: the probe is answered within the discover wait; `initialize`
//! is answered within the host's timeout, only ever with a real server's answer (this session's
//! or the one recorded for the same version); every started server is initialized before it
//! is sent anything else; every request is answered exactly once; and a host whose handshake
//! succeeded gets the real server's list and call once the build is done.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::testing::*;
use super::*;

const V: &str = "2025-06-18";
const TICK: u64 = 100;
const PROBE_TIMEOUT_MS: u64 = 3_000;
const INITIALIZE_TIMEOUT_MS: u64 = 30_000;

#[derive(Debug, Clone)]
struct Case {
    probe: bool,
    warm: bool,
    /// A record of a real server's answer to `V` exists.
    recorded: bool,
    /// The server answers this version instead of the host's (its SDK stops there).
    server_version: Option<&'static str>,
    /// When the build ends (ms).
    build_at: u64,
    /// The first build fails; a fix builds `fix_after` ms later.
    broken_first: bool,
    fix_after: u64,
    /// The host falls back this long after the probe's answer (or its own timeout).
    fallback_delay: u64,
    /// When the host gives up on its probe: Claude Code's 3 s, or a client quicker than the
    /// discover wait (its `initialize` then arrives while the probe is still held).
    probe_timeout: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(None), Just(Some("2025-03-26"))],
        0u64..400,
        any::<bool>(),
        0u64..200,
        0u64..30,
        prop_oneof![Just(PROBE_TIMEOUT_MS), Just(500u64)],
    )
        .prop_map(
            |(
                probe,
                warm,
                recorded,
                server_version,
                build,
                broken_first,
                fix,
                delay,
                probe_timeout,
            )| Case {
                probe,
                warm,
                recorded,
                server_version,
                build_at: build * TICK,
                broken_first,
                fix_after: fix * TICK,
                fallback_delay: delay * TICK,
                probe_timeout,
            },
        )
}

#[derive(Debug, Clone, PartialEq)]
enum HostState {
    Start,
    Probing {
        id: Value,
        sent: u64,
    },
    FallingBack {
        at: u64,
    },
    Initializing {
        id: Value,
        sent: u64,
    },
    Listed {
        list: Value,
        call: Value,
    },
    /// The handshake failed with an error (a reason the host shows), at this time.
    Refused(Value, u64),
}

fn modern_meta() -> Value {
    json!({"_meta": {protocol::PROTOCOL_VERSION: protocol::MODERN_VERSION}})
}

fn run(c: &Case) {
    let mut h = Harness::ungated(|cfg| {
        cfg.warm = c.warm;
        if c.recorded {
            cfg.recorded = recorded_handshake(V, "recorded");
        }
    });
    h.server_version = c.server_version.map(str::to_string);
    let mut state = HostState::Start;
    let mut modern = false;
    let mut probe_answered_at: Option<u64> = None;
    let mut probe_id: Option<Value> = None;
    let mut now = 0u64;
    let fixed_at = c.build_at + c.fix_after;
    while now <= 60_000 {
        if now == c.build_at {
            h.build(if c.broken_first {
                failed(None)
            } else {
                complete("a")
            });
        }
        if c.broken_first && now == fixed_at {
            h.build(complete("a"));
        }
        if let Some(id) = &probe_id
            && probe_answered_at.is_none()
            && h.answer(id).is_some()
        {
            probe_answered_at = Some(now);
        }
        state = match state {
            HostState::Start if c.probe => HostState::Probing {
                id: h.request("server/discover", modern_meta()),
                sent: now,
            },
            HostState::Start => HostState::FallingBack { at: now },
            HostState::Probing { id, sent } => match h.answer(&id) {
                Some(a) if a.get("result").is_some() => {
                    modern = true;
                    probe_id = Some(id);
                    let list = h.request("tools/list", modern_meta());
                    let call = h.request(
                        "tools/call",
                        json!({"name": "list_items", "arguments": {}, "_meta": modern_meta()["_meta"]}),
                    );
                    HostState::Listed { list, call }
                }
                Some(_) => {
                    probe_id = Some(id);
                    HostState::FallingBack {
                        at: now + c.fallback_delay,
                    }
                }
                None if now - sent >= c.probe_timeout => {
                    // The host gives up on its probe: any answer from now on is late.
                    probe_id = Some(id);
                    HostState::FallingBack {
                        at: now + c.fallback_delay,
                    }
                }
                None => HostState::Probing { id, sent },
            },
            HostState::FallingBack { at } if now >= at => HostState::Initializing {
                id: h.initialize(V),
                sent: now,
            },
            HostState::Initializing { id, sent } => match h.answer(&id) {
                Some(a) if a.get("result").is_some() => {
                    let name = a["result"]["serverInfo"]["name"].clone();
                    assert!(
                        name == json!("fake") || (c.recorded && name == json!("recorded")),
                        "initialize answered by nobody real: {a}"
                    );
                    h.initialized();
                    let list = h.request("tools/list", json!({}));
                    let call = h.call("list_items");
                    HostState::Listed { list, call }
                }
                Some(a) => HostState::Refused(a, now),
                None => {
                    assert!(
                        now - sent < INITIALIZE_TIMEOUT_MS,
                        "initialize unanswered for the host's whole connect timeout: {c:?}"
                    );
                    HostState::Initializing { id, sent }
                }
            },
            other => other,
        };
        h.advance(TICK);
        now += TICK;
    }
    if let Some(at) = probe_answered_at {
        assert!(
            at <= DEFAULT_DISCOVER_WAIT.as_millis() as u64 + TICK,
            "the probe was answered at {at} ms, after the host may have given up: {c:?}"
        );
    }
    if let Some(id) = &probe_id {
        assert!(h.answer(id).is_some(), "the probe is answered");
    }
    let closed = h.io().host_closed;
    if closed {
        assert!(
            c.recorded && c.server_version.is_some() && !modern,
            "only a recorded answer that the new build contradicts closes the connection: {c:?} {:?}",
            h.io().status
        );
        return;
    }
    // Every started server was initialized before anything else, once the host had said
    // which era it speaks.
    let epoch = h.current_epoch().expect("the fixed build serves");
    let first = h
        .server_saw_in
        .iter()
        .find(|(e, _)| *e == epoch)
        .map(|(_, m)| m.clone());
    match &state {
        HostState::Listed { list, call } => {
            assert!(
                matches!(first.as_deref(), Some("initialize" | "server/discover")),
                "the server's first message is a handshake: {c:?}: {:?}",
                h.server_saw_in
            );
            if !modern {
                assert!(
                    h.server_saw_in
                        .iter()
                        .any(|(e, m)| *e == epoch && m == "initialize"),
                    "a legacy host's server is sent its initialize: {c:?}: {:?}",
                    h.server_saw_in
                );
            }
            let list = h.answer(list).expect("the list is answered");
            if list.get("result").is_some() {
                assert_eq!(Harness::names(&list).len(), 2, "{list}");
            }
            let call = h.answer(call).expect("the call is answered");
            // Once the build is done, a list and a call get the server's real answers.
            let list2 = if modern {
                h.request("tools/list", modern_meta())
            } else {
                h.request("tools/list", json!({}))
            };
            let list2 = h.answer(&list2).expect("answered by the server");
            assert_eq!(Harness::names(&list2).len(), 2, "{c:?}: {list2}");
            let _ = call;
        }
        HostState::Refused(a, at) => {
            if std::env::var_os("DEBUG_FC").is_some() {
                {
                    let saw = h.server_saw_in.clone();
                    let io = h.io();
                    eprintln!(
                        "status: {:#?}\nserver saw: {:?}\nhost got: {:#?}",
                        io.status, saw, io.to_host
                    );
                }
            }
            // Honest only when no server of this session could answer within the budget.
            let served_from = if c.broken_first { fixed_at } else { c.build_at };
            assert!(
                *at <= served_from,
                "initialize refused at {at} ms although a server was up from {served_from} ms: {c:?} {a}"
            );
            let data = &a["error"]["data"]["error"];
            assert!(
                *data == json!("server_building") || *data == json!("build_failed"),
                "{c:?}: {a}"
            );
            assert!(
                !c.recorded || c.broken_first,
                "a record was there to answer: {c:?} {a}"
            );
        }
        other => panic!("the host is left in {other:?}: {c:?}"),
    }
    if std::env::var_os("DEBUG_FC").is_some() {
        {
            let saw = h.server_saw_in.clone();
            let io = h.io();
            eprintln!(
                "status: {:#?}\nserver saw: {:?}\nhost got: {:#?}",
                io.status, saw, io.to_host
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]
    #[test]
    fn every_start_state_gives_the_host_real_answers_in_time(c in case()) {
        run(&c);
    }
}

/// The interleaving of issue 33's flow 1, fixed: probe at 0, fallback at 3 s, build at 15 s.
#[test]
fn the_issue_33_flow_1_interleaving() {
    run(&Case {
        probe: true,
        warm: true,
        recorded: true,
        server_version: None,
        build_at: 15_000,
        broken_first: false,
        fix_after: 0,
        fallback_delay: 0,
        probe_timeout: PROBE_TIMEOUT_MS,
    });
}

/// A host that gives up on its probe just before the server answers it: its `initialize`
/// reaches that server (as on a direct connection), never a wait for a server that is up.
#[test]
fn an_initialize_after_an_abandoned_probe_reaches_the_server() {
    run(&Case {
        probe: true,
        warm: false,
        recorded: false,
        server_version: None,
        build_at: 600,
        broken_first: false,
        fix_after: 0,
        fallback_delay: 0,
        probe_timeout: 500,
    });
}

/// A host that gives up on its probe before the discover wait: its `initialize` arrives while
/// the probe is held, and the probe's refusal must not undo the era it chose.
#[test]
fn a_fallback_before_the_probes_refusal_keeps_the_hosts_era() {
    run(&Case {
        probe: true,
        warm: true,
        recorded: false,
        server_version: None,
        build_at: 3_000,
        broken_first: false,
        fix_after: 0,
        fallback_delay: 0,
        probe_timeout: 500,
    });
}
