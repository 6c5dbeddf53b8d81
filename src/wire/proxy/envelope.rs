//! JSON-RPC envelopes: id, method and the raw bytes of everything else.
//!
//! A message is parsed only at its top level, without building a tree or copying members; a
//! forwarded message is the line as received, with only the members the supervisor rewrites (its
//! id, sometimes its params or result) spliced in place. A message that names a top-level member
//! twice is rebuilt with the last value (the one the supervisor judged), so a peer whose parser
//! keeps the first cannot act on a value nobody checked. Ids are kept as raw JSON text: `0`, `"0"` and `1.0` stay distinct and are
//! returned to their sender exactly as sent.

use std::collections::BTreeMap;

use serde_json::value::RawValue;

use super::scan;
use serde_json::{Value, json};

/// Source tag on every error cargo mcp-dev itself produces (`data.source`).
pub const SOURCE: &str = "cargo-mcp-dev";

/// A raw JSON-RPC id (exact text).
pub type RawId = Box<RawValue>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Request,
    Notification,
    Response,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EnvelopeError {
    #[error("not JSON: {0}")]
    NotJson(String),
    #[error("not a JSON-RPC 2.0 message: {0}")]
    NotJsonRpc(String),
    /// A message naming a `method` whose `id` is present but is not a valid request id
    /// (`null`, `true`, an object…). JSON-RPC 2.0: a request's id must be a string or a number;
    /// without an id member it would be a notification, but an explicit `"id": null` makes it
    /// an invalid request, never a notification. It must be answered with `-32600` and id
    /// `null` and never forwarded (a `tools/call` with `"id": null` used to reach the server
    /// ungated and unrecorded).
    #[error("invalid request: {method} has id {id}; a request id must be a string or a number")]
    InvalidRequestId {
        /// The method named by the message (already checked to be a string).
        method: String,
        /// The raw JSON text of the id (`null`, `true`, `{}`…).
        id: String,
    },
}

impl EnvelopeError {
    /// The JSON-RPC error code for answering a host that sent this.
    pub fn code(&self) -> i64 {
        match self {
            EnvelopeError::NotJson(_) => -32700,
            EnvelopeError::NotJsonRpc(_) | EnvelopeError::InvalidRequestId { .. } => -32600,
        }
    }

    /// The method of a message that named one but was not a valid request (see
    /// [`EnvelopeError::InvalidRequestId`]): the caller reports it ("dropped `tools/call` with
    /// id null") and answers `-32600` with id `null`.
    pub fn dropped_method(&self) -> Option<&str> {
        match self {
            EnvelopeError::InvalidRequestId { method, .. } => Some(method),
            _ => None,
        }
    }
}

/// Whether `method` may travel as a notification (a message without an id). MCP names every
/// notification `notifications/…`; anything else without an id (`tools/call`, `tools/list`…)
/// is a request that lost its id and must never be forwarded: it would run without an answer,
/// a gate decision or an audit record.
pub fn is_notification_method(method: &str) -> bool {
    method.starts_with("notifications/")
}

/// Whether a JSON id text is a valid JSON-RPC request id (a string or a number).
fn is_valid_id(raw: &str) -> bool {
    matches!(
        raw.as_bytes().first(),
        Some(b'"') | Some(b'-') | Some(b'0'..=b'9')
    )
}

/// One JSON-RPC message: the line as received (forwarded byte for byte unless the supervisor
/// edits a member), with where its members' values are.
#[derive(Debug, Clone)]
pub struct Message {
    /// The message without its `\n`. Edits splice the new value in place.
    text: String,
    id: Option<Span>,
    params: Option<Span>,
    result: Option<Span>,
    has_error: bool,
    /// The id as its own raw value (callers keep it to answer with).
    id_raw: Option<Box<RawValue>>,
    method: Option<String>,
    kind: Kind,
}

/// Byte range of a member's value in [`Message::text`].
type Span = std::ops::Range<usize>;

/// The raw JSON text of a member's value, borrowed from its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raw<'a>(&'a str);

impl<'a> Raw<'a> {
    pub fn get(&self) -> &'a str {
        self.0
    }
}

/// The top-level members the supervisor edits (see [`Message::splice`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Member {
    Id,
    Params,
    Result,
}

/// The members of a JSON object as borrowed raw values, in their order (no tree, no copies),
/// with keys read as `K` (a [`Member`] for a message's top level, a `String` elsewhere).
struct Members<'a, K>(Vec<(K, &'a RawValue)>);

impl<'de, K: serde::Deserialize<'de>> serde::Deserialize<'de> for Members<'de, K> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<K>(std::marker::PhantomData<K>);
        impl<'de, K: serde::Deserialize<'de>> serde::de::Visitor<'de> for V<K> {
            type Value = Members<'de, K>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Members<'de, K>, A::Error> {
                let mut members = Vec::with_capacity(5);
                while let Some(k) = map.next_key::<K>()? {
                    members.push((k, map.next_value::<&'de RawValue>()?));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// A message's top level as read: where the members the proxy reads are, whether one of them
/// was named twice, and whether it has an `error`. No list of every member: the others are
/// skipped as they are read.
#[derive(Default)]
struct TopLevel {
    jsonrpc: Option<Span>,
    id: Option<Span>,
    method: Option<Span>,
    params: Option<Span>,
    result: Option<Span>,
    has_error: bool,
    named_twice: bool,
}

impl TopLevel {
    fn read(text: &str) -> Result<TopLevel, scan::Invalid> {
        let mut top = TopLevel::default();
        scan::object_members(text, |name, value| {
            let slot = match &*name {
                "jsonrpc" => &mut top.jsonrpc,
                "id" => &mut top.id,
                "method" => &mut top.method,
                "params" => &mut top.params,
                "result" => &mut top.result,
                "error" => {
                    top.named_twice |= top.has_error;
                    top.has_error = true;
                    return;
                }
                _ => return,
            };
            top.named_twice |= slot.is_some();
            *slot = Some(value);
        })?;
        Ok(top)
    }
}

/// A line that is not a message: why, and the line back.
#[derive(Debug)]
pub struct Unreadable {
    pub error: EnvelopeError,
    pub line: Vec<u8>,
}

impl Message {
    pub fn parse(line: &[u8]) -> Result<Message, EnvelopeError> {
        Self::parse_owned(line.to_vec()).map_err(|u| u.error)
    }

    /// [`Message::parse`] of a line the caller gives up: its bytes become the message's text
    /// (no copy); a line that is not a message comes back with the reason.
    pub fn parse_owned(mut line: Vec<u8>) -> Result<Message, Unreadable> {
        // A raw `\r` can only be whitespace between tokens (inside strings it must be escaped),
        // but a peer reading with universal newlines (Python's stdio transport, Node's
        // `readline`) ends a line at it: a message forwarded byte for byte could carry a second
        // one nobody judged. It becomes a space (same length: no span moves; an ASCII byte for
        // an ASCII byte leaves UTF-8 as it was).
        if memchr::memchr(b'\r', &line).is_some() {
            for b in line.iter_mut().filter(|b| **b == b'\r') {
                *b = b' ';
            }
        }
        let text = match String::from_utf8(line) {
            Ok(text) => text,
            Err(e) => {
                return Err(Unreadable {
                    error: EnvelopeError::NotJson(format!("not UTF-8 ({})", e.utf8_error())),
                    line: e.into_bytes(),
                });
            }
        };
        let unreadable = |error: EnvelopeError, text: String| {
            Err(Unreadable {
                error,
                line: text.into_bytes(),
            })
        };
        let Ok(top) = TopLevel::read(&text) else {
            return unreadable(Self::not_an_object(text.as_bytes()), text);
        };
        if top.named_twice {
            // A member named twice: peers' parsers disagree on which one counts, so the
            // message is rebuilt with the last one (the one judged here) before it goes on.
            return match Self::parse_normalized(text.as_bytes()) {
                Ok(m) => Ok(m),
                Err(e) => unreadable(e, text),
            };
        }
        let TopLevel {
            jsonrpc,
            id,
            method,
            params,
            result,
            has_error,
            ..
        } = top;
        match &jsonrpc {
            Some(r) if &text[r.clone()] == "\"2.0\"" => {}
            _ => {
                return unreadable(
                    EnvelopeError::NotJsonRpc("missing \"jsonrpc\": \"2.0\"".into()),
                    text,
                );
            }
        }
        let method = match &method {
            Some(m) => match scan::string_value(&text[m.clone()]) {
                Some(name) => Some(name.into_owned()),
                None => {
                    return unreadable(
                        EnvelopeError::NotJsonRpc("method is not a string".into()),
                        text,
                    );
                }
            },
            None => None,
        };
        let id_text = id.as_ref().map(|r| &text[r.clone()]);
        let answer = result.is_some() || has_error;
        let kind = match (&method, id_text) {
            (Some(_), _) if answer => Err(EnvelopeError::NotJsonRpc(
                "both a method and a result or error".into(),
            )),
            // A method and no id member at all: a notification.
            (Some(_), None) => Ok(Kind::Notification),
            (Some(_), Some(raw)) if is_valid_id(raw) => Ok(Kind::Request),
            // A method with `"id": null` (or any other non-id): an invalid request, never a
            // notification.
            (Some(m), Some(raw)) => Err(EnvelopeError::InvalidRequestId {
                method: m.clone(),
                id: raw.chars().take(40).collect(),
            }),
            // A response's id may be null (an error answering an unreadable request).
            (None, Some(raw)) if answer && raw != "null" && !is_valid_id(raw) => Err(
                EnvelopeError::NotJsonRpc("id must be a string or a number".into()),
            ),
            (None, _) if answer => Ok(Kind::Response),
            (None, _) => Err(EnvelopeError::NotJsonRpc(
                "neither a request, a notification nor a response".into(),
            )),
        };
        let kind = match kind {
            Ok(kind) => kind,
            Err(e) => return unreadable(e, text),
        };
        let id_raw = id_text.map(|t| RawValue::from_string(t.to_owned()).expect("read as JSON"));
        Ok(Message {
            text,
            id,
            params,
            result,
            has_error,
            id_raw,
            method,
            kind,
        })
    }

    /// Why a line that is not a JSON object was refused.
    fn not_an_object(line: &[u8]) -> EnvelopeError {
        match serde_json::from_slice::<serde::de::IgnoredAny>(line) {
            // Valid JSON that is not an object (a batch, a number) is a different failure.
            Ok(_) => EnvelopeError::NotJsonRpc(
                "expected a JSON object (batches are not supported)".into(),
            ),
            Err(e) => EnvelopeError::NotJson(e.to_string()),
        }
    }

    /// A message with a member named twice, rebuilt with each member once (the last one).
    fn parse_normalized(line: &[u8]) -> Result<Message, EnvelopeError> {
        let fields: BTreeMap<String, Box<RawValue>> =
            serde_json::from_slice(line).map_err(|e| EnvelopeError::NotJson(e.to_string()))?;
        let text = serde_json::to_vec(&fields).expect("raw fields serialize");
        Message::parse(&text)
    }

    pub fn kind(&self) -> &Kind {
        &self.kind
    }
    pub fn method(&self) -> Option<&str> {
        self.method.as_deref()
    }
    pub fn id(&self) -> Option<&RawValue> {
        self.id_raw.as_deref()
    }
    pub fn params(&self) -> Option<Raw<'_>> {
        self.params.clone().map(|r| Raw(&self.text[r]))
    }
    pub fn result(&self) -> Option<Raw<'_>> {
        self.result.clone().map(|r| Raw(&self.text[r]))
    }
    pub fn is_error(&self) -> bool {
        self.has_error
    }
    /// Parsed params (or Null).
    pub fn params_value(&self) -> Value {
        self.params()
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or(Value::Null)
    }
    /// Parsed result (or Null).
    pub fn result_value(&self) -> Value {
        self.result()
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or(Value::Null)
    }

    /// `line` read as this message with another numeric id in its place, without parsing it
    /// (or copying it) again; the line back unless `line` is this message's text byte for byte but for a plain
    /// non-negative integer where the id's value is.
    ///
    /// Exactly what [`Message::parse`] would return for `line`: this text was read as one JSON
    /// object with each member once, and one value swapped for another valid value changes
    /// neither that nor where any member is. A repeated `tools/list` answer of a large catalog
    /// (hundreds of KB, the same but for the id) is then one comparison instead of a JSON walk.
    pub fn with_other_id(&self, line: Vec<u8>) -> Result<Message, Vec<u8>> {
        let Some(id) = self.id.clone() else {
            return Err(line);
        };
        let text = self.text.as_bytes();
        let (head, tail) = (&text[..id.start], &text[id.end..]);
        let Some(digits) = line
            .len()
            .checked_sub(head.len() + tail.len())
            .map(|n| &line[head.len()..head.len() + n])
        else {
            return Err(line);
        };
        let plain_integer = matches!(digits, [b'0'])
            || (matches!(digits.first(), Some(b'1'..=b'9'))
                && digits.len() <= 20
                && digits.iter().all(u8::is_ascii_digit));
        if !plain_integer || !line.starts_with(head) || !line.ends_with(tail) {
            return Err(line);
        }
        let new_id = id.start..id.start + digits.len();
        let text = String::from_utf8(line).map_err(|e| e.into_bytes())?;
        let moved = |span: &Option<Span>| {
            span.clone().map(|r| {
                if r.start >= id.end {
                    r.start + new_id.end - id.end..r.end + new_id.end - id.end
                } else {
                    r
                }
            })
        };
        let id_raw = RawValue::from_string(text[new_id.clone()].to_owned())
            .expect("a plain integer is valid JSON");
        Ok(Message {
            id_raw: Some(id_raw),
            params: moved(&self.params),
            result: moved(&self.result),
            id: Some(new_id),
            text,
            has_error: self.has_error,
            method: self.method.clone(),
            kind: self.kind.clone(),
        })
    }

    pub fn set_id(&mut self, id: RawId) {
        let at = self.splice(Member::Id, id.get());
        self.id = Some(at);
        self.id_raw = Some(id);
    }
    pub fn set_params(&mut self, params: &Value) {
        let at = self.splice(Member::Params, &params.to_string());
        self.params = Some(at);
    }
    /// Drops members of `params` (an object), keeping every other member's value byte for byte
    /// (no tree: numbers, spacing and order stay as the sender wrote them). No change when
    /// params is not an object.
    pub fn remove_params_members(&mut self, names: &[&str]) {
        let Some(raw) = self.params() else { return };
        let Ok(members) = serde_json::from_str::<Members<'_, String>>(raw.get()) else {
            return;
        };
        let mut out = String::with_capacity(raw.get().len());
        out.push('{');
        for (k, v) in members
            .0
            .iter()
            .filter(|(k, _)| !names.contains(&k.as_str()))
        {
            if out.len() > 1 {
                out.push(',');
            }
            out.push_str(&serde_json::to_string(k).expect("a string serializes"));
            out.push(':');
            out.push_str(v.get());
        }
        out.push('}');
        let at = self.splice(Member::Params, &out);
        self.params = Some(at);
    }
    pub fn set_result(&mut self, result: &Value) {
        let at = self.splice(Member::Result, &result.to_string());
        self.result = Some(at);
    }

    /// Puts `value` in place of `member`'s value (or adds the member at the end of the object)
    /// and moves the other spans; returns the new value's span.
    fn splice(&mut self, member: Member, value: &str) -> Span {
        let current = match member {
            Member::Id => self.id.clone(),
            Member::Params => self.params.clone(),
            Member::Result => self.result.clone(),
        };
        let (range, prefix) = match current {
            Some(r) => (r, ""),
            None => {
                // The object's closing brace: the last byte that is not whitespace.
                let end = self.text.trim_end().len() - 1;
                let name = match member {
                    Member::Id => ",\"id\":",
                    Member::Params => ",\"params\":",
                    Member::Result => ",\"result\":",
                };
                (end..end, name)
            }
        };
        let start = range.start + prefix.len();
        let inserted = prefix.len() + value.len();
        if prefix.is_empty() {
            self.text.replace_range(range.clone(), value);
        } else {
            self.text
                .replace_range(range.clone(), &format!("{prefix}{value}"));
        }
        let removed = range.end - range.start;
        let shift = |r: &mut Option<Span>| {
            if let Some(r) = r
                && r.start >= range.end
                && !(r.start == range.start && range.is_empty())
            {
                *r = r.start + inserted - removed..r.end + inserted - removed;
            }
        };
        shift(&mut self.id);
        shift(&mut self.params);
        shift(&mut self.result);
        start..start + value.len()
    }

    /// [`Message::to_line`] with `id` in place of the id: one copy of the text, where
    /// [`Message::set_id`] then `to_line` moves everything after the id and copies it again
    /// (a large answer on its way back to the host).
    pub fn to_line_with_id(&self, id: &RawValue) -> Vec<u8> {
        let Some(at) = self.id.clone() else {
            let mut with = self.clone();
            with.set_id(id.to_owned());
            return with.to_line();
        };
        let text = self.text.as_bytes();
        let mut out = Vec::with_capacity(text.len() - at.len() + id.get().len() + 1);
        out.extend_from_slice(&text[..at.start]);
        out.extend_from_slice(id.get().as_bytes());
        out.extend_from_slice(&text[at.end..]);
        out.push(b'\n');
        out
    }

    /// One line, terminated by `\n`.
    pub fn to_line(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.text.len() + 1);
        out.extend_from_slice(self.text.as_bytes());
        out.push(b'\n');
        out
    }
}

/// The tool name and the raw arguments of a `tools/call`, read without building a JSON tree
/// (this runs for every call); `"arguments": null` is none. `None` when there is no one tool
/// name to judge: params missing or not an object, `name` missing, not a string, or named twice
/// (peers' parsers disagree on which one counts), `arguments` named twice.
pub fn call_target(params: Option<Raw<'_>>) -> Option<(String, Option<Raw<'_>>)> {
    let text = params?.get();
    let (mut name, mut arguments, mut twice) = (None, None, false);
    let read = scan::object_members(text, |member, value| {
        let slot = match &*member {
            "name" => &mut name,
            "arguments" => &mut arguments,
            _ => return,
        };
        twice |= slot.is_some();
        *slot = Some(value);
    });
    if read.is_err() || twice {
        return None;
    }
    let name = scan::string_value(&text[name?])?.into_owned();
    let arguments = arguments.map(|r| &text[r]).filter(|a| *a != "null");
    Some((name, arguments.map(Raw)))
}

/// The `_meta` object of a message's params, parsed alone (the rest is skipped, not built).
pub fn params_meta(params: Option<Raw<'_>>) -> Option<Value> {
    #[derive(serde::Deserialize)]
    struct WithMeta {
        #[serde(rename = "_meta", default)]
        meta: Option<Value>,
    }
    params
        .filter(|p| may_name(p, &QUOTED_META))
        .and_then(|p| serde_json::from_str::<WithMeta>(p.get()).ok())
        .and_then(|w| w.meta)
}

/// Whether an object's text can have a member named `key` (`key` given in quotes; ASCII,
/// nothing to escape): the quoted name appears, or some string uses a `\u` escape (which could
/// spell it). `false` is certain, so the parse that would find nothing is skipped (most
/// requests carry no `_meta`, most results no `isError`).
fn may_name(object: &Raw<'_>, quoted_key: &memchr::memmem::Finder<'static>) -> bool {
    let text = object.get().as_bytes();
    // One pass each (a search per quote cost a `memchr` call per member).
    quoted_key.find(text).is_some()
        || memchr::memchr_iter(b'\\', text).any(|at| text.get(at + 1) == Some(&b'u'))
}

/// `"_meta"` and `"isError"`, searched for in every request's params and every call's result.
static QUOTED_META: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"_meta\""));
static QUOTED_IS_ERROR: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"isError\""));

/// Whether a `tools/call` result says `isError: true` (other members are skipped, not built;
/// a result that is not an object says nothing). Named twice, the last one counts, as the
/// hosts' parsers (JavaScript, Python, serde_json's `Value`) read it.
pub fn result_is_error(result: Option<Raw<'_>>) -> bool {
    let Some(text) = result
        .filter(|r| may_name(r, &QUOTED_IS_ERROR))
        .map(|r| r.get())
    else {
        return false;
    };
    let mut flag = None;
    let read = scan::object_members(text, |member, value| {
        if member == "isError" {
            flag = Some(value);
        }
    });
    read.is_ok() && flag.is_some_and(|r| &text[r] == "true")
}

/// The `tools` array of a `tools/list` result as raw text, and its `nextCursor` (the tools
/// themselves are validated, not built).
pub fn list_result_parts(result: Option<Raw<'_>>) -> Option<(&str, Option<String>)> {
    #[derive(serde::Deserialize)]
    struct ListResult<'a> {
        #[serde(borrow)]
        tools: Option<&'a RawValue>,
        #[serde(rename = "nextCursor", default)]
        next_cursor: Option<Value>,
    }
    let r: ListResult = serde_json::from_str(result?.get()).ok()?;
    // A cursor that is not a string is no cursor anyone can follow, nor a last page: the list
    // cannot be read (taken for "no more pages", a cut catalog would pass for a whole one).
    let cursor = match r.next_cursor {
        None | Some(Value::Null) => None,
        Some(Value::String(c)) => Some(c),
        Some(_) => return None,
    };
    Some((r.tools.map(|t| t.get()).unwrap_or("[]"), cursor))
}

/// A raw value from a JSON value.
pub fn raw(v: &Value) -> Box<RawValue> {
    RawValue::from_string(v.to_string()).expect("a Value is valid JSON")
}

/// A raw numeric id.
pub fn numeric_id(n: u64) -> RawId {
    RawValue::from_string(itoa::Buffer::new().format(n).to_owned()).expect("a number is valid JSON")
}

/// Our integer ids back from raw text (`17` → 17); anything else is not ours.
pub fn parse_numeric_id(id: &RawValue) -> Option<u64> {
    id.get().parse().ok()
}

pub fn clone_raw(v: &RawValue) -> RawId {
    v.to_owned()
}

fn line_of(v: Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(&v).expect("Value serializes");
    out.push(b'\n');
    out
}

/// `{"jsonrpc":"2.0","id":…,"result":…}` with an exact raw id.
pub fn result_line(id: &RawValue, result: &Value) -> Vec<u8> {
    let mut m: BTreeMap<&str, Box<RawValue>> = BTreeMap::new();
    m.insert("jsonrpc", raw(&json!("2.0")));
    m.insert("id", id.to_owned());
    m.insert("result", raw(result));
    let mut out = serde_json::to_vec(&m).expect("serializes");
    out.push(b'\n');
    out
}

/// A JSON-RPC error from cargo mcp-dev (`data.source = "cargo-mcp-dev"`). `id` None → null.
pub fn error_line(id: Option<&RawValue>, code: i64, message: &str, mut data: Value) -> Vec<u8> {
    if let Value::Object(m) = &mut data {
        m.insert("source".into(), json!(SOURCE));
    } else {
        data = json!({"source": SOURCE});
    }
    let mut m: BTreeMap<&str, Box<RawValue>> = BTreeMap::new();
    m.insert("jsonrpc", raw(&json!("2.0")));
    m.insert(
        "id",
        id.map(|i| i.to_owned())
            .unwrap_or_else(|| raw(&Value::Null)),
    );
    m.insert(
        "error",
        raw(&json!({"code": code, "message": message, "data": data})),
    );
    let mut out = serde_json::to_vec(&m).expect("serializes");
    out.push(b'\n');
    out
}

pub fn request_line(id: u64, method: &str, params: &Value) -> Vec<u8> {
    line_of(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
}

pub fn notification_line(method: &str, params: Option<&Value>) -> Vec<u8> {
    match params {
        Some(p) => line_of(json!({"jsonrpc": "2.0", "method": method, "params": p})),
        None => line_of(json!({"jsonrpc": "2.0", "method": method})),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy as _;

    /// The skip before `_meta` and `isError` is never wrong: a key spelled with `\u` escapes
    /// is still read, a name that is only a value (or part of a longer key) is not a member.
    #[test]
    fn meta_and_is_error_are_found_however_they_are_spelled() {
        let raw = |t: &'static str| Some(Raw(t));
        assert_eq!(
            params_meta(raw(r#"{"name":"x","_meta":{"k":1}}"#)),
            Some(json!({"k": 1}))
        );
        assert_eq!(
            params_meta(raw(r#"{"name":"x","\u005fmeta":{"k":2}}"#)),
            Some(json!({"k": 2}))
        );
        assert_eq!(
            params_meta(raw(r#"{"name":"_meta","x_meta":{"k":3}}"#)),
            None
        );
        assert_eq!(params_meta(raw(r#"{"name":"x"}"#)), None);
        assert_eq!(params_meta(None), None);
        assert!(result_is_error(raw(r#"{"content":[],"isError":true}"#)));
        assert!(result_is_error(raw(
            r#"{"content":[],"\u0069sError":true}"#
        )));
        assert!(!result_is_error(raw(
            r#"{"content":[{"type":"text","text":"isError"}]}"#
        )));
        assert!(!result_is_error(raw(r#"{"content":[],"isError":false}"#)));
        assert!(!result_is_error(raw(r#"{"content":[]}"#)));
    }

    #[test]
    fn classifies_and_keeps_raw_ids() {
        let m = Message::parse(
            br#"{"jsonrpc":"2.0","id":0,"method":"tools/call","params":{"name":"x"}}"#,
        )
        .unwrap();
        assert_eq!(m.kind(), &Kind::Request);
        assert_eq!(m.id().unwrap().get(), "0");
        let m = Message::parse(br#"{"jsonrpc":"2.0","id":"0","result":{}}"#).unwrap();
        assert_eq!(m.kind(), &Kind::Response);
        assert_eq!(m.id().unwrap().get(), "\"0\"");
        let m =
            Message::parse(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
        assert_eq!(m.kind(), &Kind::Notification);
        let m = Message::parse(br#"{"jsonrpc":"2.0","id":1.0,"method":"ping"}"#).unwrap();
        assert_eq!(m.id().unwrap().get(), "1.0");
    }

    #[test]
    fn rewrites_id_and_preserves_everything_else() {
        let mut m = Message::parse(br#"{"jsonrpc":"2.0","id":"abc","method":"tools/call","params":{"name":"x","arguments":{"b":1,"a":[1,2]}}}"#).unwrap();
        m.set_id(numeric_id(42));
        let out = m.to_line();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["id"], json!(42));
        assert_eq!(v["params"]["arguments"], json!({"b":1,"a":[1,2]}));
        assert_eq!(*out.last().unwrap(), b'\n');
        assert!(!out[..out.len() - 1].contains(&b'\n'));
    }

    #[test]
    fn rejects_bad_input_with_the_right_code() {
        assert_eq!(Message::parse(b"hello").unwrap_err().code(), -32700);
        assert_eq!(Message::parse(b"[1,2]").unwrap_err().code(), -32600);
        assert_eq!(
            Message::parse(br#"{"id":1,"method":"x"}"#)
                .unwrap_err()
                .code(),
            -32600
        );
        assert_eq!(
            Message::parse(br#"{"jsonrpc":"2.0","id":{},"method":"x"}"#)
                .unwrap_err()
                .code(),
            -32600
        );
        assert_eq!(
            Message::parse(br#"{"jsonrpc":"2.0","id":1}"#)
                .unwrap_err()
                .code(),
            -32600
        );
    }

    /// Issue 12, critical finding "`id: null` bypasses approvals and the audit log": a
    /// `tools/call` with `"id": null` used to classify as a notification (and was forwarded to
    /// the server ungated and unrecorded). It is an invalid request (-32600), never a
    /// notification; only a message with no id member at all is one.
    #[test]
    fn id_null_request_is_invalid_not_a_notification() {
        let e = Message::parse(
            br#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"write"}}"#,
        )
        .unwrap_err();
        assert_eq!(e.code(), -32600);
        assert_eq!(e.dropped_method(), Some("tools/call"));
        assert!(e.to_string().contains("id null"), "{e}");
        for id in ["true", "false", "{}", "[]", "[1]", r#"{"a":1}"#] {
            let line = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call"}}"#);
            let e = Message::parse(line.as_bytes()).unwrap_err();
            assert_eq!(e.dropped_method(), Some("tools/call"), "{line}");
        }
        // No id member: a notification (the session must never forward one named
        // `tools/call`: `is_notification_method` says which names may travel without an id).
        let m = Message::parse(br#"{"jsonrpc":"2.0","method":"tools/call","params":{}}"#).unwrap();
        assert_eq!(m.kind(), &Kind::Notification);
        assert!(!is_notification_method("tools/call"));
        assert!(is_notification_method("notifications/cancelled"));
        // A response's id may be null (an error for an unreadable request).
        let m =
            Message::parse(br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#)
                .unwrap();
        assert_eq!(m.kind(), &Kind::Response);
        // A method and a result at once is neither.
        assert!(Message::parse(br#"{"jsonrpc":"2.0","id":1,"method":"x","result":{}}"#).is_err());
    }

    /// The scanner reads a call's target as the `serde` struct it replaced did where that
    /// struct read one tool name; where it fell back to no name (`""`), there is now no target
    /// at all, so the call is refused as malformed instead of judged as a tool named `""`.
    /// (The struct also took a JSON array in field order; that is no target now either.)
    #[test]
    fn call_target_reads_as_the_serde_struct_did() {
        #[derive(serde::Deserialize)]
        struct CallParams<'a> {
            name: String,
            #[serde(borrow, default)]
            arguments: Option<&'a RawValue>,
        }
        let by_serde = |text: &str| {
            serde_json::from_str::<CallParams<'_>>(text)
                .ok()
                .map(|c| (c.name, c.arguments.map(|a| a.get().to_string())))
        };
        for text in [
            r#"{"name":"w","arguments":{"a":1}}"#,
            r#"{ "arguments" : [1, 2] , "name" : "w" }"#,
            r#"{"name":"w\u00e9\/x"}"#,
            r#"{"\u006eame":"w"}"#,
            r#"{"name":"w","arguments":null}"#,
            r#"{"name":"","arguments":{}}"#,
            r#"{"name":"w","name":"v"}"#,
            r#"{"name":"a","\u006eame":"b"}"#,
            r#"{"name":"w","arguments":{},"arguments":{}}"#,
            r#"{"name":1,"arguments":{}}"#,
            r#"{"name":null}"#,
            r#"{"name":"\ud800"}"#,
            r#"{"arguments":"text"}"#,
            r#"{}"#,
            r#"{"name":"w","other":{"name":"v"}}"#,
            r#"{"name":"w",}"#,
        ] {
            let target = call_target(Some(Raw(text)))
                .map(|(name, arguments)| (name, arguments.map(|a| a.get().to_string())));
            assert_eq!(target, by_serde(text), "params {text}");
        }
        assert_eq!(call_target(Some(Raw(r#"["w",{}]"#))), None);
        assert_eq!(call_target(None), None);
    }

    /// The same for `isError`, against the `serde` struct it replaced; `isError` named twice
    /// is read as the hosts read it (the last one), where the struct said nothing.
    #[test]
    fn result_is_error_reads_as_the_serde_struct_did() {
        #[derive(serde::Deserialize)]
        struct Outcome {
            #[serde(rename = "isError", default)]
            is_error: Option<bool>,
        }
        for text in [
            r#"{"content":[],"isError":true}"#,
            r#"{"content":[],"isError" : false}"#,
            r#"{"isError":null}"#,
            r#"{"isError":"true"}"#,
            r#"{"isError":1}"#,
            r#"{"\u0069sError":true}"#,
            r#"{"content":[{"isError":true}]}"#,
            r#"{"content":"isError"}"#,
            r#"{"isError":true,}"#,
        ] {
            let by_serde = serde_json::from_str::<Outcome>(text)
                .ok()
                .and_then(|o| o.is_error)
                .unwrap_or(false);
            assert_eq!(result_is_error(Some(Raw(text))), by_serde, "result {text}");
        }
        // The struct also read a JSON array in field order; a result that is not an object
        // now says nothing.
        assert!(!result_is_error(Some(Raw("[true]"))));
        // Named twice: the last one counts, as in the host (the struct refused the duplicate).
        for (text, last) in [
            (r#"{"isError":false,"isError":true}"#, true),
            (r#"{"isError":true,"isError":true}"#, true),
            (r#"{"isError":true,"\u0069sError":false}"#, false),
        ] {
            let host: Value = serde_json::from_str(text).unwrap();
            assert_eq!(host["isError"], json!(last), "what a host reads: {text}");
            assert_eq!(result_is_error(Some(Raw(text))), last, "{text}");
        }
    }

    #[test]
    fn call_target_and_error_flag_without_a_tree() {
        let m = Message::parse(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{"b":[1,{"c":2}]},"name":"write_item","_meta":{"progressToken":3}}}"#).unwrap();
        let (name, args) = call_target(m.params()).unwrap();
        assert_eq!(name, "write_item");
        assert_eq!(args.unwrap().get(), r#"{"b":[1,{"c":2}]}"#);
        assert_eq!(call_target(None), None);
        assert_eq!(params_meta(m.params()), Some(json!({"progressToken": 3})));
        let r = Message::parse(br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"x"}],"isError":true}}"#).unwrap();
        assert!(result_is_error(r.result()));
        let r = Message::parse(br#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#).unwrap();
        assert!(!result_is_error(r.result()));
    }

    #[test]
    fn error_lines_carry_source() {
        let id = numeric_id(3);
        let v: Value =
            serde_json::from_slice(&error_line(Some(&id), -31001, "m", json!({"x":1}))).unwrap();
        assert_eq!(v["error"]["data"]["source"], json!("cargo-mcp-dev"));
        assert_eq!(v["error"]["data"]["x"], json!(1));
        assert_eq!(v["id"], json!(3));
        let v: Value = serde_json::from_slice(&error_line(None, -32700, "m", Value::Null)).unwrap();
        assert_eq!(v["id"], Value::Null);
    }

    mod fuzz {
        //! Property tests (issue 12, "fuzz targets for host lines and child lines through the
        //! envelope"): every message shape a peer can send, plus arbitrary bytes, classified
        //! without a panic and consistently with JSON-RPC 2.0; no `tools/call` is ever a
        //! forwardable message unless it is a request with a valid id (which the session gates
        //! and audits). Fixed case counts, so CI runs the same amount of fuzzing every time.
        use super::*;
        use proptest::prelude::*;

        fn id_strategy() -> impl Strategy<Value = Option<String>> {
            prop_oneof![
                Just(None),
                Just(Some("null".to_string())),
                Just(Some("true".to_string())),
                Just(Some("{}".to_string())),
                Just(Some("[0]".to_string())),
                Just(Some("1.0".to_string())),
                Just(Some("-0".to_string())),
                Just(Some("1e3".to_string())),
                any::<i64>().prop_map(|n| Some(n.to_string())),
                "[a-z0-9\\\\\"\u{202e}\u{0}-\u{1f}]{0,8}"
                    .prop_map(|s| Some(Value::String(s).to_string())),
            ]
        }

        fn method_strategy() -> impl Strategy<Value = Option<String>> {
            prop_oneof![
                Just(None),
                Just(Some(r#""tools/call""#.to_string())),
                Just(Some(r#""tools/list""#.to_string())),
                Just(Some(r#""notifications/cancelled""#.to_string())),
                Just(Some(r#""tools\/call""#.to_string())),
                Just(Some("5".to_string())),
                Just(Some("null".to_string())),
                "[a-z/]{0,12}".prop_map(|s| Some(Value::String(s).to_string())),
            ]
        }

        /// A JSON object line built from optional members, in a random order, sometimes with a
        /// duplicated key, `\r`, or trailing garbage.
        /// Two readings of a message agree on everything the session can ask of it.
        fn same_reading(a: &Message, b: &Message) -> Result<(), TestCaseError> {
            prop_assert_eq!(a.to_line(), b.to_line());
            prop_assert_eq!(a.kind(), b.kind());
            prop_assert_eq!(a.method(), b.method());
            prop_assert_eq!(a.id().map(|i| i.get()), b.id().map(|i| i.get()));
            prop_assert_eq!(a.params(), b.params());
            prop_assert_eq!(a.result(), b.result());
            prop_assert_eq!(a.is_error(), b.is_error());
            prop_assert_eq!(&a.id, &b.id);
            Ok(())
        }

        fn shaped_line() -> impl Strategy<Value = Vec<u8>> {
            (
                prop_oneof![
                    Just(Some(r#""2.0""#)),
                    Just(None),
                    Just(Some(r#""1.0""#)),
                    Just(Some("2.0"))
                ],
                id_strategy(),
                method_strategy(),
                prop_oneof![
                    Just(None),
                    Just(Some(r#"{"name":"write","arguments":{"a":1}}"#)),
                    Just(Some("[]")),
                    Just(Some("null"))
                ],
                prop_oneof![Just(None), Just(Some("result")), Just(Some("error"))],
                any::<bool>(),
                0u8..4,
            )
                .prop_map(|(jsonrpc, id, method, params, answer, dup, tail)| {
                    let mut members: Vec<String> = Vec::new();
                    if let Some(j) = jsonrpc {
                        members.push(format!(r#""jsonrpc":{j}"#));
                    }
                    if let Some(i) = &id {
                        members.push(format!(r#""id":{i}"#));
                    }
                    if let Some(m) = &method {
                        members.push(format!(r#""method":{m}"#));
                    }
                    if let Some(p) = params {
                        members.push(format!(r#""params":{p}"#));
                    }
                    match answer {
                        Some("result") => members.push(r#""result":{}"#.into()),
                        Some(_) => members.push(r#""error":{"code":1,"message":"m"}"#.into()),
                        None => {}
                    }
                    if dup && let Some(i) = id {
                        members.insert(0, format!(r#""id":{i}"#));
                    }
                    let mut line = format!("{{{}}}", members.join(","));
                    match tail {
                        1 => line.push('\r'),
                        2 => line.push_str(" x"),
                        3 => line.insert(0, ' '),
                        _ => {}
                    }
                    line.into_bytes()
                })
        }

        /// The JSON-RPC 2.0 oracle for a line that parses as an object with `"jsonrpc":"2.0"`.
        fn check(line: &[u8]) {
            let parsed = Message::parse(line);
            let Ok(msg) = parsed else {
                let e = parsed.unwrap_err();
                assert!(matches!(e.code(), -32700 | -32600));
                return;
            };
            let value: Value = serde_json::from_slice(line).expect("a parsed line is JSON");
            let obj = value.as_object().expect("a parsed line is an object");
            assert_eq!(obj.get("jsonrpc"), Some(&json!("2.0")));
            let id = msg.id().map(|i| i.get().to_string());
            match msg.kind() {
                Kind::Request => {
                    let method = msg.method().expect("a request has a method");
                    let id = id.as_deref().expect("a request has an id");
                    assert!(
                        is_valid_id(id),
                        "request id {id} of {method} must be a string or a number"
                    );
                    assert!(msg.result().is_none() && !msg.is_error());
                }
                Kind::Notification => {
                    assert!(msg.method().is_some());
                    assert!(id.is_none(), "a notification has no id member: {line:?}");
                }
                Kind::Response => {
                    assert!(msg.method().is_none());
                    assert!(msg.result().is_some() || msg.is_error());
                }
            }
            // Forwarding is only ever possible for a request (gated, audited by the session) or
            // a notification whose name says it is one.
            let forwardable = match msg.kind() {
                Kind::Request => true,
                Kind::Notification => is_notification_method(msg.method().unwrap_or_default()),
                Kind::Response => false,
            };
            if msg.method() == Some("tools/call") && forwardable {
                assert_eq!(msg.kind(), &Kind::Request, "{line:?}");
                assert!(id.is_some() && id.as_deref() != Some("null"));
            }
            // The re-serialised line classifies the same way and keeps the id's exact text.
            let out = msg.to_line();
            let again = Message::parse(&out[..out.len() - 1]).unwrap();
            assert_eq!(again.kind(), msg.kind());
            assert_eq!(again.method(), msg.method());
            assert_eq!(again.id().map(|i| i.get().to_string()), id);
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 4096, failure_persistence: None, ..ProptestConfig::default() })]

            /// Host and child lines of every shape.
            #[test]
            fn shaped_lines_classify_consistently(line in shaped_line()) {
                check(&line);
            }

            /// Arbitrary bytes (invalid UTF-8 included) never panic.
            #[test]
            fn arbitrary_bytes_never_panic(line in proptest::collection::vec(any::<u8>(), 0..256)) {
                check(&line);
            }

            /// A line recognised as a known message with another id is read exactly as a full
            /// parse reads it, and a line changed anywhere but in the id, or given an id that is
            /// not a plain integer, is left to the full parse.
            #[test]
            fn a_known_shape_reads_as_a_parse_would(
                line in shaped_line(),
                host_id in prop_oneof![Just(None), any::<u32>().prop_map(|n| Some(n.to_string())), Just(Some(r#""h-1""#.to_string()))],
                new_id in prop_oneof![any::<u64>().prop_map(|n| n.to_string()), Just("0".to_string()), Just("007".to_string()), Just("-1".to_string()), Just("1.5".to_string()), Just(r#""7""#.to_string()), Just(String::new())],
                edit in any::<prop::sample::Index>(),
                edit_byte in any::<u8>(),
            ) {
                let Ok(mut template) = Message::parse(&line) else { return Ok(()) };
                if template.id().is_none() {
                    return Ok(());
                }
                if let Some(h) = host_id {
                    // The session keeps the answer as it went to the host, with the host's id.
                    template.set_id(RawValue::from_string(h).unwrap());
                }
                // The line for the host with its id put in: as an edit then a copy would be.
                let host = RawValue::from_string(r#""h-2""#.to_string()).unwrap();
                let mut edited = template.clone();
                edited.set_id(host.clone());
                prop_assert_eq!(template.to_line_with_id(&host), edited.to_line());
                let span = template.id.clone().unwrap();
                let mut other = template.text.as_bytes()[..span.start].to_vec();
                other.extend_from_slice(new_id.as_bytes());
                other.extend_from_slice(&template.text.as_bytes()[span.end..]);
                let plain = new_id == "0" || (!new_id.starts_with('0') && !new_id.is_empty() && new_id.bytes().all(|b| b.is_ascii_digit()));
                let seen = template.with_other_id(other.clone());
                prop_assert_eq!(seen.is_ok(), plain, "{}", String::from_utf8_lossy(&other));
                if let Ok(seen) = seen {
                    same_reading(&seen, &Message::parse(&other).unwrap())?;
                }
                // Any other change of one byte: refused, or (a change inside the id's digits) still
                // exactly a parse's reading.
                let mut edited = other.clone();
                let at = edit.index(edited.len());
                if edited[at] == edit_byte {
                    return Ok(());
                }
                edited[at] = edit_byte;
                match template.with_other_id(edited.clone()) {
                    Ok(seen) => same_reading(&seen, &Message::parse(&edited).unwrap())?,
                    Err(back) => prop_assert_eq!(back, edited),
                }
            }

            /// Arbitrary text around JSON-RPC keys never panics.
            #[test]
            fn jsonish_text_never_panics(line in "[{}\\[\\]\",:a-z0-9 .\\\\-]{0,64}") {
                let with_keys = line.replace("a", "\"jsonrpc\":\"2.0\"").replace("b", "\"id\"");
                check(with_keys.as_bytes());
            }
        }
    }

    #[test]
    fn an_unedited_message_travels_byte_for_byte() {
        let line = br#"{ "params" : {"name":"x", "arguments":{"b":1,"a":2}}, "method":"tools/call","id":"a b" ,"jsonrpc":"2.0","x-extra":[1,2]}"#;
        let m = Message::parse(line).unwrap();
        assert_eq!(&m.to_line()[..line.len()], &line[..]);
        assert_eq!(m.id().unwrap().get(), "\"a b\"");
        assert_eq!(m.method(), Some("tools/call"));
        assert_eq!(
            m.params().unwrap().get(),
            r#"{"name":"x", "arguments":{"b":1,"a":2}}"#
        );
    }

    #[test]
    fn edits_splice_in_place_and_keep_the_other_members() {
        let line = br#"{"jsonrpc":"2.0","id":"long-host-id-123","method":"tools/call","params":{"name":"x"},"z":true}"#;
        let mut m = Message::parse(line).unwrap();
        m.set_id(numeric_id(7));
        assert_eq!(m.params().unwrap().get(), r#"{"name":"x"}"#);
        m.set_params(&json!({"name": "y", "arguments": {}}));
        m.set_id(numeric_id(123456789));
        let out = m.to_line();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "{\"jsonrpc\":\"2.0\",\"id\":123456789,\"method\":\"tools/call\",\"params\":{\"arguments\":{},\"name\":\"y\"},\"z\":true}\n"
        );
        // A member that was not there is added at the end.
        let mut n = Message::parse(br#"{"jsonrpc":"2.0","method":"notifications/x"} "#).unwrap();
        n.set_params(&json!({"a": 1}));
        assert_eq!(
            n.to_line(),
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\",\"params\":{\"a\":1}} \n"
                .to_vec()
        );
        assert_eq!(n.params().unwrap().get(), r#"{"a":1}"#);
    }

    /// Review of issue 15: a bare `\r` is JSON whitespace between tokens, and travels byte for
    /// byte. A server that reads lines with universal newlines (the Python MCP SDK's stdio transport
    /// wraps stdin in a `TextIOWrapper`, newline=None; Node's `readline`) splits on it, and a
    /// middle fragment can be a complete `tools/call` of another tool under another id, which
    /// was never judged nor recorded.
    #[test]
    fn bare_cr_cannot_smuggle_a_second_message_to_a_universal_newline_reader() {
        let line = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"list_items\",\"arguments\":{}},\"x\":\r{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"write_item\",\"arguments\":{\"all\":true}}}\r}";
        let inner = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"list_items\",\"arguments\":{\"a\":\r{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"write_item\",\"arguments\":{}}}\r}}}";
        for line in [line, inner] {
            let mut m = Message::parse(line.as_bytes()).unwrap();
            assert_eq!(m.method(), Some("tools/call"));
            assert_eq!(
                call_target(m.params()).unwrap().0,
                "list_items",
                "what the gate judges"
            );
            m.set_id(numeric_id(17)); // as the router forwards it
            let out = m.to_line();
            // Python: `for line in TextIOWrapper(stdin)` (universal newlines).
            let text = std::str::from_utf8(&out).unwrap();
            let fragments: Vec<&str> = text
                .split(['\r', '\n'])
                .filter(|f| !f.trim().is_empty())
                .collect();
            for f in fragments {
                if let Ok(v) = serde_json::from_str::<Value>(f) {
                    assert_eq!(
                        v["params"]["name"],
                        json!("list_items"),
                        "the server reads a message nobody judged: {f}"
                    );
                }
            }
        }
    }

    /// A member named twice would let the supervisor judge one value and the server act on the
    /// other (parsers disagree on which one counts): such a message leaves rebuilt, with only
    /// the value that was judged.
    #[test]
    fn a_member_named_twice_is_rebuilt_with_the_judged_value() {
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"safe"},"params":{"name":"evil"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"safe"},"\u0070arams":{"name":"evil"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call","params":{"name":"evil"}}"#,
        ] {
            let m = Message::parse(line.as_bytes()).unwrap();
            let (tool, _) = call_target(m.params()).unwrap();
            let out = m.to_line();
            let text = std::str::from_utf8(&out).unwrap();
            assert_eq!(m.method(), Some("tools/call"), "{line}");
            assert_eq!(tool, "evil", "{line}");
            assert_eq!(text.matches("params").count(), 1, "{text}");
            assert_eq!(text.matches("method").count(), 1, "{text}");
            assert!(!text.contains("safe"), "{text}");
        }
    }

    /// Review of issue 15: the modern approval retry loses its round-trip members on the way to
    /// the server, and nothing else: the arguments stay the bytes whose digest was approved.
    #[test]
    fn removing_params_members_keeps_the_others_byte_for_byte() {
        let line = br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"w", "arguments":{"n":123456789012345678901234567890,"f":1.50},"requestState":"p1","inputResponses":{"x":{}},"requestState":"again"}}"#;
        let mut m = Message::parse(line).unwrap();
        m.remove_params_members(&["requestState", "inputResponses"]);
        assert_eq!(
            m.params().unwrap().get(),
            r#"{"name":"w","arguments":{"n":123456789012345678901234567890,"f":1.50}}"#
        );
        assert_eq!(call_target(m.params()).unwrap().0, "w");
        let out = m.to_line();
        assert!(std::str::from_utf8(&out).unwrap().ends_with("1.50}}}\n"));
        // Not an object: unchanged.
        let mut n =
            Message::parse(br#"{"jsonrpc":"2.0","id":4,"method":"x","params":[1]}"#).unwrap();
        n.remove_params_members(&["requestState"]);
        assert_eq!(n.params().unwrap().get(), "[1]");
    }

    /// A `nextCursor` that is not a string (nor null) makes the list unreadable: taken for
    /// "no more pages", a catalog cut at that page would pass for the whole one.
    #[test]
    fn a_list_with_a_cursor_that_is_not_a_string_cannot_be_read() {
        let parts = |result: &str| {
            let line = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{result}}}"#);
            let m = Message::parse(line.as_bytes()).unwrap();
            list_result_parts(m.result()).map(|(t, c)| (t.to_string(), c))
        };
        assert_eq!(parts(r#"{"tools":[]}"#), Some(("[]".into(), None)));
        assert_eq!(
            parts(r#"{"tools":[],"nextCursor":null}"#),
            Some(("[]".into(), None))
        );
        assert_eq!(
            parts(r#"{"tools":[],"nextCursor":"p2"}"#),
            Some(("[]".into(), Some("p2".into())))
        );
        for bad in ["2", "{}", "[\"p2\"]", "true"] {
            assert_eq!(
                parts(&format!(r#"{{"tools":[],"nextCursor":{bad}}}"#)),
                None,
                "{bad}"
            );
        }
    }

    #[test]
    fn not_utf8_is_not_json() {
        let e = Message::parse(b"{\"jsonrpc\":\"2.0\",\"method\":\"a\xff\"}").unwrap_err();
        assert_eq!(e.code(), -32700, "{e}");
    }

    proptest::proptest! {
        /// Any sequence of edits on any member order and spacing gives the line a tree edit
        /// would give, and the accessors read what the line says.
        #[test]
        fn edits_agree_with_a_tree_edit(
            order in proptest::sample::subsequence(vec![0usize, 1, 2, 3, 4], 5)
                .prop_shuffle(),
            spaces in proptest::collection::vec(proptest::sample::select(vec!["", " ", "\t"]), 12),
            edits in proptest::collection::vec((0u8..2, 0u64..100_000), 0..5),
        ) {
            let members = [
                r#""jsonrpc":"2.0""#.to_string(),
                r#""id":"h-1""#.to_string(),
                r#""method":"tools/call""#.to_string(),
                r#""params":{"name":"t","arguments":{"k":[1,{"z":null}]}}"#.to_string(),
                r#""other":"v""#.to_string(),
            ];
            let mut chosen: Vec<usize> = order.clone();
            for must in [0usize, 2] {
                if !chosen.contains(&must) {
                    chosen.push(must);
                }
            }
            let mut line = String::from("{");
            for (i, m) in chosen.iter().enumerate() {
                if i > 0 {
                    line.push(',');
                }
                line.push_str(spaces[i % spaces.len()]);
                line.push_str(&members[*m]);
                line.push_str(spaces[(i + 5) % spaces.len()]);
            }
            line.push('}');
            let Ok(mut m) = Message::parse(line.as_bytes()) else {
                // Only a request without id would be refused? No: without an id it is a
                // notification; every shape here parses.
                proptest::prop_assert!(false, "refused {}", line);
                unreachable!()
            };
            let mut tree: Value = serde_json::from_str(&line).unwrap();
            for (what, n) in edits {
                if what == 0 {
                    m.set_id(numeric_id(n));
                    tree["id"] = json!(n);
                } else {
                    let p = json!({"name": format!("t{n}"), "arguments": {"n": n}});
                    m.set_params(&p);
                    tree["params"] = p;
                }
                let out = m.to_line();
                let got: Value = serde_json::from_slice(&out).unwrap();
                proptest::prop_assert_eq!(&got, &tree);
                let again = Message::parse(&out[..out.len() - 1]).unwrap();
                proptest::prop_assert_eq!(
                    again.id().map(|i| i.get().to_string()),
                    m.id().map(|i| i.get().to_string())
                );
                proptest::prop_assert_eq!(
                    again.params().map(|p| p.get().to_string()),
                    m.params().map(|p| p.get().to_string())
                );
                proptest::prop_assert_eq!(
                    m.params().map(|p| serde_json::from_str::<Value>(p.get()).unwrap()),
                    tree.get("params").cloned()
                );
            }
        }
    }
}
