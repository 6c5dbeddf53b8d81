//! Arguments checked against the current definition (issue 33): a `tools/call` whose arguments
//! do not validate against the called tool's `inputSchema` in the current catalog is refused
//! (`arguments_invalid`), whatever the host fetched: a host can refetch and its model still call
//! with the old definition.
//!
//! Owns: compiling a tool's input schema under bounds, the cache of compiled schemas (one per
//! tool per definition digest: compiled at the first call after the definition changed, never
//! per call), validating one call's arguments, and the shortened, sanitized account of what did
//! not match. Must not touch: I/O, the clock, the rules' order (the gate asks).
//!
//! The schema is the server's and untrusted. It is compiled only when it is small and shallow
//! ([`MAX_SCHEMA_NODES`], [`MAX_SCHEMA_DEPTH`], [`MAX_SCHEMA_TEXT`]), with no `$ref` retrieval
//! (offline: a reference outside the schema fails the compile), no format assertions, and
//! patterns compiled by the linear-time `regex` engine under size limits (a lookaround or
//! backreference fails the compile). A schema that is too big or does not compile is not
//! checked at all, rather than every call being refused, and the gate says so once per
//! definition ([`InputSchemas::take_notices`]).

use std::collections::HashMap;

use serde::Serialize;
use serde_json::Value;

/// Values (objects, arrays, scalars) in one input schema, past which it is not compiled.
pub const MAX_SCHEMA_NODES: usize = 10_000;
/// Nesting of one input schema, past which it is not compiled.
pub const MAX_SCHEMA_DEPTH: usize = 48;
/// Bytes of keys and strings in one input schema, past which it is not compiled.
pub const MAX_SCHEMA_TEXT: usize = 256 * 1024;
/// Schema values one validation may visit, counting each `$ref` as its target's values again
/// and each reference cycle unrolled to the deepest arguments serde_json reads (so a chain of
/// references that doubles at each step, or a cycle that branches, is past it).
pub const MAX_EXPANDED_NODES: usize = 20_000;
/// Nesting of the schema as validation walks it (references followed, cycles unrolled): what
/// bounds the validator's recursion, so a deep walk cannot overflow the stack of the thread
/// that judges the call (the host reader's or a server reader's, 2 MiB: the deepest walk this
/// allows needs under 1 MiB in a debug build, `the_deepest_validation_the_bounds_allow_fits_the_stack`).
pub const MAX_EXPANDED_DEPTH: usize = 1_024;
/// Times a reference cycle is unrolled: one more than the nesting serde_json reads (128), so
/// a cycle that descends into the arguments at each turn is counted for the deepest ones.
const UNROLL: usize = 129;
/// Work one validation may do, as (bytes of arguments / 2) × expanded schema values: past it a
/// call is forwarded unchecked (huge arguments against a big schema).
const MAX_WORK: usize = 50_000_000;
/// Work past which only the first mismatch is looked for (the validator collects every error
/// of a call before it returns one).
const MAX_WORK_FOR_ALL_ERRORS: usize = 100_000;
/// Size of one compiled pattern (and of its lazy DFA), bytes.
const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// Compiled schemas kept; past it the cache starts over (each is compiled again at its next call).
const CACHED_SCHEMAS: usize = 1024;
/// Mismatches reported for one call.
pub const MISMATCHES_REPORTED: usize = 3;
/// Characters of one mismatch's path or message (both may hold the server's or agent's text).
const MISMATCH_CHARS: usize = 160;
/// Notices kept until the session takes them.
const NOTICES_KEPT: usize = 16;

/// One way a call's arguments do not match the tool's input schema: where (a JSON pointer into
/// the arguments, `""` for the whole object), which keyword failed, and the validator's message
/// with the argument's value left out. Each is shortened and made safe to show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArgumentMismatch {
    pub path: String,
    pub keyword: String,
    pub message: String,
}

impl ArgumentMismatch {
    fn new(path: &str, keyword: &str, message: &str) -> ArgumentMismatch {
        ArgumentMismatch {
            path: shorten(path),
            keyword: shorten(keyword),
            message: shorten(message),
        }
    }

    /// `/qty: "string" is not of type "integer"` (the root shown as `arguments`).
    pub fn describe(&self) -> String {
        let at = if self.path.is_empty() {
            "arguments"
        } else {
            &self.path
        };
        format!("{at}: {}", self.message)
    }
}

/// One tool's input schema, ready to check calls against.
#[derive(Debug)]
enum InputCheck {
    /// No `inputSchema` (or `null`), or one that takes any object (`{"type":"object"}`, the
    /// schema of a tool without parameters): only the protocol's rule that arguments are an
    /// object, without reading them (the per-call path of most tools stays as it was).
    ObjectOnly,
    /// With the schema's expanded size (values one validation may visit per argument value).
    Compiled(Box<jsonschema::Validator>, usize),
    /// Too big, or not a schema this validator compiles: calls are not checked.
    Unchecked,
}

/// The compiled input schemas of the tools called so far, each under the definition digest it
/// was compiled from.
#[derive(Debug, Default)]
pub struct InputSchemas {
    cache: HashMap<String, (String, InputCheck)>,
    /// `(tool, why)` for each definition whose schema is not checked, until taken.
    notices: Vec<(String, String)>,
    compiles: u64,
}

impl Clone for InputSchemas {
    /// A clone starts with an empty cache (compiled validators are not cloneable; the gate is
    /// cloned only for inspection).
    fn clone(&self) -> InputSchemas {
        InputSchemas {
            cache: HashMap::new(),
            notices: self.notices.clone(),
            compiles: 0,
        }
    }
}

impl InputSchemas {
    /// Checks `arguments` (the call's `arguments` JSON text, `None` when absent) against the
    /// `inputSchema` of `definition`, the tool's current definition, whose digest is `digest`.
    /// Absent or `null` arguments are an empty object. The schema is compiled at most once per
    /// tool and digest.
    pub fn check(
        &mut self,
        tool: &str,
        digest: &str,
        definition: &Value,
        arguments: Option<&str>,
    ) -> Result<(), Vec<ArgumentMismatch>> {
        let check = match self.cache.get(tool) {
            Some((d, check)) if d == digest => check,
            _ => {
                let check = self.compile(tool, definition);
                if self.cache.len() >= CACHED_SCHEMAS && !self.cache.contains_key(tool) {
                    self.cache.clear();
                }
                self.cache
                    .insert(tool.to_owned(), (digest.to_owned(), check));
                &self.cache[tool].1
            }
        };
        let text = arguments.unwrap_or("null").trim_ascii_start();
        let absent = text.starts_with("null");
        if !absent && !text.starts_with('{') {
            return Err(vec![ArgumentMismatch::new(
                "",
                "type",
                "arguments must be a JSON object",
            )]);
        }
        let (validator, work) = match check {
            InputCheck::Compiled(v, expanded) if text.len() / 2 * expanded <= MAX_WORK => {
                (v, text.len() / 2 * expanded)
            }
            _ => return Ok(()),
        };
        let empty = Value::Object(serde_json::Map::new());
        let parsed;
        let instance = if absent {
            &empty
        } else {
            // Already read once as JSON by the router, so this cannot fail but for a depth the
            // first read allowed; such arguments are not checked rather than refused.
            match serde_json::from_str::<Value>(text) {
                Ok(v) => {
                    parsed = v;
                    &parsed
                }
                Err(_) => return Ok(()),
            }
        };
        if validator.is_valid(instance) {
            return Ok(());
        }
        // Every error is collected by `iter_errors` before the first is returned: only for
        // small work; else the first one alone (`validate` stops at it).
        let errors: Box<dyn Iterator<Item = jsonschema::ValidationError<'_>>> =
            if work <= MAX_WORK_FOR_ALL_ERRORS {
                Box::new(validator.iter_errors(instance))
            } else {
                Box::new(validator.validate(instance).err().into_iter())
            };
        let mut mismatches = Vec::new();
        for e in errors {
            use jsonschema::error::ValidationErrorKind as Kind;
            if matches!(
                e.kind(),
                Kind::BacktrackLimitExceeded { .. } | Kind::RegexEngineFailure { .. }
            ) {
                // A pattern the engine could not decide: not refused on the validator's doubt.
                return Ok(());
            }
            if mismatches.len() < MISMATCHES_REPORTED {
                let message = e.masked_with("the value").to_string();
                let path = e.instance_path().to_string();
                mismatches.push(ArgumentMismatch::new(&path, e.kind().keyword(), &message));
            } else {
                break;
            }
        }
        if mismatches.is_empty() {
            // `is_valid` and `iter_errors` disagree: not refused on the validator's doubt.
            return Ok(());
        }
        Err(mismatches)
    }

    fn compile(&mut self, tool: &str, definition: &Value) -> InputCheck {
        self.compiles += 1;
        let schema = match definition.get("inputSchema") {
            None | Some(Value::Null) => return InputCheck::ObjectOnly,
            Some(schema) if accepts_any_object(schema) => return InputCheck::ObjectOnly,
            Some(schema) => schema,
        };
        let expanded = match within_bounds(schema).and_then(|()| expanded_size(schema)) {
            Ok(n) => n,
            Err(why) => {
                self.notice(tool, why);
                return InputCheck::Unchecked;
            }
        };
        let options = jsonschema::options()
            .offline()
            .should_validate_formats(false)
            .with_pattern_options(
                jsonschema::PatternOptions::regex()
                    .size_limit(REGEX_SIZE_LIMIT)
                    .dfa_size_limit(REGEX_SIZE_LIMIT),
            );
        match options.build(schema) {
            Ok(v) => InputCheck::Compiled(Box::new(v), expanded),
            Err(e) => {
                let why = format!(
                    "its inputSchema does not compile ({})",
                    shorten(&e.to_string())
                );
                self.notice(tool, why);
                InputCheck::Unchecked
            }
        }
    }

    fn notice(&mut self, tool: &str, why: String) {
        if self.notices.len() < NOTICES_KEPT {
            self.notices.push((tool.to_owned(), why));
        }
    }

    /// Tools whose current definition's input schema is not checked, with why (each once per
    /// definition, at the first call after it appeared). The reasons are safe to show; the
    /// tool names are the server's.
    pub fn take_notices(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.notices)
    }

    /// Whether a notice is waiting (cheap; checked on every call).
    pub fn has_notices(&self) -> bool {
        !self.notices.is_empty()
    }

    /// Schemas compiled so far (how often the cache missed).
    pub fn compiles(&self) -> u64 {
        self.compiles
    }
}

/// Whether `schema` takes every object: `true`, `{}`, or only `"type": "object"`, empty
/// `properties`, `additionalProperties` `true` or `{}`, and annotations.
fn accepts_any_object(schema: &Value) -> bool {
    let empty = |v: &Value| v.as_object().is_some_and(|m| m.is_empty());
    match schema {
        Value::Bool(true) => true,
        Value::Object(map) => map.iter().all(|(key, value)| match key.as_str() {
            "type" => value == "object",
            "properties" => empty(value),
            "additionalProperties" => value == &Value::Bool(true) || empty(value),
            "$schema" | "title" | "description" | "$comment" | "examples" => true,
            _ => false,
        }),
        _ => false,
    }
}

/// Whether `schema` is small enough to compile: at most [`MAX_SCHEMA_NODES`] values,
/// [`MAX_SCHEMA_DEPTH`] levels and [`MAX_SCHEMA_TEXT`] bytes of keys and strings. Walks at most
/// that much of it (iteratively: a deep schema cannot overflow the stack here).
fn within_bounds(schema: &Value) -> Result<(), String> {
    let mut nodes = 0usize;
    let mut text = 0usize;
    let mut stack: Vec<(&Value, usize)> = vec![(schema, 1)];
    while let Some((value, depth)) = stack.pop() {
        nodes += 1;
        if nodes > MAX_SCHEMA_NODES {
            return Err(format!(
                "its inputSchema has more than {MAX_SCHEMA_NODES} values"
            ));
        }
        if depth > MAX_SCHEMA_DEPTH {
            return Err(format!(
                "its inputSchema is nested more than {MAX_SCHEMA_DEPTH} levels deep"
            ));
        }
        match value {
            Value::String(s) => text += s.len(),
            Value::Array(items) => stack.extend(items.iter().map(|v| (v, depth + 1))),
            Value::Object(map) => {
                for (k, v) in map {
                    text += k.len();
                    stack.push((v, depth + 1));
                }
            }
            _ => {}
        }
        if text > MAX_SCHEMA_TEXT {
            return Err(format!(
                "its inputSchema holds more than {} KiB of text",
                MAX_SCHEMA_TEXT / 1024
            ));
        }
    }
    Ok(())
}

/// How many schema values one validation may visit for one argument value: the schema walked
/// with each `$ref` followed to its target (a local JSON pointer) and each reference cycle
/// unrolled [`UNROLL`] times, stopped past [`MAX_EXPANDED_NODES`]. This bounds validation time
/// where the schema's size does not: references reuse a subschema without repeating its text
/// (forty definitions each referring twice to the next are 2^40 visits). References this walk
/// cannot follow (to another document, an anchor, a dynamic reference, inside a subschema with
/// its own `$id`) make the schema unchecked rather than unbounded. Iterative: no recursion.
fn expanded_size(root: &Value) -> Result<usize, String> {
    enum Step<'a> {
        /// A value, at this depth of the walk.
        Visit(&'a Value, usize),
        /// Leaving a reference's target: its count on the current path goes down.
        Leave(usize),
    }
    let unsupported = |what: &str| {
        Err(format!(
            "its inputSchema has {what}, which this check does not follow"
        ))
    };
    let mut on_path: HashMap<usize, usize> = HashMap::new();
    let mut visited = 0usize;
    let mut steps = vec![Step::Visit(root, 1)];
    while let Some(step) = steps.pop() {
        let value = match step {
            Step::Leave(key) => {
                if let Some(n) = on_path.get_mut(&key) {
                    *n -= 1;
                }
                continue;
            }
            Step::Visit(value, depth) => (value, depth),
        };
        let (value, depth) = value;
        visited += 1;
        if visited > MAX_EXPANDED_NODES {
            return Err(format!(
                "its inputSchema expands (through $ref) to more than {MAX_EXPANDED_NODES} values"
            ));
        }
        if depth > MAX_EXPANDED_DEPTH {
            return Err(format!(
                "its inputSchema nests (through $ref) more than {MAX_EXPANDED_DEPTH} levels deep"
            ));
        }
        match value {
            Value::Array(items) => steps.extend(items.iter().map(|v| Step::Visit(v, depth + 1))),
            Value::Object(map) => {
                for (key, child) in map {
                    match (key.as_str(), child) {
                        ("$ref", Value::String(reference)) => {
                            let target = match reference.strip_prefix('#') {
                                Some("") => Some(root),
                                Some(pointer)
                                    if pointer.starts_with('/') && !pointer.contains('%') =>
                                {
                                    root.pointer(pointer)
                                }
                                _ => None,
                            };
                            let Some(target) = target else {
                                return unsupported("a $ref to another document or an anchor");
                            };
                            let key = target as *const Value as usize;
                            let n = on_path.entry(key).or_default();
                            if *n < UNROLL {
                                *n += 1;
                                steps.push(Step::Leave(key));
                                steps.push(Step::Visit(target, depth + 1));
                            }
                        }
                        ("$dynamicRef" | "$recursiveRef", Value::String(_)) => {
                            return unsupported("a dynamic reference");
                        }
                        ("$id", Value::String(_)) if !std::ptr::eq(value, root) => {
                            return unsupported("a subschema with its own $id");
                        }
                        _ => steps.push(Step::Visit(child, depth + 1)),
                    }
                }
            }
            _ => {}
        }
    }
    Ok(visited)
}

/// At most [`MISMATCH_CHARS`] characters of `text`, on one line, with every control, invisible
/// or bidi character escaped: the validator's messages quote the server's schema (enum values,
/// patterns) and the agent's property names.
fn shorten(text: &str) -> String {
    // Escaped first, then cut: the bound holds for the text as shown.
    let safe = crate::screen::sanitize::review(text);
    match safe.char_indices().nth(MISMATCH_CHARS) {
        Some((at, _)) => format!("{}…", &safe[..at]),
        None => safe.into_owned(),
    }
}
