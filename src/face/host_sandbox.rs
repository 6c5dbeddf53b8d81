//! The host's sandbox, set up for the user (issue 36, item 1): what Claude Code must be told so
//! that the agent's own shell cannot approve its calls or read the audit key.
//!
//! The agent is a process of the user's uid: nothing on the control socket or in the state
//! directory tells it from the human. Claude Code can keep it out: its Bash sandboxed
//! (bubblewrap on Linux, Seatbelt on macOS, unix sockets blocked), with no way around it, and its
//! file tools and sandboxed commands denied the state directory. This module owns those
//! settings: the directories to protect ([`protected_dirs`]), the project's
//! `.claude/settings.json` with them merged in ([`merge_settings`]: the user's keys kept, a
//! stricter value never weakened, what was added said), and the check `status` makes of every
//! settings file Claude Code reads ([`check`]: one line each for what is missing or weakened).
//!
//! Settings files are files the agent can edit: they are untrusted input, read bounded through
//! the file door, and a file that does not parse is one plain line, never a panic. It also owns
//! the in-order JSON object editing the host configuration merges share ([`OrderedMembers`],
//! [`object_text`]).

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The project settings file Claude Code shares with the team (relative to the project).
pub const SETTINGS_FILE: &str = ".claude/settings.json";

/// The largest settings file read (a larger one is reported, not read).
const SETTINGS_LIMIT: u64 = 1 << 20;

/// The sandbox keys `init` sets, each with the value that holds.
const SANDBOX_KEYS: [(&str, bool); 3] = [
    ("enabled", true),
    ("failIfUnavailable", true),
    ("allowUnsandboxedCommands", false),
];

/// The directories the agent must not read or edit, and why one could not be named.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protected {
    /// Absolute, none below another.
    pub dirs: Vec<PathBuf>,
    /// Why a directory could not be put in a rule (one line each).
    pub problems: Vec<String>,
}

/// The state directory (audit key, anchors) and the control socket's directory, as this
/// environment resolves them (see [`crate::audit::KeyStore::from_env`] and
/// [`crate::face::control_socket::socket_dir`]).
pub fn protected_dirs() -> Protected {
    let mut candidates = Vec::new();
    let mut problems = Vec::new();
    match crate::audit::KeyStore::from_env() {
        Ok(keys) => candidates.push(keys.dir().to_path_buf()),
        Err(e) => problems.push(format!(
            "the state directory (audit key) could not be resolved ({e}); set CARGO_MCP_DEV_HOME or HOME and run init again"
        )),
    }
    candidates.push(crate::face::control_socket::socket_dir());
    // Every directory a client may send a request (and its proof) to, not only the first:
    // the agent must not bind a socket in any of them (red team, issue 36).
    candidates.extend(crate::face::control_socket::socket_dirs());
    candidates
        .push(std::env::temp_dir().join(format!("cmd-{}", crate::base::sys::unix::current_uid())));
    protected_from(candidates, problems)
}

/// `candidates` without repeats or directories below another; one a rule cannot name safely is
/// left out with why.
pub fn protected_from(candidates: Vec<PathBuf>, mut problems: Vec<String>) -> Protected {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for dir in candidates {
        let Some(text) = dir.to_str() else {
            problems.push(format!(
                "{} is not valid UTF-8: no rule can name it",
                dir.display()
            ));
            continue;
        };
        if !dir.is_absolute() {
            problems.push(format!("{text} is not an absolute path: no rule names it"));
            continue;
        }
        // Claude Code reads these as gitignore-style patterns: a path with pattern syntax in it
        // would match something else (and leave the directory open while we said it was not).
        if text
            .chars()
            .any(|c| "*?[]{}()\\!".contains(c) || c.is_control())
        {
            problems.push(format!(
                "{:?} holds pattern characters: no rule can name it exactly; deny it by hand",
                text
            ));
            continue;
        }
        if dirs.iter().any(|d| dir.starts_with(d)) {
            continue;
        }
        dirs.retain(|d| !d.starts_with(&dir));
        dirs.push(dir);
    }
    Protected { dirs, problems }
}

/// `Read(//dir/**)` and `Edit(//dir/**)` for each directory (`//` starts an absolute path in a
/// Claude Code permission rule; a single `/` is relative to the settings file).
pub fn deny_rules(dirs: &[PathBuf]) -> Vec<String> {
    let mut rules = Vec::new();
    for d in dirs {
        let d = d.display().to_string();
        let d = d.trim_end_matches('/');
        for tool in ["Read", "Edit"] {
            rules.push(format!("{tool}(/{d}/**)"));
        }
    }
    rules
}

/// A settings file with our rules merged in, and what was added (for the user).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsMerge {
    pub text: String,
    pub added: Vec<String>,
}

/// `existing` (a `.claude/settings.json`, empty when there is none) with the deny `rules` and the
/// sandbox keys set; `None` when everything is there already. Every other member keeps its place
/// and its text; a value stricter than ours is kept. An error (why, for the user) when the file
/// or one of the members we set is not what Claude Code reads.
pub fn merge_settings(existing: &str, rules: &[String]) -> Result<Option<SettingsMerge>, String> {
    let doc = object_members(existing)?;
    let mut top = doc.owned();
    let mut added = Vec::new();

    // permissions.deny: the rules missing, appended.
    let (mut permissions, at) = member_object(&top, "permissions")?;
    let deny_at = permissions.iter().position(|(k, _)| k == "deny");
    let mut deny: Vec<Value> = match deny_at {
        Some(i) => serde_json::from_str(&permissions[i].1)
            .map_err(|_| "its `permissions.deny` is not a list".to_string())?,
        None => Vec::new(),
    };
    let mut deny_changed = false;
    for rule in rules {
        if !deny.iter().any(|r| r.as_str() == Some(rule)) {
            deny.push(Value::String(rule.clone()));
            added.push(format!("permissions.deny {rule}"));
            deny_changed = true;
        }
    }
    if deny_changed {
        let text = array_text(&deny, 6);
        match deny_at {
            Some(i) => permissions[i].1 = text,
            None => permissions.push(("deny".into(), text)),
        }
        set_member(&mut top, at, "permissions", members_text(&permissions, 2));
    }

    // sandbox: each key at the value that holds, unless it is there already.
    let (mut sandbox, at) = member_object(&top, "sandbox")?;
    let mut sandbox_changed = false;
    for (key, want) in SANDBOX_KEYS {
        let i = sandbox.iter().position(|(k, _)| k == key);
        let now = i.and_then(|i| serde_json::from_str::<Value>(&sandbox[i].1).ok());
        if now.as_ref().and_then(Value::as_bool) == Some(want) {
            continue;
        }
        let was = match &now {
            Some(v) => format!(" (was {v})"),
            None => String::new(),
        };
        added.push(format!("sandbox.{key} {want}{was}"));
        match i {
            Some(i) => sandbox[i].1 = want.to_string(),
            None => sandbox.push((key.to_string(), want.to_string())),
        }
        sandbox_changed = true;
    }
    if sandbox_changed {
        set_member(&mut top, at, "sandbox", members_text(&sandbox, 2));
    }
    if added.is_empty() {
        return Ok(None);
    }
    Ok(Some(SettingsMerge {
        text: format!("{}\n", members_text(&top, 0)),
        added,
    }))
}

/// An object's members in order, each value as JSON text.
pub type Members = Vec<(String, String)>;

/// The members of `key`'s object in `top` (empty when absent) and where it is.
fn member_object(top: &[(String, String)], key: &str) -> Result<(Members, Option<usize>), String> {
    let at: Vec<usize> = (0..top.len()).filter(|&i| top[i].0 == key).collect();
    if at.len() > 1 {
        return Err(format!("`{key}` appears more than once"));
    }
    let Some(&i) = at.first() else {
        return Ok((Vec::new(), None));
    };
    let inner: OrderedMembers<'_> =
        serde_json::from_str(&top[i].1).map_err(|_| format!("its `{key}` is not a JSON object"))?;
    // Claude Code reads the last of a repeated member; reading the first would find our values
    // where they no longer count (red team, issue 36).
    let mut seen = std::collections::BTreeSet::new();
    if let Some((twice, _)) = inner.0.iter().find(|(k, _)| !seen.insert(k.as_str())) {
        return Err(format!("`{key}.{twice}` appears more than once"));
    }
    Ok((inner.owned(), Some(i)))
}

/// A host file's text as the members of its top-level object (an empty file holds none); an
/// error (why, for the user) when it is not valid JSON or not an object.
pub fn object_members(text: &str) -> Result<OrderedMembers<'_>, String> {
    let text = if text.trim().is_empty() { "{}" } else { text };
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .map_err(|e| format!("it is not valid JSON ({e})"))?;
    serde_json::from_str(text).map_err(|_| "its top level is not a JSON object".to_string())
}

fn set_member(top: &mut Vec<(String, String)>, at: Option<usize>, key: &str, text: String) {
    match at {
        Some(i) => top[i].1 = text,
        None => top.push((key.to_string(), text)),
    }
}

fn members_text(members: &[(String, String)], indent: usize) -> String {
    let borrowed: Vec<(String, &str)> = members
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str()))
        .collect();
    object_text(&borrowed, indent)
}

/// A JSON array, one value a line, its closing bracket indented by `indent - 2` spaces.
fn array_text(values: &[Value], indent: usize) -> String {
    if values.is_empty() {
        return "[]".to_string();
    }
    let inner = " ".repeat(indent);
    let body: Vec<String> = values.iter().map(|v| format!("{inner}{v}")).collect();
    format!("[\n{}\n{}]", body.join(",\n"), " ".repeat(indent - 2))
}

/// A JSON object's members in the order written, each value as its original text.
pub struct OrderedMembers<'a>(pub Vec<(String, &'a serde_json::value::RawValue)>);

impl OrderedMembers<'_> {
    /// The members with their values' text copied.
    pub fn owned(&self) -> Members {
        self.0
            .iter()
            .map(|(k, v)| (k.clone(), v.get().to_string()))
            .collect()
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for OrderedMembers<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Members<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Members<'a> {
            type Value = OrderedMembers<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry()? {
                    members.push(member);
                }
                Ok(OrderedMembers(members))
            }
        }
        d.deserialize_map(Members(std::marker::PhantomData))
    }
}

/// `members` as a JSON object whose closing brace is indented by `indent` spaces.
pub fn object_text(members: &[(String, &str)], indent: usize) -> String {
    if members.is_empty() {
        return "{}".to_string();
    }
    let inner = " ".repeat(indent + 2);
    let body: Vec<String> = members
        .iter()
        .map(|(k, v)| {
            format!(
                "{inner}{}: {v}",
                serde_json::to_string(k).expect("a string")
            )
        })
        .collect();
    format!("{{\n{}\n{}}}", body.join(",\n"), " ".repeat(indent))
}

// ----- the check `status` makes -----------------------------------------------------------------

/// One settings file Claude Code reads, weakest first.
#[derive(Debug, Clone)]
pub struct Source {
    /// How the user knows it (a path).
    pub name: String,
    /// Its JSON, `None` when there is no such file; `Err` why it could not be read.
    pub doc: Result<Option<Value>, String>,
}

/// The settings files Claude Code reads for a project at `project`, weakest first: the user's
/// (`$CLAUDE_CONFIG_DIR/settings.json`, else `~/.claude/settings.json`), the project's shared and
/// local files, then the managed policy (Linux's `/etc/claude-code/managed-settings.json`,
/// macOS's under `/Library/Application Support/ClaudeCode`).
pub fn sources(project: &Path) -> Vec<Source> {
    let mut paths: Vec<PathBuf> = Vec::new();
    if let Some(dir) = std::env::var_os("CLAUDE_CONFIG_DIR").filter(|d| !d.is_empty()) {
        paths.push(PathBuf::from(dir).join("settings.json"));
    } else if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        paths.push(PathBuf::from(home).join(".claude/settings.json"));
    }
    paths.push(project.join(SETTINGS_FILE));
    paths.push(project.join(".claude/settings.local.json"));
    paths.push(if cfg!(target_os = "macos") {
        PathBuf::from("/Library/Application Support/ClaudeCode/managed-settings.json")
    } else {
        PathBuf::from("/etc/claude-code/managed-settings.json")
    });
    paths
        .into_iter()
        .map(|p| Source {
            name: p.display().to_string(),
            doc: read_settings(&p),
        })
        .collect()
}

fn read_settings(path: &Path) -> Result<Option<Value>, String> {
    let text = match crate::base::beneath::followed::read_to_string(path, SETTINGS_LIMIT) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(format!(
                "could not be read here ({e}; a sandbox hides it?): run `cargo mcp-dev status` in your own terminal"
            ));
        }
        Err(e) => return Err(format!("could not be read ({e})")),
    };
    if text.trim().is_empty() {
        return Ok(Some(Value::Object(Default::default())));
    }
    match serde_json::from_str::<Value>(&text) {
        Ok(v) if v.is_object() => Ok(Some(v)),
        Ok(_) => Err("is not a JSON object; Claude Code ignores it".into()),
        Err(e) => Err(format!(
            "is not valid JSON ({e}); Claude Code ignores it, so its sandbox settings do not hold"
        )),
    }
}

/// What `status` says about Claude Code's settings for the project at `project`: one line
/// each for what is missing or weakened, with what to do; empty when they hold.
pub fn check(project: &Path) -> Vec<String> {
    let protected = protected_dirs();
    check_sources(
        &sources(project),
        &deny_rules(&protected.dirs),
        bwrap_on_path(),
    )
}

/// [`check`] on settings already read (pure, for tests). Precedence as Claude Code's: a later
/// source's value wins; deny rules from every source count.
pub fn check_sources(sources: &[Source], rules: &[String], bwrap_on_path: bool) -> Vec<String> {
    const FIX: &str = "run `cargo mcp-dev init` in the project to write it";
    let mut lines = Vec::new();
    let mut docs = Vec::new();
    for s in sources {
        match &s.doc {
            Ok(Some(v)) => docs.push((s.name.as_str(), v)),
            Ok(None) => {}
            Err(why) => lines.push(format!("Claude Code settings: {} {why}", s.name)),
        }
    }
    // The effective value of a key: the last source that sets it.
    let effective = |path: &[&str]| -> Option<(&str, &Value)> {
        docs.iter().rev().find_map(|(name, doc)| {
            let mut v = *doc;
            for k in path {
                v = v.get(k)?;
            }
            Some((*name, v))
        })
    };
    let shown = |v: &Value| crate::screen::sanitize::json_text(&v.to_string()).into_owned();
    let sandbox_on = effective(&["sandbox", "enabled"]);
    match sandbox_on {
        Some((_, Value::Bool(true))) => {}
        Some((name, v)) => lines.push(format!(
            "Claude Code's sandbox is off: `sandbox.enabled` is {} in {name}; set it to true ({FIX}): without it the agent's shell can approve its own calls and read the audit key",
            shown(v)
        )),
        None => lines.push(format!(
            "Claude Code's sandbox is not set up for this project (no `sandbox.enabled`); {FIX}: without it the agent's shell can approve its own calls and read the audit key"
        )),
    }
    match effective(&["sandbox", "failIfUnavailable"]) {
        Some((_, Value::Bool(true))) => {}
        other => lines.push(format!(
            "Claude Code runs commands unsandboxed when its sandbox cannot start: `sandbox.failIfUnavailable` is {}; set it to true ({FIX})",
            where_set(other, &shown)
        )),
    }
    match effective(&["sandbox", "allowUnsandboxedCommands"]) {
        Some((_, Value::Bool(false))) => {}
        other => lines.push(format!(
            "the agent may rerun a command outside Claude Code's sandbox: `sandbox.allowUnsandboxedCommands` is {} (the default is true); set it to false ({FIX})",
            where_set(other, &shown)
        )),
    }
    if let Some((name, Value::Bool(true))) =
        effective(&["sandbox", "network", "allowAllUnixSockets"])
    {
        lines.push(format!(
            "Claude Code's sandbox lets commands reach every unix socket (`sandbox.network.allowAllUnixSockets: true` in {name}), the control socket among them: remove it"
        ));
    }
    if let Some((name, Value::Bool(true))) = effective(&["sandbox", "filesystem", "disabled"]) {
        lines.push(format!(
            "Claude Code's sandbox does not restrict files (`sandbox.filesystem.disabled: true` in {name}): the audit key is readable; remove it"
        ));
    }
    for (name, doc) in &docs {
        let excluded = doc
            .pointer("/sandbox/excludedCommands")
            .and_then(Value::as_array);
        for entry in excluded.into_iter().flatten() {
            if entry.as_str().is_some_and(excludes_cargo) {
                lines.push(format!(
                    "`sandbox.excludedCommands` in {name} has {}, which runs cargo outside Claude Code's sandbox (so `cargo mcp-dev approve` reaches the control socket): remove it",
                    shown(entry)
                ));
            } else {
                // Any command run outside the sandbox runs whatever it is asked to (a shell,
                // `make`, `npm run`, a git alias, `docker -v`), cargo among them (red team).
                lines.push(format!(
                    "`sandbox.excludedCommands` in {name} has {}, which runs outside Claude Code's sandbox, and so does anything it runs (`cargo mcp-dev approve`, a read of the audit key): remove it unless it can run nothing else",
                    shown(entry)
                ));
            }
        }
        // A read allowance at or below a denied directory makes it readable again.
        let protected = denied_dirs(rules);
        let allowed = doc
            .pointer("/sandbox/filesystem/allowRead")
            .and_then(Value::as_array);
        for entry in allowed.into_iter().flatten() {
            let Some(text) = entry.as_str() else { continue };
            if let Some(dir) = protected.iter().find(|d| reopens(text, d)) {
                lines.push(format!(
                    "`sandbox.filesystem.allowRead` in {name} has {}, which makes {} readable to the agent's commands again (the audit key among it): remove it",
                    shown(entry),
                    dir
                ));
            }
        }
    }
    let denied: Vec<&str> = docs
        .iter()
        .filter_map(|(_, d)| d.pointer("/permissions/deny").and_then(Value::as_array))
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let missing: Vec<&str> = rules
        .iter()
        .map(String::as_str)
        .filter(|r| !denied.contains(r))
        .collect();
    if !missing.is_empty() {
        lines.push(format!(
            "Claude Code may read or edit cargo mcp-dev's state (the audit key): `permissions.deny` lacks {}; {FIX}",
            missing.join(", ")
        ));
    }
    let sandbox_wanted = matches!(sandbox_on, Some((_, Value::Bool(true))));
    if sandbox_wanted && !bwrap_on_path {
        lines.push(
            "Claude Code's sandbox needs bubblewrap, and `bwrap` is not on PATH: install it (Debian/Ubuntu: `apt-get install bubblewrap socat`)"
                .to_string(),
        );
    }
    lines
}

/// What still weakens the sandbox in a settings text `init` wrote (a key of the user's it
/// keeps, such as `allowAllUnixSockets`, or no bubblewrap): the lines [`check_sources`] gives.
pub fn check_written(name: &str, text: &str, rules: &[String]) -> Vec<String> {
    let doc = serde_json::from_str::<Value>(text)
        .map(Some)
        .map_err(|e| e.to_string());
    check_sources(
        &[Source {
            name: name.to_string(),
            doc,
        }],
        rules,
        bwrap_on_path(),
    )
}

/// Whether Claude Code's sandbox has what it needs here (bubblewrap, on Linux).
fn bwrap_on_path() -> bool {
    cfg!(not(target_os = "linux")) || crate::identity::workspace::find_on_path("bwrap").is_some()
}

fn where_set(found: Option<(&str, &Value)>, shown: &dyn Fn(&Value) -> String) -> String {
    match found {
        Some((name, v)) => format!("{} in {name}", shown(v)),
        None => "not set".to_string(),
    }
}

/// The directories our deny rules name (`Read(//dir/**)` -> `/dir`).
fn denied_dirs(rules: &[String]) -> Vec<String> {
    rules
        .iter()
        .filter_map(|r| r.strip_prefix("Read(/")?.strip_suffix("/**)"))
        .map(str::to_string)
        .collect()
}

/// Whether an `allowRead` path (absolute, `//`-absolute, with a trailing `/`, `/*` or `/**`)
/// is `dir` or below it.
fn reopens(entry: &str, dir: &str) -> bool {
    let mut path = entry.trim();
    if let Some(rest) = path.strip_prefix("//") {
        path = &path[path.len() - rest.len() - 1..];
    }
    let path = path
        .trim_end_matches("/**")
        .trim_end_matches("/*")
        .trim_end_matches('/');
    let path = std::path::Path::new(path);
    path.starts_with(dir)
}

/// Whether an `excludedCommands` entry (a command, a prefix with `:*` or ` *`, or a pattern)
/// matches `cargo` or `cargo-mcp-dev`.
pub fn excludes_cargo(entry: &str) -> bool {
    let word = entry
        .trim()
        .split(|c: char| c.is_whitespace() || c == ':')
        .next()
        .unwrap_or("");
    let word = word.rsplit('/').next().unwrap_or(word);
    ["cargo", "cargo-mcp-dev"]
        .iter()
        .any(|cmd| glob_matches(word, cmd))
}

/// `*` (any run) and `?` (one character) against `text`.
fn glob_matches(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules() -> Vec<String> {
        deny_rules(&[PathBuf::from("/home/u/.local/state/cargo-mcp-dev")])
    }

    #[test]
    fn rules_name_the_directory_absolutely() {
        assert_eq!(
            rules(),
            [
                "Read(//home/u/.local/state/cargo-mcp-dev/**)",
                "Edit(//home/u/.local/state/cargo-mcp-dev/**)"
            ]
        );
    }

    #[test]
    fn nested_repeated_and_unnameable_directories() {
        let p = protected_from(
            vec![
                "/s/state".into(),
                "/s/state/run".into(),
                "/run/user/1/cargo-mcp-dev".into(),
                "/s/state".into(),
                "/tmp/a*b".into(),
                "rel".into(),
            ],
            Vec::new(),
        );
        assert_eq!(
            p.dirs,
            [
                PathBuf::from("/s/state"),
                PathBuf::from("/run/user/1/cargo-mcp-dev")
            ]
        );
        assert_eq!(p.problems.len(), 2, "{:?}", p.problems);
        // A parent given after its child replaces it.
        let p = protected_from(vec!["/s/state/run".into(), "/s/state".into()], Vec::new());
        assert_eq!(p.dirs, [PathBuf::from("/s/state")]);
    }

    #[test]
    fn a_new_file_gets_everything() {
        let m = merge_settings("", &rules()).unwrap().unwrap();
        let v: Value = serde_json::from_str(&m.text).unwrap();
        assert_eq!(
            v,
            json!({"permissions": {"deny": rules()},
                   "sandbox": {"enabled": true, "failIfUnavailable": true,
                               "allowUnsandboxedCommands": false}})
        );
        assert_eq!(m.added.len(), 5, "{:?}", m.added);
        // Merging again adds nothing.
        assert_eq!(merge_settings(&m.text, &rules()).unwrap(), None);
    }

    #[test]
    fn the_users_keys_stay_and_weaker_values_are_raised() {
        let mine = r#"{"model": "x", "permissions": {"allow": ["Bash(ls)"], "deny": ["Read(.env)"]},
            "sandbox": {"enabled": false, "excludedCommands": ["docker"], "allowUnsandboxedCommands": true},
            "hooks": {}}"#;
        let m = merge_settings(mine, &rules()).unwrap().unwrap();
        let v: Value = serde_json::from_str(&m.text).unwrap();
        assert_eq!(v["model"], json!("x"));
        assert_eq!(v["hooks"], json!({}));
        assert_eq!(v["permissions"]["allow"], json!(["Bash(ls)"]));
        let deny = v["permissions"]["deny"].as_array().unwrap();
        assert_eq!(deny[0], json!("Read(.env)"));
        assert_eq!(deny.len(), 3);
        assert_eq!(v["sandbox"]["enabled"], json!(true));
        assert_eq!(v["sandbox"]["allowUnsandboxedCommands"], json!(false));
        assert_eq!(v["sandbox"]["excludedCommands"], json!(["docker"]));
        assert!(
            m.added
                .contains(&"sandbox.enabled true (was false)".to_string()),
            "{:?}",
            m.added
        );
        // Member order as written.
        let keys: Vec<&str> = ["\"model\"", "\"permissions\"", "\"sandbox\"", "\"hooks\""]
            .into_iter()
            .collect();
        let at: Vec<usize> = keys.iter().map(|k| m.text.find(k).unwrap()).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{}", m.text);
    }

    #[test]
    fn what_cannot_be_merged_is_refused() {
        for (mine, why) in [
            ("{", "not valid JSON"),
            ("[]", "top level is not a JSON object"),
            (r#"{"sandbox": true}"#, "`sandbox` is not a JSON object"),
            (
                r#"{"permissions": {"deny": "Read(x)"}}"#,
                "`permissions.deny` is not a list",
            ),
            (
                r#"{"sandbox": {}, "sandbox": {}}"#,
                "`sandbox` appears more than once",
            ),
        ] {
            let e = merge_settings(mine, &rules()).unwrap_err();
            assert!(e.contains(why), "{mine}: {e}");
        }
    }

    fn src(name: &str, doc: Value) -> Source {
        Source {
            name: name.into(),
            doc: Ok(Some(doc)),
        }
    }

    fn written() -> Value {
        serde_json::from_str(&merge_settings("", &rules()).unwrap().unwrap().text).unwrap()
    }

    #[test]
    fn what_init_writes_passes_the_check() {
        let lines = check_sources(&[src("p", written())], &rules(), true);
        assert!(lines.is_empty(), "{lines:?}");
    }

    #[test]
    fn each_weakening_is_one_line() {
        let none = check_sources(&[], &rules(), true);
        assert!(none[0].contains("not set up"), "{none:?}");
        assert!(
            none.iter().any(|l| l.contains("permissions.deny")),
            "{none:?}"
        );

        let mut weak = written();
        weak["sandbox"]["network"] = json!({"allowAllUnixSockets": true});
        weak["sandbox"]["excludedCommands"] = json!(["cargo:*", "docker", "*"]);
        let lines = check_sources(&[src("p", weak)], &rules(), false);
        assert_eq!(lines.len(), 5, "{lines:?}");
        assert!(lines[0].contains("allowAllUnixSockets"), "{lines:?}");
        assert!(
            lines[1].contains("\"cargo:*\"") && lines[1].contains("runs cargo"),
            "{lines:?}"
        );
        // Any excluded command runs what it is asked to outside the sandbox (red team).
        assert!(
            lines[2].contains("\"docker\"") && lines[2].contains("anything it runs"),
            "{lines:?}"
        );
        assert!(lines[3].contains("\"*\""), "{lines:?}");
        assert!(lines[4].contains("bwrap"), "{lines:?}");

        // A later (stronger-precedence) source turning it off wins; deny rules add up.
        let local = json!({"sandbox": {"enabled": false, "allowUnsandboxedCommands": true}});
        let lines = check_sources(&[src("p", written()), src("local", local)], &rules(), true);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("sandbox is off") && lines[0].contains("local"));
        assert!(lines[1].contains("allowUnsandboxedCommands"));
    }

    #[test]
    fn an_unreadable_file_is_a_line() {
        let bad = Source {
            name: "p".into(),
            doc: Err("is not valid JSON (x)".into()),
        };
        let lines = check_sources(&[bad], &rules(), true);
        assert_eq!(lines[0], "Claude Code settings: p is not valid JSON (x)");
    }

    #[test]
    fn read_settings_never_panics_on_what_the_agent_wrote() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.json");
        for (text, ok) in [
            ("{\"sandbox\":", false),
            ("[1]", false),
            ("\u{0}", false),
            ("", true),
            ("{}", true),
        ] {
            std::fs::write(&p, text).unwrap();
            assert_eq!(read_settings(&p).is_ok(), ok, "{text:?}");
        }
        std::fs::write(&p, vec![b' '; (SETTINGS_LIMIT + 1) as usize]).unwrap();
        assert!(read_settings(&p).is_err());
        // A named pipe or a device planted there: refused at once, never waited on or read.
        let fifo = d.path().join("fifo.json");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        assert!(read_settings(&fifo).is_err());
        let dev = d.path().join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &dev).unwrap();
        assert!(read_settings(&dev).is_err());
        assert_eq!(read_settings(&d.path().join("none")).unwrap(), None);
    }

    /// Red team (issue 36, item 4): an `excludedCommands` entry runs that command outside the
    /// sandbox, and a command that runs other commands runs `cargo mcp-dev approve` (or reads
    /// the audit key) with it: `bash -c`, `env cargo ..`, `make` or `npm run` with a target the
    /// agent wrote, `git` with an alias or `-c core.pager=..`, `docker run -v <state dir>:/k`.
    /// `status` flags only entries that name cargo itself, so with any of these it says the
    /// settings hold while the agent can approve its own calls.
    #[test]
    fn an_excluded_command_that_runs_other_commands_is_flagged() {
        for entry in [
            "bash",
            "sh:*",
            "env",
            "xargs",
            "make",
            "npm run *",
            "git",
            "docker",
            "python3",
        ] {
            let mut settings = written();
            settings["sandbox"]["excludedCommands"] = json!([entry]);
            let lines = check_sources(&[src("p", settings)], &rules(), true);
            assert!(
                lines.iter().any(|l| l.contains("excludedCommands")),
                "`excludedCommands: [{entry:?}]` lets the agent run `{entry}` outside the sandbox (and cargo mcp-dev approve through it), yet status says all holds: {lines:?}"
            );
        }
    }

    /// Red team (issue 36, items 1 and 4): `approve`/`status` send the proof to the first
    /// socket they find among every place a socket can be ([`crate::face::control_socket::socket_paths`]:
    /// the other socket directories, `/tmp/cargo-mcp-dev-<uid>`, `/tmp/cmd-<uid>`), but the
    /// rules `init` writes and `status` checks deny the agent only the state directory and the
    /// first socket directory. The agent may create the others (the sandbox lets it write
    /// `/tmp`-like places), bind a socket there while no supervisor answers earlier, and be
    /// handed the proof by the human's next `status`.
    #[test]
    fn every_place_a_client_sends_the_proof_is_denied_to_the_agent() {
        let protected = protected_dirs();
        let paths = crate::face::control_socket::socket_paths(Path::new("/p/target"), "demo");
        for p in &paths {
            let dir = p.parent().unwrap();
            assert!(
                protected.dirs.iter().any(|d| dir.starts_with(d)),
                "the client may send the proof to a socket in {}, which no deny rule covers (protected: {:?})",
                dir.display(),
                protected.dirs
            );
        }
    }

    /// Red team (issue 36, item 4): Claude Code's sandbox also reads
    /// `sandbox.filesystem.allowRead`, whose paths at or beneath a read deny are readable again
    /// (a deny loses to an `allowRead` beneath it; `allowWrite` does not beat a write deny, so
    /// it is not tested here). A settings file that re-allows the state directory or the key
    /// lets the agent's shell read the audit key (forge the log, make the control proof);
    /// `status` never looks at it and says the settings hold.
    #[test]
    fn a_filesystem_allowance_over_the_state_directory_is_flagged() {
        let state = "/home/u/.local/state/cargo-mcp-dev";
        for (key, entry) in [
            ("allowRead", state.to_string()),
            ("allowRead", format!("{state}/audit.key")),
            ("allowRead", format!("{state}/**")),
        ] {
            let mut settings = written();
            settings["sandbox"]["filesystem"] = json!({ key: [entry.clone()] });
            let lines = check_sources(&[src("p", settings)], &rules(), true);
            assert!(
                lines.iter().any(|l| l.contains(key)),
                "`sandbox.filesystem.{key}: [{entry:?}]` opens the state directory to the agent's shell, yet status says all holds: {lines:?}"
            );
        }
    }

    /// Red team (issue 36, item 4): a member given twice inside `permissions` or `sandbox`.
    /// Claude Code (JSON.parse) takes the last one; the merge reads the first, finds our values
    /// there and says nothing needs adding, so `init` writes nothing and says nothing while the
    /// sandbox is off and no rule denies the state directory. (`status`, reading the last, is
    /// right.) The merge must read what Claude Code reads, or refuse a repeated member.
    #[test]
    fn a_repeated_member_is_not_read_as_the_first_one() {
        let mut ours = written();
        let text = ours.to_string();
        let deny = ours["permissions"]["deny"].to_string();
        let shadowed = text
            .replacen(
                &format!("\"deny\":{deny}"),
                &format!("\"deny\":{deny},\"deny\":[]"),
                1,
            )
            .replacen("\"enabled\":true", "\"enabled\":true,\"enabled\":false", 1);
        assert_ne!(shadowed, text, "the test shadows both members");
        ours = serde_json::from_str(&shadowed).unwrap();
        // What Claude Code reads: the last members.
        assert_eq!(ours["sandbox"]["enabled"], json!(false));
        assert_eq!(ours["permissions"]["deny"], json!([]));
        assert!(
            !matches!(merge_settings(&shadowed, &rules()), Ok(None)),
            "the merge finds nothing to add to a file whose sandbox is off and whose deny list is empty: {shadowed}"
        );
    }

    #[test]
    fn cargo_in_excluded_commands() {
        for yes in [
            "cargo",
            "cargo build",
            "cargo:*",
            "cargo *",
            "*",
            "carg?",
            "/usr/bin/cargo",
            "cargo-mcp-dev",
        ] {
            assert!(excludes_cargo(yes), "{yes}");
        }
        for no in ["docker", "npm run *", "cargoo", "git"] {
            assert!(!excludes_cargo(no), "{no}");
        }
    }
}
