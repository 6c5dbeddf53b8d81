//! First contact under random interleavings (the red team's fuzz of issue 33's change): a probe,
//! one or two `initialize`s (two versions), `initialized`, lists and calls, good and broken
//! builds, crashes, silent servers and servers that refuse the handshake, in the supervise,
//! manual and disconnect modes. Checked: at most one answer per request and every request
//! answered in the end; every `initialize` result from a real server or the record of the same
//! version; our refusal of the probe within a second; every server's first message a handshake,
//! and the serving server initialized. It found the forwarded `initialize` answered twice (the
//! record at its deadline, then `epoch_transition` when its server exited), which is why that
//! request holds no host id (`OpenRequest::ForwardedInitialize`).

use proptest::prelude::*;
use serde_json::{Value, json};

use super::testing::*;
use super::*;

const V: &str = "2025-06-18";

#[derive(Debug, Clone)]
enum Ev {
    Probe,
    Init(bool),
    Initialized,
    List,
    Call,
    Build(u8),
    Broken,
    Crash,
    Advance(u64),
    Silent(bool),
    RefuseHandshake,
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        Just(Ev::Probe),
        any::<bool>().prop_map(Ev::Init),
        Just(Ev::Initialized),
        Just(Ev::List),
        Just(Ev::Call),
        (0u8..3).prop_map(Ev::Build),
        Just(Ev::Broken),
        Just(Ev::Crash),
        (1u64..80).prop_map(|t| Ev::Advance(t * 100)),
        any::<bool>().prop_map(Ev::Silent),
        Just(Ev::RefuseHandshake),
    ]
}

struct Run {
    h: Harness,
    silent: bool,
    saw: Vec<(String, Value)>,
    ids: Vec<(Value, String)>,
    next: i64,
    stopped_seen: usize,
    probe: Option<(Value, u64)>,
    probe_late: Option<(u64, Value)>,
    versions: Vec<(Value, &'static str)>,
}

impl Run {
    fn check_probe(&mut self) {
        if let Some((id, at)) = self.probe.clone() {
            let now = self.h.io().now_ms;
            let got = self
                .h
                .io()
                .to_host
                .iter()
                .find(|m| m.get("id") == Some(&id) && m.get("method").is_none())
                .cloned();
            if let Some(a) = got {
                if a.get("error").is_some() && now > at + 1_000 && self.probe_late.is_none() {
                    self.probe_late = Some((now - at, a));
                }
                self.probe = None;
            }
        }
    }

    fn pump(&mut self) {
        self.check_probe();
        // deliver ChildStopped for stops
        loop {
            let stopped = self.h.io().stopped.clone();
            if self.stopped_seen >= stopped.len() {
                break;
            }
            let e = stopped[self.stopped_seen].clone();
            self.stopped_seen += 1;
            self.h.handle(Event::ChildStopped { epoch: e });
        }
        if self.silent {
            return;
        }
        let queued: Vec<(String, Value)> = self.h.io().to_child.iter().cloned().collect();
        self.saw.extend(queued);
        self.h.serve();
        let queued: Vec<(String, Value)> = self.h.io().to_child.iter().cloned().collect();
        self.saw.extend(queued);
    }

    fn send(&mut self, method: &str, params: Value) {
        let id = json!(self.next);
        self.next += 1;
        host_raw(
            &mut self.h,
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        );
        self.ids.push((id, method.to_string()));
        self.pump();
    }

    fn advance(&mut self, ms: u64) {
        let target = self.h.io().now_ms + ms;
        while let Some(timer) = self.h.io().take_due_timer(target) {
            self.h.handle(Event::Timer(timer));
            self.pump();
        }
        self.h.io().now_ms = target;
    }
}

fn run(recorded: bool, mode: u8, evs: Vec<Ev>) {
    let mut h = Harness::ungated(|c| {
        c.restart = [Restart::Supervise, Restart::Manual, Restart::Disconnect][mode as usize];
        if recorded {
            c.recorded = recorded_handshake(V, "recorded");
        }
    });
    h.next_host_id = 10_000;
    let mut r = Run {
        h,
        silent: false,
        saw: vec![],
        ids: vec![],
        next: 0,
        stopped_seen: 0,
        probe: None,
        probe_late: None,
        versions: vec![],
    };
    let meta = json!({"_meta": {protocol::PROTOCOL_VERSION: protocol::MODERN_VERSION}});
    let mut inits = 0;
    let mut probes = 0;
    for e in evs {
        if r.h.io().host_closed {
            break;
        }
        match e {
            Ev::Probe if probes == 0 && inits == 0 => {
                probes += 1;
                let now = r.h.io().now_ms;
                r.probe = Some((json!(r.next), now));
                r.send("server/discover", meta.clone())
            }
            Ev::Init(other) if inits < 2 => {
                inits += 1;
                let v = if other { "2025-11-25" } else { V };
                r.versions.push((json!(r.next), v));
                r.send(
                    "initialize",
                    json!({"protocolVersion": v, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
                )
            }
            Ev::Initialized => {
                host_raw(
                    &mut r.h,
                    json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
                );
                r.pump();
            }
            Ev::List => r.send("tools/list", json!({})),
            Ev::Call => r.send("tools/call", json!({"name": "list_items", "arguments": {}})),
            Ev::Build(x) => {
                let exe = ["a", "b", "c"][x as usize];
                r.h.handle(Event::BuildFinished(Box::new(complete(exe))));
                r.pump();
            }
            Ev::Broken => {
                r.h.handle(Event::BuildFinished(Box::new(failed(None))));
                r.pump();
            }
            Ev::Crash => {
                if let Some(e) = r.h.current_epoch() {
                    r.h.handle(Event::ChildExited {
                        epoch: e,
                        exit: ExitInfo {
                            code: Some(1),
                            signal: None,
                        },
                    });
                    r.pump();
                }
            }
            Ev::Advance(ms) => r.advance(ms),
            Ev::Silent(s) => {
                r.silent = s;
                r.pump();
            }
            Ev::RefuseHandshake => {
                // the current server refuses whatever handshake is queued for it
                let cur = r.h.current_epoch();
                let q: Vec<(String, Value)> = r.h.io().to_child.drain(..).collect();
                for (e, m) in q {
                    r.saw.push((e.clone(), m.clone()));
                    let handshake = Some(&e) == cur.as_ref()
                        && m.get("id").is_some()
                        && (m["method"] == json!("initialize")
                            || m["method"] == json!("server/discover"));
                    if !handshake {
                        r.h.io().to_child.push_back((e, m));
                        continue;
                    }
                    r.h.server_saw_in
                        .push((e.clone(), m["method"].as_str().unwrap().to_string()));
                    {
                        from_child(
                            &mut r.h,
                            &e,
                            json!({"jsonrpc": "2.0", "id": m["id"], "error": {"code": -32601, "message": "no"}}),
                        );
                    }
                }
                r.pump();
            }
            _ => {}
        }
    }
    // finale: a good build, a serving server, a long time
    r.silent = false;
    if !r.h.io().host_closed {
        r.h.handle(Event::BuildFinished(Box::new(complete("z"))));
        r.pump();
    }
    for _ in 0..20 {
        r.advance(10_000);
        r.pump();
    }
    let closed = r.h.io().host_closed;
    // invariants
    if std::env::var_os("DBG").is_some() {
        eprintln!(
            "host got {:#?}\ntimers {:?}\nsaw {:?}\nstatus {:?}",
            r.h.io().to_host.clone(),
            r.h.io().timers.clone(),
            r.h.server_saw_in.clone(),
            r.h.io().status.clone()
        );
    }
    for (id, method) in r.ids.clone() {
        let a = r.h.answer(&id); // asserts at most once
        if a.is_none() && !closed {
            panic!("{method} {id} never answered; status {:?}", r.h.io().status);
        }
        if method == "initialize"
            && let Some(a) = &a
            && a.get("result").is_some()
        {
            let n = &a["result"]["serverInfo"]["name"];
            assert!(
                *n == json!("fake") || (recorded && *n == json!("recorded")),
                "{a}"
            );
            if *n == json!("recorded") {
                let asked = r.versions.iter().find(|(i, _)| *i == id).unwrap().1;
                assert_eq!(a["result"]["protocolVersion"], json!(asked), "{a}");
            }
        }
    }
    if let Some((late, a)) = &r.probe_late {
        panic!("probe refused by us {late} ms after it was sent: {a}");
    }
    if inits > 0
        && !closed
        && let Some(cur) = r.h.current_epoch()
    {
        assert!(
            r.h.server_saw_in
                .iter()
                .any(|(e, m)| *e == cur && m == "initialize"),
            "the serving server never got initialize: {:?} status {:?}",
            r.h.server_saw_in.clone(),
            r.h.io().status.clone()
        );
    }
    // Each epoch's first message is a handshake.
    let mut firsts: std::collections::HashMap<String, String> = Default::default();
    for (e, m) in r.h.server_saw_in.clone() {
        firsts.entry(e).or_insert(m);
    }
    for (e, m) in firsts {
        assert!(
            m == "initialize" || m == "server/discover",
            "epoch {e} first got {m}: {:?}",
            r.saw
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]
    #[test]
    fn first_contact_fuzz(recorded in any::<bool>(), mode in 0u8..3, evs in proptest::collection::vec(ev(), 1..40)) {
        run(recorded, mode, evs);
    }
}

#[test]
fn first_contact_fuzz_case1() {
    run(
        false,
        1,
        vec![
            Ev::Build(0),
            Ev::Probe,
            Ev::Silent(true),
            Ev::List,
            Ev::RefuseHandshake,
        ],
    );
}
