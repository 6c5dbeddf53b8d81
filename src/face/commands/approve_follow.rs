//! `cargo mcp-dev approve --follow`: the terminal inbox. Stays open, shows each call waiting
//! for a grant as it arrives (the same review as `approve`, plus the call's arguments), and
//! takes one key per decision. Every decision is sent bound to the epoch that was shown; a
//! rebuild while a request is on screen voids it (the supervisor re-checks, and the inbox
//! redraws). Refuses without a terminal: a decision needs a person.
//!
//! Owns: the inbox loop and its keys. Must not touch: the grant rules (the supervisor's gate).

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::approve::{call_review, review, strings};
use super::control_client;
use crate::base::error::{CmdResult, Failure};
use crate::face::cli::{ApproveArgs, ControlArgs};
use crate::{base::exit_codes, screen::sanitize, screen::stderr};

/// How many decided requests the inbox remembers (the supervisor lists at most 10 at a time).
const SEEN: usize = 256;

/// How often the inbox asks the supervisor for news.
const POLL: Duration = Duration::from_millis(400);

/// One decision key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Once,
    Tool,
    AllRequested,
    Deny,
    Quit,
}

fn key_of(c: char) -> Option<Key> {
    match c.to_ascii_lowercase() {
        'o' => Some(Key::Once),
        't' => Some(Key::Tool),
        'a' => Some(Key::AllRequested),
        'd' | 'n' => Some(Key::Deny),
        'q' => Some(Key::Quit),
        _ => None,
    }
}

pub fn execute(args: &ApproveArgs) -> CmdResult {
    if !std::io::stdin().is_terminal() || !std::io::stderr().is_terminal() {
        return Err(Failure::new(
            exit_codes::USAGE,
            "approve --follow needs a terminal (stdin and stderr): it asks a person one key per decision; in scripts use `approve --call ID --yes` or `approve --yes --tool NAME`",
        ));
    }
    let (socket, label) = control_client::locate(&args.control)?;
    let control = ControlArgs {
        socket: Some(socket),
        label: Some(label),
        ..args.control.clone()
    };
    let _restore = crate::base::sys::unix::TerminalModes::save();
    let keys = key_reader();
    let st = control_client::call(&control, &json!({"op": "status"}))?;
    stderr::raw(&format!(
        "{} `{}` (agent run {}): waiting for calls that need a grant.\nKeys: o = only this call, t = the tool until the next rebuild, a = every requested tool until the next rebuild, d = decline, q = quit\n",
        console::style("Following approvals for").bold(),
        sanitize::review(st["label"].as_str().unwrap_or("?")),
        sanitize::review(st["agentRun"].as_str().unwrap_or("?")),
    ));
    // Requests already decided in this inbox (callId, digest, epoch), the newest SEEN.
    let mut seen: std::collections::VecDeque<(String, String, String)> =
        std::collections::VecDeque::new();
    loop {
        let st = control_client::call(&control, &json!({"op": "status"}))?;
        let Some(epoch) = st.pointer("/server/epoch").and_then(Value::as_str) else {
            if wait_key(&keys, POLL) == Some(Key::Quit) {
                return Ok(exit_codes::OK);
            }
            continue;
        };
        let epoch = epoch.to_string();
        let waiting = st["deniedCalls"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .rev()
            .find(|c| c["epoch"] == json!(epoch) && !seen.contains(&id_of(c, &epoch)));
        let Some(call) = waiting else {
            if wait_key(&keys, POLL) == Some(Key::Quit) {
                return Ok(exit_codes::OK);
            }
            continue;
        };
        let id = id_of(&call, &epoch);
        let shown = control_client::call(
            &control,
            &json!({"op": "deniedCall", "callId": call["callId"]}),
        )
        .unwrap_or(call.clone());
        let tool = shown["tool"].as_str().unwrap_or("").to_string();
        let tools: BTreeSet<String> = [tool.clone()].into();
        let scopes: BTreeSet<String> = strings(&st["toolPolicy"][&tool]["credentialScopes"])
            .into_iter()
            .collect();
        let mut text = format!(
            "\n{}\n",
            console::style("A call needs a grant").bold().yellow()
        );
        text.push_str(&review(&st, &epoch, &tools, &scopes));
        text.push_str(&call_review(&shown));
        let requested = strings(&st["pendingApproval"]["tools"]);
        let mut all: BTreeSet<String> = requested.iter().cloned().collect();
        all.insert(tool.clone());
        text.push_str(&format!(
            "  requested tools: {}\n[o] only this call  [t] {} until the next rebuild  [a] {} until the next rebuild  [d] decline  [q] quit\n",
            sanitize::review(&requested.join(", ")),
            sanitize::review(&tool),
            sanitize::review(&all.iter().cloned().collect::<Vec<_>>().join(", "))
        ));
        stderr::raw(&text);
        let drawn = Instant::now();
        // One key, pressed after the request was drawn; meanwhile a rebuild voids it.
        let key = loop {
            if let Some(k) = wait_key_after(&keys, POLL, Some(drawn)) {
                break Some(k);
            }
            let now = control_client::call(&control, &json!({"op": "status"}))?;
            if now.pointer("/server/epoch").and_then(Value::as_str) != Some(epoch.as_str()) {
                stderr::line("the server was rebuilt: the request on screen is void");
                break None;
            }
        };
        let Some(key) = key else { continue };
        if seen.len() == SEEN {
            seen.pop_front();
        }
        seen.push_back(id);
        let request = match key {
            Key::Quit => return Ok(exit_codes::OK),
            Key::Deny => {
                stderr::line("declined: nothing granted (the call stays refused)");
                continue;
            }
            Key::Once => json!({"op": "approveCall", "epoch": epoch, "callId": shown["callId"],
                                "tool": shown["tool"], "argumentsDigest": shown["argumentsDigest"]}),
            Key::Tool => json!({"op": "approve", "epoch": epoch, "tools": [tool],
                                "credentialScopes": scopes}),
            Key::AllRequested => {
                let mut tools: BTreeSet<String> = requested.into_iter().collect();
                tools.insert(tool.clone());
                let scopes: BTreeSet<String> = tools
                    .iter()
                    .flat_map(|t| strings(&st["toolPolicy"][t]["credentialScopes"]))
                    .collect();
                json!({"op": "approve", "epoch": epoch, "tools": tools, "credentialScopes": scopes})
            }
        };
        match control_client::call(&control, &request) {
            Ok(r) => {
                let g = &r["grant"];
                stderr::line(&format!(
                    "approved: {} for epoch {} (grant {}, {})",
                    sanitize::review(&strings(&g["toolScope"]).join(", ")),
                    g["executionEpoch"].as_str().unwrap_or("?"),
                    g["id"].as_str().unwrap_or("?"),
                    super::approve::grant_lifetime(g)
                ));
            }
            Err(e) => stderr::line(&format!("not granted: {}", e.message)),
        }
    }
}

fn id_of(call: &Value, epoch: &str) -> (String, String, String) {
    (
        call["callId"].as_str().unwrap_or("").to_string(),
        call["argumentsDigest"].as_str().unwrap_or("").to_string(),
        epoch.to_string(),
    )
}

/// Keys from the terminal, one at a time (raw mode only while a key is read), each with when it
/// was read.
fn key_reader() -> crossbeam_channel::Receiver<(Key, Instant)> {
    let (tx, rx) = crossbeam_channel::bounded(16);
    std::thread::spawn(move || {
        let term = console::Term::stderr();
        loop {
            match term.read_key() {
                Ok(console::Key::Char(c)) => {
                    if let Some(k) = key_of(c)
                        && (tx.send((k, Instant::now())).is_err() || k == Key::Quit)
                    {
                        return; // out of raw mode before the inbox exits
                    }
                }
                Ok(console::Key::CtrlC) | Err(_) => {
                    let _ = tx.send((Key::Quit, Instant::now()));
                    return;
                }
                Ok(_) => {}
            }
        }
    });
    rx
}

fn wait_key(keys: &crossbeam_channel::Receiver<(Key, Instant)>, within: Duration) -> Option<Key> {
    wait_key_after(keys, within, None)
}

/// The next key read after `drawn` (the request it decides was on screen): a key typed ahead
/// (a double press on the previous request) never decides a request the human has not seen.
/// `q` counts whenever it was pressed.
fn wait_key_after(
    keys: &crossbeam_channel::Receiver<(Key, Instant)>,
    within: Duration,
    drawn: Option<Instant>,
) -> Option<Key> {
    let deadline = Instant::now() + within;
    loop {
        let (key, at) = keys.recv_deadline(deadline).ok()?;
        if key == Key::Quit || drawn.is_none_or(|drawn| at >= drawn) {
            return Some(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_typed_before_the_draw_decides_nothing_but_quit_always_counts() {
        let (tx, rx) = crossbeam_channel::bounded(16);
        let before = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        let drawn = Instant::now();
        tx.send((Key::Once, before)).unwrap();
        let short = Duration::from_millis(50);
        assert_eq!(wait_key_after(&rx, short, Some(drawn)), None, "typed ahead");
        tx.send((Key::Tool, before)).unwrap();
        tx.send((Key::Deny, drawn)).unwrap();
        assert_eq!(wait_key_after(&rx, short, Some(drawn)), Some(Key::Deny));
        tx.send((Key::Quit, before)).unwrap();
        assert_eq!(wait_key_after(&rx, short, Some(drawn)), Some(Key::Quit));
        tx.send((Key::Once, before)).unwrap();
        assert_eq!(wait_key(&rx, short), Some(Key::Once), "no screen: any key");
    }

    #[test]
    fn keys_map_to_decisions() {
        assert_eq!(key_of('o'), Some(Key::Once));
        assert_eq!(key_of('T'), Some(Key::Tool));
        assert_eq!(key_of('a'), Some(Key::AllRequested));
        assert_eq!(key_of('d'), Some(Key::Deny));
        assert_eq!(key_of('q'), Some(Key::Quit));
        assert_eq!(key_of('y'), None, "no key grants by accident");
        assert_eq!(key_of('\r'), None);
    }
}
