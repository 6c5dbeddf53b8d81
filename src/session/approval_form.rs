//! The approval form: what the person at the host sees when a gated call needs a grant, and
//! the choices it offers, in plain words. Claude Code shows only the first 3 lines of a form's
//! message (cut at the terminal's width) and nothing after them, so those lines carry the
//! decision: the tool and its arguments, what changed since the last approval, how long each
//! grant lasts. Each choice's label says what it allows.
//!
//! Owns: the message and the labelled schema. Must not touch: prompts and answers (`approvals`),
//! the gate's rules, I/O. Server and agent text (tool names, arguments, catalog lines) is shown
//! through [`sanitize::review`] and cut to fit.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::super::*;
use super::{DECISION_FIELD, Decision};
use crate::screen::sanitize;

/// How much of the call's arguments the form's details show (characters).
const FORM_ARGUMENTS: usize = 600;
/// How wide a line of the form's head may be (columns): Claude Code shows the first 3 lines of
/// a form's message, cut at the terminal's width, and nothing after them.
pub const FORM_HEAD_COLUMNS: usize = 76;
/// How wide a choice's label may be (columns).
const LABEL_COLUMNS: usize = 64;
/// How much of the tool's name the head shows (columns).
const HEAD_TOOL_COLUMNS: usize = 32;

/// The form's schema: one required enum field, its choices titled with what each allows (the
/// form every client era reads). `choices` pairs each offered decision with its label.
pub fn requested_schema(choices: &[(Decision, String)]) -> Value {
    json!({
        "type": "object",
        "properties": {
            DECISION_FIELD: {
                "type": "string",
                "title": "Decision",
                "enum": choices.iter().map(|(d, _)| d.as_str()).collect::<Vec<_>>(),
                "enumNames": choices.iter().map(|(_, l)| l.as_str()).collect::<Vec<_>>(),
            }
        },
        "required": [DECISION_FIELD],
    })
}

/// What the host shows the person: the message (its first 3 lines decide) and the choices.
pub(in crate::session) struct Form {
    pub message: String,
    pub choices: Vec<(Decision, String)>,
}

impl Form {
    /// The `elicitation/create` params (legacy request, or a modern input request).
    pub(in crate::session) fn params(&self, modern: bool) -> Value {
        let mut p =
            json!({"message": self.message, "requestedSchema": requested_schema(&self.choices)});
        if modern {
            p["mode"] = json!("form");
        }
        p
    }
}

/// An epoch id shortened for people (the last 8 characters of the ULID differ between epochs).
fn short(epoch: &str) -> String {
    let n = epoch.chars().count();
    epoch.chars().skip(n.saturating_sub(8)).collect()
}

/// Columns `text` takes on a terminal.
pub fn columns(text: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(text)
}

/// `text` cut to at most `cols` columns, ending in `…` when cut.
fn fit(text: &str, cols: usize) -> String {
    if columns(text) <= cols {
        return text.to_string();
    }
    let mut out = String::new();
    let mut used = 0;
    for c in text.chars() {
        let w = unicode_width::UnicodeWidthChar::width(c).unwrap_or(0);
        if used + w + 1 > cols {
            break;
        }
        used += w;
        out.push(c);
    }
    out.push('…');
    out
}

/// Untrusted text as one line for a person: controls escaped, invisible and bidi characters
/// shown ([`sanitize::review`]).
fn shown(text: &str) -> String {
    sanitize::review(text).into_owned()
}

/// JSON text without the whitespace between its tokens (a host may send it pretty-printed):
/// the same value in fewer columns, every character inside strings kept (the call's arguments
/// are JSON: the router parsed them).
fn compact_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        if in_string {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !c.is_whitespace() {
            out.push(c);
        }
    }
    out
}

/// A tool's name in backticks, for a person (shortened to `cols` columns).
fn tick(tool: &str, cols: usize) -> String {
    format!("`{}`", fit(&shown(tool), cols))
}

/// A list of tool names in backticks that fits `cols` columns: "`a`, `b` and 3 more".
fn tick_list(tools: &[&str], cols: usize) -> String {
    let mut out = String::new();
    for (i, t) in tools.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        let candidate = format!("{out}{sep}{}", tick(t, 24));
        let left = tools.len() - i - 1;
        let reserve = if left > 0 {
            columns(&format!(" and {left} more"))
        } else {
            0
        };
        if i > 0 && columns(&candidate) + reserve > cols {
            return format!("{out} and {} more", tools.len() - i);
        }
        out = candidate;
    }
    out
}

impl Session {
    /// How long a grant of `tools` would last, in a person's words (a per-call tool makes the
    /// whole grant last one call: the gate's stricter mode wins).
    fn tools_lifetime(&self, tools: &BTreeSet<String>) -> &'static str {
        let per_call = tools.iter().any(|t| {
            self.approvals.gate.policy().mode_for(t)
                == crate::policy::approval::ApprovalMode::PerCall
        });
        match (per_call, tools.len()) {
            (false, _) => "until the next rebuild",
            (true, 1) => "for its next call only",
            (true, _) => "for the next call of one of them only",
        }
    }

    /// The form a person decides from. Claude Code shows only the first 3 lines of the message
    /// (each cut at the terminal's width), so they carry what the decision needs, each at most
    /// [`FORM_HEAD_COLUMNS`] wide: the tool and its arguments, what changed since the last
    /// approval, and how long each grant lasts. The details (server, agent run, epoch, the whole
    /// arguments and every choice) follow. Server and agent text (tool names, arguments,
    /// catalog lines) is passed through [`sanitize::review`] and cut to fit.
    pub(super) fn form(
        &self,
        tool: &str,
        epoch: &str,
        requested: &BTreeSet<String>,
        arguments: &str,
    ) -> Form {
        let args = compact_json(arguments);
        let args_shown = shown(&args);
        // Line 1: the tool and its arguments.
        let name = tick(tool, HEAD_TOOL_COLUMNS);
        let room = FORM_HEAD_COLUMNS.saturating_sub(columns(&name) + "Run  with ?".len());
        let line1 = if matches!(args.as_str(), "null" | "{}" | "") {
            format!("Run {name} (no arguments)?")
        } else {
            format!("Run {name} with {}?", fit(&args_shown, room.max(8)))
        };
        // Line 2: what changed since the last approval.
        let line2 = fit(&self.change_head(tool), FORM_HEAD_COLUMNS);
        // Line 3: how long each grant lasts.
        let only_tool = BTreeSet::from([tool.to_string()]);
        let tool_lifetime = self.tools_lifetime(&only_tool);
        let line3 = fit(
            &format!(
                "Allow only this call, or {} {tool_lifetime}; or decline.",
                tick(tool, 24)
            ),
            FORM_HEAD_COLUMNS,
        );
        // The choices, labelled with what each allows.
        let mut choices = vec![
            (Decision::Once, "Only this call".to_string()),
            (
                Decision::Tool,
                fit(
                    &format!("{} {tool_lifetime}", tick(tool, 32)),
                    LABEL_COLUMNS,
                ),
            ),
        ];
        let names: Vec<&str> = requested.iter().map(String::as_str).collect();
        if requested.len() > 1 {
            let lifetime = self.tools_lifetime(requested);
            let room = LABEL_COLUMNS.saturating_sub(lifetime.len() + 1);
            choices.push((
                Decision::Requested,
                format!("{} {lifetime}", tick_list(&names, room)),
            ));
        }
        choices.push((Decision::Deny, "Decline: do not run this call".to_string()));

        // The details, after the head.
        let r = |t: &str| shown(t);
        let mut m = format!("{line1}\n{line2}\n{line3}\n\nDetails:\n");
        m.push_str(&format!(
            "Server `{}`, agent run {}, build (epoch) …{}.\n",
            r(self.label()),
            self.agent_run(),
            short(epoch),
        ));
        m.push_str(&self.change_summary(tool));
        let whole: String = args_shown.chars().take(FORM_ARGUMENTS).collect();
        let cut = if args_shown.chars().nth(FORM_ARGUMENTS).is_some() {
            " … (cut)"
        } else {
            ""
        };
        m.push_str(&format!("Arguments: {whole}{cut}\n"));
        let all: Vec<String> = requested.iter().map(|t| format!("`{}`", r(t))).collect();
        let all: String = all.join(", ").chars().take(FORM_ARGUMENTS).collect();
        m.push_str(&format!(
            "Choices: \"Only this call\" runs this call with these arguments, once. \"{}\" allows `{}` with any arguments {tool_lifetime} (or until the session ends).",
            choices[1].1,
            r(tool),
        ));
        if requested.len() > 1 {
            m.push_str(&format!(
                " \"{}\" allows {all} {}.",
                choices[2].1,
                self.tools_lifetime(requested)
            ));
        }
        m.push_str(" \"Decline\" refuses the call; the agent is told not to retry it.");
        Form {
            message: m,
            choices,
        }
    }

    /// What changed since the last approval, in one plain line (the form's second line).
    fn change_head(&self, tool: &str) -> String {
        let since = self.since_last_approval();
        if since.is_null() {
            return match &self.approvals.baseline {
                Some(_) => "No rebuild since your last approval.".into(),
                None => "First approval in this session.".into(),
            };
        }
        let build = if since["identity"].as_str().unwrap_or("").is_empty() {
            "Server restarted (same build) since your last approval"
        } else {
            "New build since your last approval"
        };
        let Some(lines) = since["catalog"].as_array() else {
            return format!("{build}.");
        };
        let mine = |sign: &str| {
            lines.iter().filter_map(Value::as_str).any(|l| {
                l.strip_prefix(sign)
                    .is_some_and(|body| body == tool || body.starts_with(&format!("{tool}:")))
            })
        };
        let definition = if mine("+ ") {
            "the tool is new"
        } else if mine("~ ") {
            "tool definition changed"
        } else {
            "tool definition unchanged"
        };
        format!("{build}; {definition}.")
    }

    /// What changed since the last approved epoch, for one tool (issue 14, item 5).
    fn change_summary(&self, tool: &str) -> String {
        let since = self.since_last_approval();
        if since.is_null() {
            return match &self.approvals.baseline {
                Some(_) => "No rebuild since the last approval.\n".into(),
                None => "First approval in this session.\n".into(),
            };
        }
        let identity = since["identity"].as_str().unwrap_or("");
        let prefix = format!("{tool}:");
        let lines: Vec<String> = since["catalog"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter(|l| {
                let body = l.get(2..).unwrap_or("");
                body == tool || body.starts_with(&prefix)
            })
            .map(|l| sanitize::review(l).into_owned())
            .collect();
        let identity = if identity.is_empty() {
            "nothing (restart only)".to_string()
        } else if identity.contains(',') {
            identity.to_string()
        } else {
            format!("{identity} only")
        };
        let catalog = if lines.is_empty() {
            "tool definition unchanged".to_string()
        } else {
            format!("tool definition changed: {}", lines.join("; "))
        };
        format!(
            "Since the last approved epoch …{}: identity changed: {identity}; {catalog}.\n",
            short(since["epoch"].as_str().unwrap_or("?"))
        )
    }
}
