//! A raw newline-delimited JSON-RPC client for driving `cargo-mcp-dev run` as an MCP host would.
//!
//! Owns the host side of the wire only: building request lines with ids given as exact JSON text,
//! reading the supervisor's stdout on a thread, and waiting for a response by raw id or a
//! notification by method. It keeps ids as raw text, so `0`, `"0"` and `1.0` stay distinct. It
//! knows nothing about processes (see `session.rs`).
#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader, Read};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, unbounded};
use serde_json::Value;
use serde_json::value::RawValue;

/// One message from the supervisor's stdout.
#[derive(Debug, Clone)]
pub struct Msg {
    /// The line as received, without its terminator.
    pub raw: String,
    pub value: Value,
    /// The `id` member as exact JSON text (`None` when absent).
    pub id: Option<String>,
}

impl Msg {
    pub fn parse(line: &str) -> Result<Msg, String> {
        let fields: std::collections::BTreeMap<String, Box<RawValue>> =
            serde_json::from_str(line).map_err(|e| e.to_string())?;
        let value: Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
        Ok(Msg {
            raw: line.to_string(),
            id: fields.get("id").map(|r| r.get().to_string()),
            value,
        })
    }

    pub fn method(&self) -> Option<&str> {
        self.value.get("method").and_then(Value::as_str)
    }

    pub fn is_response(&self) -> bool {
        self.method().is_none()
            && (self.value.get("result").is_some() || self.value.get("error").is_some())
    }

    pub fn is_notification(&self) -> bool {
        self.method().is_some() && self.id.as_deref().is_none_or(|i| i == "null")
    }

    pub fn is_request(&self) -> bool {
        self.method().is_some() && self.id.as_deref().is_some_and(|i| i != "null")
    }

    /// `result`, panicking (with the message) if this is an error response.
    #[track_caller]
    pub fn result(&self) -> &Value {
        self.value
            .get("result")
            .unwrap_or_else(|| panic!("expected a result, got {}", self.raw))
    }

    /// `error`, panicking if this is not an error response.
    #[track_caller]
    pub fn error(&self) -> &Value {
        self.value
            .get("error")
            .unwrap_or_else(|| panic!("expected an error, got {}", self.raw))
    }

    /// For a denied or failed `tools/call`: the machine-readable payload in `content[0].text`,
    /// after checking it equals `_meta["dev.cargo-mcp-dev/error"]` and `isError` is true.
    #[track_caller]
    pub fn tool_error_payload(&self) -> Value {
        let r = self.result();
        assert_eq!(
            r["isError"],
            Value::Bool(true),
            "not a tool error: {}",
            self.raw
        );
        let text = r["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("content[0].text missing: {}", self.raw));
        let payload: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("content[0].text is not JSON ({e}): {}", self.raw));
        assert_eq!(
            r["_meta"]["dev.cargo-mcp-dev/error"], payload,
            "_meta error differs from content[0].text: {}",
            self.raw
        );
        assert!(
            r["content"][1]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty()),
            "content[1] must be a human sentence: {}",
            self.raw
        );
        payload
    }
}

/// What the reader thread saw.
#[derive(Debug)]
pub enum Line {
    Msg(Msg),
    /// A stdout line that is not JSON (never allowed on the host's wire).
    NotJson(String),
    Eof,
}

/// Reads newline-delimited messages from `out` on a thread.
pub fn spawn_reader(out: impl Read + Send + 'static) -> Receiver<Line> {
    let (tx, rx) = unbounded();
    std::thread::Builder::new()
        .name("host-stdout".into())
        .spawn(move || {
            let mut reader = BufReader::with_capacity(1 << 16, out);
            loop {
                let mut buf = Vec::new();
                match reader.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(Line::Eof);
                        return;
                    }
                    Ok(_) => {}
                }
                while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    buf.pop();
                }
                let text = String::from_utf8_lossy(&buf).into_owned();
                let line = match Msg::parse(&text) {
                    Ok(m) => Line::Msg(m),
                    Err(_) => Line::NotJson(text),
                };
                if tx.send(line).is_err() {
                    return;
                }
            }
        })
        .expect("spawn stdout reader");
    rx
}

/// The host's view of its stdin: messages received so far and not yet claimed by a wait.
pub struct Inbox {
    rx: Receiver<Line>,
    unclaimed: Vec<Msg>,
    /// Every message ever received, in order (claimed or not).
    pub all: Vec<Msg>,
    pub not_json: Vec<String>,
    pub eof: bool,
}

impl Inbox {
    pub fn new(rx: Receiver<Line>) -> Inbox {
        Inbox {
            rx,
            unclaimed: Vec::new(),
            all: Vec::new(),
            not_json: Vec::new(),
            eof: false,
        }
    }

    /// Receives one line, waiting until `deadline`. False on timeout or EOF.
    fn pump(&mut self, deadline: Instant) -> bool {
        if self.eof {
            return false;
        }
        match self
            .rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            Ok(Line::Msg(m)) => {
                self.all.push(m.clone());
                self.unclaimed.push(m);
                true
            }
            Ok(Line::NotJson(t)) => {
                self.not_json.push(t);
                true
            }
            Ok(Line::Eof) | Err(RecvTimeoutError::Disconnected) => {
                self.eof = true;
                false
            }
            Err(RecvTimeoutError::Timeout) => false,
        }
    }

    /// The first unclaimed message matching `pred`, waiting until `deadline`.
    pub fn take(&mut self, deadline: Instant, pred: impl Fn(&Msg) -> bool) -> Option<Msg> {
        loop {
            if let Some(i) = self.unclaimed.iter().position(&pred) {
                return Some(self.unclaimed.remove(i));
            }
            if self.eof || Instant::now() >= deadline {
                return None;
            }
            self.pump(deadline);
        }
    }

    /// The response whose id is exactly `id` (JSON text).
    pub fn response(&mut self, id: &str, deadline: Instant) -> Option<Msg> {
        self.take(deadline, |m| m.is_response() && m.id.as_deref() == Some(id))
    }

    pub fn notification(&mut self, method: &str, deadline: Instant) -> Option<Msg> {
        self.take(deadline, |m| {
            m.is_notification() && m.method() == Some(method)
        })
    }

    /// Everything that arrives within `quiet` (for "nothing else was sent" checks).
    pub fn drain_for(&mut self, quiet: Duration) -> Vec<Msg> {
        let deadline = Instant::now() + quiet;
        while Instant::now() < deadline && self.pump(deadline) {}
        std::mem::take(&mut self.unclaimed)
    }

    /// Unclaimed messages so far (without waiting).
    pub fn pending(&mut self) -> &[Msg] {
        while let Ok(l) = self.rx.try_recv() {
            match l {
                Line::Msg(m) => {
                    self.all.push(m.clone());
                    self.unclaimed.push(m);
                }
                Line::NotJson(t) => self.not_json.push(t),
                Line::Eof => self.eof = true,
            }
        }
        &self.unclaimed
    }

    /// Waits for end of stream (the supervisor closed its stdout).
    pub fn wait_eof(&mut self, deadline: Instant) -> bool {
        while !self.eof && Instant::now() < deadline {
            self.pump(deadline);
        }
        self.eof
    }
}

/// `{"jsonrpc":"2.0","id":<id>,"method":…,"params":…}` with `id` inserted as raw JSON text.
pub fn request(id: &str, method: &str, params: Option<&Value>) -> String {
    let method = serde_json::to_string(method).expect("string");
    match params {
        Some(p) => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":{method},"params":{p}}}"#),
        None => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":{method}}}"#),
    }
}

pub fn notification(method: &str, params: Option<&Value>) -> String {
    let method = serde_json::to_string(method).expect("string");
    match params {
        Some(p) => format!(r#"{{"jsonrpc":"2.0","method":{method},"params":{p}}}"#),
        None => format!(r#"{{"jsonrpc":"2.0","method":{method}}}"#),
    }
}

/// A response to a server-to-host request (id as raw JSON text).
pub fn response(id: &str, result: &Value) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#)
}
