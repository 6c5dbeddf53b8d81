//! `subscriptions/listen` (2026-07-28) through the supervisor: tool-list changes are the
//! supervisor's to announce, every other category is the server's, and an rmcp server that does
//! not serve listen at all (its default) must not cost a modern host its list_changed.

use serde_json::{Value, json};

use super::testing::*;
use super::*;

const ACK: &str = "notifications/subscriptions/acknowledged";
const LIST_CHANGED: &str = "notifications/tools/list_changed";

pub(super) fn meta() -> Value {
    json!({protocol::PROTOCOL_VERSION: protocol::MODERN_VERSION,
           protocol::CLIENT_CAPABILITIES: {}})
}

fn listen_params(notifications: Value) -> Value {
    json!({"_meta": meta(), "notifications": notifications})
}

/// A warm modern session whose first server (`a`) is up and was discovered.
fn modern_session() -> Harness {
    let mut h = Harness::ungated(|c| c.warm = true);
    let d = h.request("server/discover", json!({"_meta": meta()}));
    h.build(complete("a"));
    assert!(h.answer(&d).unwrap().get("result").is_some());
    h
}

/// Host notifications named `method`, in order.
fn notes(h: &mut Harness, method: &str) -> Vec<Value> {
    h.io()
        .to_host
        .iter()
        .filter(|m| m["method"] == json!(method))
        .cloned()
        .collect()
}

fn position(h: &mut Harness, pred: impl Fn(&Value) -> bool) -> Option<usize> {
    h.io().to_host.iter().position(pred)
}

/// The server rebuilt with a changed `write_item`; returns once the new one serves.
fn rebuild_with_changed_tools(h: &mut Harness, exe: &str, version: u32) {
    let old = h.current_epoch().unwrap();
    h.tools = vec![tool("list_items", 1), tool("write_item", version)];
    h.build(complete(exe));
    h.handle(Event::ChildStopped { epoch: old.clone() });
    h.serve();
    let new = h.current_epoch().expect("a new server");
    assert_ne!(new, old);
}

fn sid(note: &Value) -> Value {
    note["params"]["_meta"][protocol::SUBSCRIPTION_ID].clone()
}

fn server_listens(h: &Harness) -> usize {
    h.server_saw
        .iter()
        .filter(|m| *m == "subscriptions/listen")
        .count()
}

#[test]
fn a_tools_only_stream_is_served_by_the_supervisor_even_when_the_server_refuses_listen() {
    let mut h = modern_session();
    let l = h.request(
        "subscriptions/listen",
        listen_params(json!({"toolsListChanged": true})),
    );
    assert_eq!(h.answer(&l), None, "an open stream has no response");
    let acks = notes(&mut h, ACK);
    assert_eq!(acks.len(), 1, "{acks:?}");
    assert_eq!(sid(&acks[0]), l);
    assert_eq!(
        acks[0]["params"]["notifications"],
        json!({"toolsListChanged": true})
    );
    assert_eq!(server_listens(&h), 0, "the server has no part in it");

    let list = h.request("tools/list", json!({"_meta": meta()}));
    assert_eq!(Harness::names(&h.answer(&list).unwrap()).len(), 2);
    rebuild_with_changed_tools(&mut h, "b", 2);
    let changed = notes(&mut h, LIST_CHANGED);
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert_eq!(sid(&changed[0]), l, "tagged with the host's listen id");
    assert_eq!(
        server_listens(&h),
        0,
        "nothing to re-open at the new server"
    );
    assert_eq!(h.answer(&l), None, "the stream survives the restart");

    // The host ends the stream: later changes are not sent on it.
    h.host(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": l}}),
    );
    rebuild_with_changed_tools(&mut h, "c", 3);
    assert_eq!(notes(&mut h, LIST_CHANGED).len(), 1);
    assert_eq!(h.answer(&l), None, "a cancelled request is not answered");
}

#[test]
fn a_stream_opened_before_any_server_is_acknowledged_and_told_of_later_changes() {
    // A modern host that reused its probe's discover answer opens its stream first thing.
    let mut h = Harness::ungated(|_| {});
    let l = h.request(
        "subscriptions/listen",
        listen_params(json!({"toolsListChanged": true})),
    );
    assert_eq!(notes(&mut h, ACK).len(), 1, "ours to acknowledge at once");
    let list = h.request("tools/list", json!({"_meta": meta()}));
    assert_eq!(
        h.answer(&list),
        None,
        "the list still waits for a real server"
    );
    h.build(complete("a"));
    assert_eq!(Harness::names(&h.answer(&list).unwrap()).len(), 2);
    assert_eq!(
        notes(&mut h, LIST_CHANGED).len(),
        0,
        "the host holds the first real list"
    );
    rebuild_with_changed_tools(&mut h, "b", 2);
    let changed = notes(&mut h, LIST_CHANGED);
    assert_eq!(changed.len(), 1);
    assert_eq!(sid(&changed[0]), l);
}

#[test]
fn a_mixed_stream_goes_to_the_server_and_its_ack_adds_tool_changes() {
    let mut h = modern_session();
    h.listen = ListenReply::Acknowledge(json!({"promptsListChanged": true}));
    let l = h.request(
        "subscriptions/listen",
        listen_params(json!({"toolsListChanged": true, "promptsListChanged": true})),
    );
    assert_eq!(server_listens(&h), 1);
    let acks = notes(&mut h, ACK);
    assert_eq!(acks.len(), 1);
    assert_eq!(sid(&acks[0]), l, "re-tagged with the host's id");
    assert_eq!(
        acks[0]["params"]["notifications"],
        json!({"promptsListChanged": true, "toolsListChanged": true})
    );
    let list = h.request("tools/list", json!({"_meta": meta()}));
    assert!(h.answer(&list).is_some());
    rebuild_with_changed_tools(&mut h, "b", 2);
    assert_eq!(server_listens(&h), 2, "re-opened at the new server");
    assert_eq!(notes(&mut h, ACK).len(), 1, "the host is acknowledged once");
    let changed = notes(&mut h, LIST_CHANGED);
    assert_eq!(changed.len(), 1);
    assert_eq!(sid(&changed[0]), l);
    let ack_at = position(&mut h, |m| m["method"] == json!(ACK)).unwrap();
    let changed_at = position(&mut h, |m| m["method"] == json!(LIST_CHANGED)).unwrap();
    assert!(ack_at < changed_at, "the acknowledgement comes first");
}

#[test]
fn a_mixed_stream_the_server_refuses_keeps_its_tool_part() {
    let mut h = modern_session();
    let l = h.request(
        "subscriptions/listen",
        listen_params(json!({"toolsListChanged": true, "resourcesListChanged": true})),
    );
    assert_eq!(server_listens(&h), 1, "the server was asked");
    assert_eq!(h.answer(&l), None, "its refusal is not the host's answer");
    let acks = notes(&mut h, ACK);
    assert_eq!(acks.len(), 1);
    assert_eq!(
        acks[0]["params"]["notifications"],
        json!({"toolsListChanged": true}),
        "honoured: what the supervisor serves, nothing the server refused"
    );
    let list = h.request("tools/list", json!({"_meta": meta()}));
    assert!(h.answer(&list).is_some());
    rebuild_with_changed_tools(&mut h, "b", 2);
    assert_eq!(server_listens(&h), 1, "not re-sent to the new server");
    assert_eq!(notes(&mut h, LIST_CHANGED).len(), 1);
}

#[test]
fn a_stream_without_tool_changes_gets_the_servers_refusal() {
    let mut h = modern_session();
    let l = h.request(
        "subscriptions/listen",
        listen_params(json!({"promptsListChanged": true})),
    );
    let a = h.answer(&l).expect("the server's answer");
    assert_eq!(a["error"]["code"], json!(-32601));
    assert_eq!(notes(&mut h, ACK).len(), 0);
    assert!(h.s.host.listens.is_empty());
}

#[test]
fn listen_streams_are_bounded_and_ids_unique() {
    let mut h = modern_session();
    let first = h.request(
        "subscriptions/listen",
        listen_params(json!({"toolsListChanged": true})),
    );
    h.host(
        json!({"jsonrpc": "2.0", "id": first, "method": "subscriptions/listen",
                  "params": listen_params(json!({"toolsListChanged": true}))}),
    );
    let dup = h
        .answer(&first)
        .expect("a second stream under the same id is refused");
    assert_eq!(dup["error"]["code"], json!(-32600));
    for _ in 1..LISTEN_LIMIT {
        h.request(
            "subscriptions/listen",
            listen_params(json!({"toolsListChanged": true})),
        );
    }
    assert_eq!(h.s.host.listens.len(), LISTEN_LIMIT);
    let over = h.request(
        "subscriptions/listen",
        listen_params(json!({"toolsListChanged": true})),
    );
    let a = h.answer(&over).expect("refused");
    assert_eq!(a["error"]["code"], json!(-32600));
    assert!(
        a["error"]["message"]
            .as_str()
            .unwrap()
            .contains("subscriptions/listen")
    );
    assert_eq!(h.s.host.listens.len(), LISTEN_LIMIT);
}

/// A modern host's stream asks for tool and prompt changes; the first server honours prompts
/// (its acknowledgement, re-tagged, tells the host so). After a rebuild the stream is reopened
/// at the new server, which does not serve `subscriptions/listen` (rmcp's default): the host is
/// acknowledged again with the supervisor's part only (tool changes). Red-team round 21: the
/// refusal was absorbed and the host kept an acknowledgement saying prompt changes flow.
#[test]
fn a_reopened_stream_the_new_server_refuses_is_acknowledged_again_for_tools_only() {
    let mut h = Harness::ungated(|c| c.warm = true);
    let d = h.request("server/discover", json!({"_meta": meta()}));
    h.build(complete("a"));
    assert!(h.answer(&d).unwrap().get("result").is_some());
    h.listen = ListenReply::Acknowledge(json!({"promptsListChanged": true}));
    let l = h.request(
        "subscriptions/listen",
        json!({"_meta": meta(),
               "notifications": {"toolsListChanged": true, "promptsListChanged": true}}),
    );
    let ack_of = |h: &mut Harness| {
        h.io()
            .to_host
            .iter()
            .rfind(|m| {
                m["method"] == json!(ACK) && m["params"]["_meta"][protocol::SUBSCRIPTION_ID] == l
            })
            .cloned()
    };
    assert_eq!(
        ack_of(&mut h).unwrap()["params"]["notifications"]["promptsListChanged"],
        json!(true)
    );
    // The next server does not serve listen.
    h.listen = ListenReply::Refuse;
    let old = h.current_epoch().unwrap();
    h.build(complete("b"));
    h.handle(Event::ChildStopped { epoch: old });
    h.serve();
    assert!(
        h.server_saw
            .iter()
            .filter(|m| *m == "subscriptions/listen")
            .count()
            >= 2
    );
    let ended = h.answer(&l).is_some()
        || h.io().to_host.iter().any(|m| {
            m["method"] == json!("notifications/cancelled") && m["params"]["requestId"] == l
        });
    let still_claimed =
        ack_of(&mut h).unwrap()["params"]["notifications"]["promptsListChanged"] == json!(true);
    assert!(
        ended || !still_claimed,
        "the host still holds an acknowledgement that prompt changes flow on stream {l}, which \
         the running server refused"
    );
}
