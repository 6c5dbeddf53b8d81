//! `cargo mcp-dev init`: adds cargo mcp-dev to an existing server package: the
//! `[package.metadata.mcp-dev]` block, host configuration snippets, `UPDATE-CONTRACT.md`, a CI
//! workflow and watch-loop templates; then builds it once ([`super::first_build`]) so that a
//! host opened next starts warm.
//!
//! Owns which files are generated, where, and the rule that no existing file is overwritten
//! without `--force` (one `created|overwrote X` line per file written, one line naming every file
//! kept, and a single line when the package is already fully initialized). With `--force` the
//! project's host configurations are merged into (only this server's entry is set), never
//! replaced. Every file is planned and checked before any is written ([`Writer`]): a refused
//! run writes nothing, and nothing is written through a symbolic link or a linked directory.
//! The user's Cargo.toml is only ever appended to, never reformatted, and only when it has no
//! `[package.metadata.mcp-dev]` table yet. Template texts and placeholder filling belong to
//! [`crate::face::templates`]; package resolution to [`crate::identity::workspace`].

use std::path::{Path, PathBuf};

use crate::base::error::{CmdResult, Failure};
use crate::face::cli::InitArgs;
use crate::face::host_sandbox::{self, OrderedMembers, object_text};
use crate::face::templates::{
    self, Template, Vars, json_string, shell_word, toml_key, toml_string,
};
use crate::identity::build::CargoSelection;
use crate::identity::config::{GateSetting, LoadedConfig, McpDevConfig};
use crate::identity::cycle::Prepared;
use crate::{base::fsutil, face::watch, identity::workspace, screen::stderr};

/// The largest manifest, host config or install record read (a larger one is refused).
const TEXT_LIMIT: u64 = 16 << 20;

/// What the generated files are filled from.
#[derive(Debug, Clone)]
pub struct Project {
    /// Directory of the package's Cargo.toml.
    pub package_root: PathBuf,
    /// Absolute path of the package's Cargo.toml (what every host snippet runs).
    pub manifest_path: PathBuf,
    pub label: String,
    pub bin: String,
    pub config: McpDevConfig,
    /// Whether `config` came from a `[package.metadata.mcp-dev]` table (else: defaults).
    pub configured: bool,
    /// Where `run` writes the audit log by default.
    pub target_dir: PathBuf,
}

pub fn execute(args: InitArgs) -> CmdResult {
    let cargo_args = CargoSelection {
        manifest_path: args.manifest_path.clone(),
        bin: args.bin.clone(),
        ..CargoSelection::default()
    };
    let prep = Prepared::new(&cargo_args)?;
    let t = &prep.target;
    let mut project = Project {
        package_root: t.resolved.package_root.clone(),
        manifest_path: t.resolved.manifest_path.clone(),
        label: t.label.clone(),
        bin: t.bin.clone(),
        config: t.config.config.clone(),
        configured: !t.config.raw.is_null(),
        target_dir: t.resolved.target_dir.clone(),
    };
    require_utf8_path(&project.manifest_path)?;
    // Everything is planned (and checked) before anything is written: a refused run writes
    // nothing.
    let mut out = Writer::new(&project.package_root, args.force);
    let manifest_update = metadata_block_update(&project)?;
    let had_table = manifest_update.is_none();
    if let Some(update) = &manifest_update {
        project.config = update.config.clone();
        project.configured = true;
        out.plan_manifest_update(&project, &update.new_text)?;
    }
    write_companions(&project, &HostEnv::detect(), &mut out)?;
    if had_table && out.pending() == 0 {
        // Everything is in place (typically right after `cargo mcp-dev new`): one line.
        stderr::line(&format!(
            "`{}` is already initialized: [package.metadata.mcp-dev] and all {} generated files exist, nothing written (--force rewrites the generated files); run it with `cargo mcp-dev run --manifest-path {}`",
            project.label,
            out.skipped.len(),
            project.manifest_path.display()
        ));
        // Still built: a host opened next finds it warm (cargo has nothing to do when it is).
        return super::first_build::run(
            &project.manifest_path,
            args.bin.as_deref(),
            &args.first_build,
            "the host files were in place already",
        );
    }
    out.commit()?;
    if had_table {
        out.line(&format!(
            "kept {} ([package.metadata.mcp-dev] exists; edit it by hand)",
            out.display(&project.manifest_path)
        ));
    }
    out.finish(&project);
    super::first_build::run(
        &project.manifest_path,
        args.bin.as_deref(),
        &args.first_build,
        "the configuration block and host files were written all the same",
    )
}

/// Host files name the package by its path: one that is not UTF-8 would come out with U+FFFD
/// in it (a Cargo.toml that does not exist), so it is refused before anything is written.
pub fn require_utf8_path(path: &Path) -> Result<(), Failure> {
    if path.to_str().is_some() {
        return Ok(());
    }
    Err(Failure::error(format!(
        "the path `{}` is not valid UTF-8; the generated host configuration files could not name it",
        path.display()
    ))
    .with_note("use a directory whose path is valid UTF-8 (rename or move it); nothing was written"))
}

/// Cargo.toml with the metadata block appended, and the configuration that block gives.
struct ManifestUpdate {
    new_text: String,
    config: McpDevConfig,
}

/// The metadata block appended to Cargo.toml, unless the table exists (then `None`). Nothing
/// is written here.
fn metadata_block_update(project: &Project) -> Result<Option<ManifestUpdate>, Failure> {
    let path = &project.manifest_path;
    let text = crate::base::beneath::followed::read_to_string(path, TEXT_LIMIT)
        .map_err(|e| Failure::error(format!("could not read `{}`: {e}", path.display())))?;
    let doc: toml::Table = text
        .parse()
        .map_err(|e| Failure::error(format!("`{}` is not valid TOML: {e}", path.display())))?;
    let has_table = doc
        .get("package")
        .and_then(|p| p.get("metadata"))
        .and_then(|m| m.get("mcp-dev"))
        .is_some();
    if has_table {
        return Ok(None);
    }
    let block = metadata_block(project, &BlockStyle::Init)?;
    let mut new_text = text.clone();
    if !new_text.is_empty() && !new_text.ends_with('\n') {
        new_text.push('\n');
    }
    new_text.push_str(&block);
    // Appending a table header can clash with the user's own TOML (e.g. an inline
    // `metadata = { … }` in [package]); never write a manifest cargo would then refuse.
    let new_doc: toml::Table = new_text.parse().map_err(|e| {
        Failure::error(format!(
            "could not add [package.metadata.mcp-dev] to `{}`: the result would not be valid TOML ({e})",
            path.display()
        ))
        .with_note("add the table by hand; `cargo mcp-dev new` shows a complete example")
    })?;
    let metadata = new_doc
        .get("package")
        .and_then(|p| p.get("metadata"))
        .map(|m| serde_json::to_value(m).expect("TOML converts to JSON"))
        .unwrap_or(serde_json::Value::Null);
    let loaded = LoadedConfig::from_package_metadata(&metadata)
        .map_err(|e| Failure::error(format!("generated {e}")))?;
    Ok(Some(ManifestUpdate {
        new_text,
        config: loaded.config,
    }))
}

/// Which variant of the metadata block to render.
pub enum BlockStyle {
    /// For `init`: the package's tools are unknown, so tool lists are commented examples.
    Init,
    /// For `new`: the template's own tools.
    New {
        read_tool: &'static str,
        write_tool: &'static str,
        ignore: &'static str,
    },
}

/// The `[package.metadata.mcp-dev]` block, with a leading blank line.
pub fn metadata_block(project: &Project, style: &BlockStyle) -> Result<String, Failure> {
    let mut v = Vars::new();
    v.set("label_toml", toml_string(&project.label))
        .set("bin_toml", toml_string(&project.bin))
        .set("env_prefix", env_prefix(&project.label));
    match style {
        BlockStyle::Init => {
            v.set(
                "exempt_line",
                "# exempt = [\"list_items\"]   # e.g. your read-only tools",
            )
            .set(
                "ignore_line",
                "# Paths the watcher ignores (globs, relative to this package):\n# ignore = [\"*.log\"]",
            )
            .set("write_tool_toml", toml_string("your_write_tool"));
        }
        BlockStyle::New {
            read_tool,
            write_tool,
            ignore,
        } => {
            v.set("exempt_line", format!("exempt = [{}]", toml_string(read_tool)))
                .set(
                    "ignore_line",
                    format!(
                        "# Written by {write_tool} at run time: not a source, so no rebuild.\nignore = [{}]",
                        toml_string(ignore)
                    ),
                )
                .set("write_tool_toml", toml_string(write_tool));
        }
    }
    render(&templates::METADATA_BLOCK, &v)
}

/// Facts about the machine that host snippets need (where cargo is).
#[derive(Debug, Clone)]
pub struct HostEnv {
    /// The cargo the snippets' hosts should find: the one on PATH (rustup's proxy survives
    /// toolchain updates), else the one `cargo mcp-dev` would run.
    pub cargo_path: PathBuf,
    /// The PATH value the snippets pass to the host's child process.
    pub path_env: String,
}

impl HostEnv {
    pub fn detect() -> HostEnv {
        let cargo_path = workspace::find_on_path("cargo")
            .or_else(|| workspace::find_cargo().ok())
            .unwrap_or_else(|| PathBuf::from("cargo"));
        let mut dirs: Vec<PathBuf> = Vec::new();
        if let Some(d) = cargo_path.parent().filter(|d| !d.as_os_str().is_empty()) {
            dirs.push(d.to_path_buf());
        }
        // cargo finds `cargo-mcp-dev` on PATH or in $CARGO_HOME/bin; a copy that lives
        // elsewhere (a checkout's target/) must be on the PATH the host passes.
        let installed_beside_cargo = dirs
            .first()
            .is_some_and(|d| crate::base::beneath::followed::is_file(&d.join("cargo-mcp-dev")));
        if !installed_beside_cargo
            && let Some(exe_dir) = std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(Path::to_path_buf))
        {
            dirs.push(exe_dir);
        }
        // The linker (`cc`) and the usual tools live here.
        for sys in ["/usr/local/bin", "/usr/bin", "/bin"] {
            dirs.push(PathBuf::from(sys));
        }
        let mut unique: Vec<PathBuf> = Vec::new();
        for d in dirs {
            if !unique.contains(&d) {
                unique.push(d);
            }
        }
        let path_env = std::env::join_paths(&unique)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| {
                unique
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":")
            });
        HostEnv {
            cargo_path,
            path_env,
        }
    }

    fn cargo_dir(&self) -> String {
        self.cargo_path
            .parent()
            .map(|d| d.display().to_string())
            .unwrap_or_default()
    }
}

/// Plans the files `init` and `new` share: host snippets, their guide, the update contract,
/// the CI workflow and the watch-loop templates (written by [`Writer::commit`]).
pub fn write_companions(project: &Project, env: &HostEnv, out: &mut Writer) -> Result<(), Failure> {
    let v = companion_vars(project, env)?;
    let root = project.package_root.as_path();
    let ci_root = ci_root(root);
    // The project-level host configurations usually list other servers too: with --force only
    // this server's entry is replaced in them.
    let host_config = |servers_key: &'static str| FileKind::HostConfig {
        servers_key,
        label: project.label.clone(),
    };
    let files: Vec<(&Path, PathBuf, &Template, FileKind)> = vec![
        (
            root,
            root.join(".mcp.json"),
            &templates::HOST_CLAUDE_CODE,
            host_config("mcpServers"),
        ),
        (
            root,
            root.join(".vscode/mcp.json"),
            &templates::HOST_VSCODE,
            host_config("servers"),
        ),
        (
            root,
            root.join(".cursor/mcp.json"),
            &templates::HOST_CURSOR,
            host_config("mcpServers"),
        ),
        (
            root,
            root.join("mcp-dev/claude_desktop_config.json"),
            &templates::HOST_CLAUDE_DESKTOP,
            FileKind::Text,
        ),
        (
            root,
            root.join("mcp-dev/codex-config.toml"),
            &templates::HOST_CODEX,
            FileKind::Text,
        ),
        (
            root,
            root.join("mcp-dev/inspector.sh"),
            &templates::HOST_INSPECTOR,
            FileKind::Script,
        ),
        (
            root,
            root.join("mcp-dev/README.md"),
            &templates::HOSTS_README,
            FileKind::Text,
        ),
        (
            root,
            root.join("UPDATE-CONTRACT.md"),
            &templates::UPDATE_CONTRACT,
            FileKind::Text,
        ),
        (
            &ci_root,
            ci_root.join(".github/workflows/mcp-identity.yml"),
            &templates::CI_WORKFLOW,
            FileKind::Text,
        ),
        (
            root,
            bacon_path(root),
            &templates::WATCH_BACON,
            FileKind::Text,
        ),
        (
            root,
            root.join("mcp-dev/watch.sh"),
            &templates::WATCH_SCRIPT,
            FileKind::Script,
        ),
    ];
    for (within, path, template, kind) in files {
        let text = render(template, &v)?;
        out.plan(within, &path, &text, kind)?;
    }
    let protected = host_sandbox::protected_dirs();
    out.plan_host_settings(root, &root.join(host_sandbox::SETTINGS_FILE), &protected)
}

/// `bacon.toml` gets the job when there is none (or it is ours); a user's own bacon.toml is
/// never touched, the job goes to `mcp-dev/bacon.toml` to paste from. A link there counts as
/// the user's (it is not read through).
fn bacon_path(root: &Path) -> PathBuf {
    let main = root.join("bacon.toml");
    if fsutil::metadata_nofollow(&main).is_ok_and(|m| m.is_symlink()) {
        return root.join("mcp-dev/bacon.toml");
    }
    match fsutil::read_text(&main, TEXT_LIMIT) {
        Ok(text) if !text.contains("[jobs.mcp-dev]") => root.join("mcp-dev/bacon.toml"),
        _ => main,
    }
}

/// GitHub reads workflows from the repository root: the enclosing git work tree, if any.
fn ci_root(package_root: &Path) -> PathBuf {
    package_root
        .ancestors()
        .find(|d| crate::base::beneath::followed::exists(&d.join(".git")))
        .unwrap_or(package_root)
        .to_path_buf()
}

fn companion_vars(project: &Project, env: &HostEnv) -> Result<Vars, Failure> {
    let manifest = project.manifest_path.display().to_string();
    let ci_root = ci_root(&project.package_root);
    let ci_manifest = project
        .manifest_path
        .strip_prefix(&ci_root)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| manifest.clone());
    let mut v = Vars::new();
    v.set("label", &project.label)
        .set("ci_install_command", ci_install_command())
        .set("bin", &project.bin)
        .set("label_json", json_string(&project.label))
        .set("label_toml_key", toml_key(&project.label))
        .set("label_slug", slug(&project.label))
        .set("manifest_path", &manifest)
        .set("manifest_path_json", json_string(&manifest))
        .set("manifest_path_toml", toml_string(&manifest))
        .set("manifest_path_sh", shell_word(&manifest))
        .set("ci_manifest_sh", shell_word(&ci_manifest))
        .set(
            "package_root_sh",
            shell_word(&project.package_root.display().to_string()),
        )
        .set("cargo_dir", env.cargo_dir())
        .set("path_env_json", json_string(&env.path_env))
        .set("path_env_toml", toml_string(&env.path_env))
        .set(
            "path_assign_sh",
            shell_word(&format!("PATH={}", env.path_env)),
        );
    // The guide repeats every snippet so a skipped file can still be pasted by hand.
    for (key, template) in [
        ("snippet_claude_code", &templates::HOST_CLAUDE_CODE),
        ("snippet_claude_desktop", &templates::HOST_CLAUDE_DESKTOP),
        ("snippet_vscode", &templates::HOST_VSCODE),
        ("snippet_cursor", &templates::HOST_CURSOR),
        ("snippet_codex", &templates::HOST_CODEX),
        ("snippet_inspector", &templates::HOST_INSPECTOR),
    ] {
        let text = render(template, &v)?;
        v.set(key, text);
    }
    contract_vars(project, &mut v);
    Ok(v)
}

/// Where the running cargo-mcp-dev was installed from, as cargo recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstalledFrom {
    Registry,
    Git { url: String, rev: String },
    Path(PathBuf),
}

/// Reads cargo's install record (`.crates2.json` of the install root) for `cargo-mcp-dev
/// <version>`: keys look like `cargo-mcp-dev 0.1.0 (git+https://host/repo?rev=x#<sha>)`.
pub fn installed_from(crates2_json: &str, version: &str) -> Option<InstalledFrom> {
    let doc: serde_json::Value = serde_json::from_str(crates2_json).ok()?;
    let prefix = format!("cargo-mcp-dev {version} (");
    let key = doc["installs"]
        .as_object()?
        .keys()
        .find(|k| k.starts_with(&prefix))?;
    let source = key[prefix.len()..].strip_suffix(')')?;
    if source.starts_with("registry+") || source.starts_with("sparse+") {
        Some(InstalledFrom::Registry)
    } else if let Some(git) = source.strip_prefix("git+") {
        let (url, rev) = git.split_once('#')?;
        let url = url.split('?').next()?.to_string();
        Some(InstalledFrom::Git {
            url,
            rev: rev.to_string(),
        })
    } else {
        let path = source.strip_prefix("path+file://")?;
        Some(InstalledFrom::Path(PathBuf::from(path)))
    }
}

/// A URL CI can clone without credentials, from a remote as git prints it.
pub fn public_git_url(remote: &str) -> Option<String> {
    let remote = remote.trim();
    let url = if let Some(rest) = remote.strip_prefix("git@") {
        // scp-like `git@host:owner/repo.git`
        let (host, path) = rest.split_once(':')?;
        format!("https://{host}/{path}")
    } else if remote.starts_with("https://") || remote.starts_with("http://") {
        remote.to_string()
    } else {
        return None;
    };
    let safe = url
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-._~:/%+@".contains(c));
    safe.then_some(url)
}

fn git_output(dir: &Path, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The CI workflow's install line: how the running cargo-mcp-dev was installed (cargo's record in
/// its install root), pinned: from git at the same revision (a `--path` install from a clone
/// whose `origin` is a public URL counts as that repository at its HEAD), else crates.io at the
/// same version. Always `--locked`.
pub fn ci_install_command() -> String {
    let version = env!("CARGO_PKG_VERSION");
    let git = |url: &str, rev: &str| {
        format!("cargo install --locked --git {url} --rev {rev} cargo-mcp-dev")
    };
    let from = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join(".crates2.json")))
        .and_then(|p| crate::base::beneath::followed::read_to_string(&p, TEXT_LIMIT).ok())
        .and_then(|text| installed_from(&text, version));
    let rev_ok = |r: &str| !r.is_empty() && r.chars().all(|c| c.is_ascii_hexdigit());
    match from {
        Some(InstalledFrom::Git { url, rev }) if public_git_url(&url).is_some() && rev_ok(&rev) => {
            git(&url, &rev)
        }
        Some(InstalledFrom::Path(dir)) => {
            let url =
                git_output(&dir, &["remote", "get-url", "origin"]).and_then(|r| public_git_url(&r));
            let rev = git_output(&dir, &["rev-parse", "HEAD"]).filter(|r| rev_ok(r));
            match (url, rev) {
                (Some(url), Some(rev)) => git(&url, &rev),
                _ => format!("cargo install --locked cargo-mcp-dev --version {version}"),
            }
        }
        _ => format!("cargo install --locked cargo-mcp-dev --version {version}"),
    }
}

/// The parts of `UPDATE-CONTRACT.md` that depend on the configuration.
fn contract_vars(project: &Project, v: &mut Vars) {
    let c = &project.config;
    let (mode, source) = match c.restart.as_deref() {
        Some(m) => (
            m.to_string(),
            "`restart` in [package.metadata.mcp-dev]".to_string(),
        ),
        None => ("supervise".to_string(), "the default".to_string()),
    };
    let restart_md = match mode.as_str() {
        "disconnect" => {
            "A rebuild with a new identity does not start new code behind the host's back: the \
            supervisor answers calls in flight, closes the connection and exits, so the host must \
            reconnect, initialize and re-authorize; the new process then gets a new epoch.\n"
        }
        "manual" => {
            "A rebuild with a new identity is reported (the status line says the running server is \
            unchanged and names the build waiting to be applied) and applied only when a human runs \
            `cargo mcp-dev restart` or the host relaunches the server; that new process gets a new \
            epoch. If the server exits, it is not restarted by itself.\n"
        }
        _ => {
            "A rebuild with a new identity replaces the process while the host stays connected \
            (`server replaced: pid=… epoch=… (was …)`): the new process gets a new epoch, the host's \
            `initialize` is replayed to it, and its tool list is fetched before any call reaches it. \
            A server that exits on its own is restarted with a short backoff, also under a new epoch \
            (after repeated crashes it waits for a source change or `cargo mcp-dev restart`).\n"
        }
    };
    let in_flight_md = match mode.as_str() {
        "disconnect" => {
            "Each call in flight when the server is replaced or exits is answered at once with a \
            tool error `epoch_transition` (`cause`, `oldEpoch`, `mayHaveRun: true`, `retried: false`), \
            then the connection is closed. Nothing is retried or replayed on the next connection: a \
            write may or may not have happened, so check before calling again.\n"
        }
        _ => {
            "Each call in flight when its process is replaced or exits is answered at once, never \
            queued and never retried, with a tool error `epoch_transition`: `cause` (`replaced` or \
            `exited`), `oldEpoch`, `newEpoch`, `mayHaveRun: true`, `retried: false`. The call may or may \
            not have taken effect (a write may have happened): check, then decide whether to call \
            again, which needs the current catalog and a grant for the new epoch. Other requests in \
            flight get the JSON-RPC error -31001 (`data.source = \"cargo-mcp-dev\"`).\n"
        }
    };
    v.set("restart_mode", mode)
        .set("restart_source", source)
        .set("restart_md", restart_md)
        .set("in_flight_md", in_flight_md)
        .set(
            "debounce_ms",
            c.debounce_ms
                .unwrap_or(watch::DEFAULT_DEBOUNCE.as_millis() as u64)
                .to_string(),
        )
        .set(
            "env_md",
            list_or(
                &c.env,
                "the values (as digests) of declared variables; none declared (`env`)",
                "the values, as digests, of",
            ),
        )
        .set(
            "extra_inputs_md",
            list_or(
                &c.extra_inputs,
                "declared data files; none declared (`extra-inputs`)",
                "the contents of",
            ),
        )
        .set(
            "wrapper_md",
            match &c.wrapper {
                Some(w) => format!("the wrapper script `{w}` that starts the server"),
                None => "a wrapper script; none configured (`wrapper`)".to_string(),
            },
        )
        .set(
            "audit_log",
            match &c.audit_log {
                Some(p) => p.clone(),
                None => project
                    .target_dir
                    .join("mcp-dev/audit")
                    .join(format!("{}.jsonl", project.label))
                    .display()
                    .to_string(),
            },
        )
        .set("gating_md", gating_md(c))
        .set("credential_scopes_md", credential_scopes_md(c));
    if !project.configured {
        v.set(
            "restart_source",
            "the default; no [package.metadata.mcp-dev] table",
        );
    }
}

fn list_or(items: &[String], none: &str, some: &str) -> String {
    if items.is_empty() {
        none.to_string()
    } else {
        format!("{some} {}", code_list(items))
    }
}

fn code_list(items: &[String]) -> String {
    items
        .iter()
        .map(|i| format!("`{i}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn gating_md(c: &McpDevConfig) -> String {
    let mut s = match &c.gate {
        Some(GateSetting::Keyword(k)) if k == "off" => {
            "Gating is off (`gate = \"off\"`): no tool needs a grant, and the audit log says so.\n"
                .to_string()
        }
        Some(GateSetting::Tools(tools)) => format!(
            "Gated tools (`gate`): {}. Other tools need no grant.\n",
            if tools.is_empty() {
                "none".to_string()
            } else {
                code_list(tools)
            }
        ),
        _ if c.exempt.is_empty() => {
            "Every tool is gated (the default): each needs a grant for the current epoch.\n"
                .to_string()
        }
        _ => format!(
            "Every tool is gated except {} (`exempt`), which need no grant.\n",
            code_list(&c.exempt)
        ),
    };
    if c.approval.as_deref() == Some("per-call") {
        s.push_str("Approvals are per call (`approval = \"per-call\"`): each grant is used up by one call.\n");
    } else {
        s.push_str("Approvals last for the agent run and the current epoch (`per-epoch`).\n");
    }
    if !c.per_call.is_empty() {
        s.push_str(&format!(
            "{} need a decision for every call (`per-call`).\n",
            code_list(&c.per_call)
        ));
    }
    s
}

fn credential_scopes_md(c: &McpDevConfig) -> String {
    if c.credential_scopes.is_empty() {
        return "No credential scopes are configured (`credential-scopes`). When one is, approving a \
            tool that uses it must name the scope, and that approval also ends with the epoch.\n"
            .to_string();
    }
    let mut s = String::from(
        "Credential scopes, each approved by name with the tools that use it and expiring with the epoch:\n\n\
         | scope | env vars (names only) | tools |\n|---|---|---|\n",
    );
    for (name, scope) in &c.credential_scopes {
        s.push_str(&format!(
            "| `{name}` | {} | {} |\n",
            code_list(&scope.env),
            if scope.tools.is_empty() {
                "none".to_string()
            } else {
                code_list(&scope.tools)
            }
        ));
    }
    s
}

/// `MY_SERVER` from `my-server`: prefix for the environment variables the templates name.
pub fn env_prefix(label: &str) -> String {
    label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

fn slug(label: &str) -> String {
    label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

fn render(template: &Template, vars: &Vars) -> Result<String, Failure> {
    // A missing value is a bug in this file, caught by the tests; say which one if it ships.
    templates::render(template, vars).map_err(|e| Failure::error(e.to_string()))
}

/// What a generated file is, which decides how it is written.
pub enum FileKind {
    Text,
    /// Executable (0755 less the umask).
    Script,
    /// A project's host configuration (`.mcp.json`…): an existing one is merged into (this
    /// server's entry in `servers_key` set, everything else kept), never replaced.
    HostConfig {
        servers_key: &'static str,
        label: String,
    },
}

/// One file [`Writer::commit`] will write.
struct PlannedWrite {
    path: PathBuf,
    /// The directory below which missing directories may be created (the package root, or the
    /// git work tree for the CI workflow).
    within: PathBuf,
    contents: String,
    mode: fsutil::FileMode,
    /// A file that did not exist: removed again when a later write of the same run fails.
    is_new: bool,
    /// The status line once it is written.
    done_line: String,
}

/// Writes generated files: never over an existing one without `--force`, never through a
/// symbolic link (a link is replaced, its target untouched), never into a linked directory.
/// Files are first planned ([`Writer::plan`]: every check and merge, nothing written), then
/// written together by [`Writer::commit`], one status line each, so a refused run writes
/// nothing and a failed one removes what it had created.
pub struct Writer {
    base: PathBuf,
    force: bool,
    planned: Vec<PlannedWrite>,
    /// Files left as they were (shown relative to the base), summarised by [`Writer::finish`].
    pub skipped: Vec<String>,
    /// No line per file (the demo creates its package silently).
    pub quiet: bool,
}

impl Writer {
    /// `base`: paths under it are shown relative to it.
    pub fn new(base: &Path, force: bool) -> Writer {
        Writer {
            base: base.to_path_buf(),
            force,
            planned: Vec::new(),
            skipped: Vec::new(),
            quiet: false,
        }
    }

    pub fn display(&self, path: &Path) -> String {
        path.strip_prefix(&self.base)
            .unwrap_or(path)
            .display()
            .to_string()
    }

    /// How many files [`Writer::commit`] would write.
    pub fn pending(&self) -> usize {
        self.planned.len()
    }

    fn line(&self, text: &str) {
        if !self.quiet {
            stderr::line(text);
        }
    }

    /// Plans writing `contents` to `path`, a generated file below `within`: checks what is
    /// there now and decides between creating, keeping (an existing file without `--force`),
    /// replacing and merging. Writes nothing.
    pub fn plan(
        &mut self,
        within: &Path,
        path: &Path,
        contents: &str,
        kind: FileKind,
    ) -> Result<(), Failure> {
        let shown = self.display(path);
        let existing = fsutil::metadata_nofollow(path);
        if existing.is_ok() && !self.force {
            self.skipped.push(shown);
            return Ok(());
        }
        let dir = path.parent().unwrap_or(within);
        fsutil::check_dirs_below(within, dir).map_err(|e| {
            Failure::error(format!("refusing to write `{shown}`: {e}")).with_note(
                "generated files are only written inside the package (its git work tree for the CI workflow); nothing was written",
            )
        })?;
        let new_mode = fsutil::FileMode::New(match kind {
            FileKind::Script => 0o755,
            _ => 0o644,
        });
        let (contents, mode, is_new, done_line) = match existing {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (
                contents.to_string(),
                new_mode,
                true,
                format!("created {shown}"),
            ),
            Err(e) => return Err(Failure::error(format!("could not inspect `{shown}`: {e}"))),
            Ok(m) if m.is_symlink() => (
                contents.to_string(),
                new_mode,
                false,
                format!(
                    "replaced {shown} (it was a symbolic link; the file it pointed to is untouched)"
                ),
            ),
            Ok(m) if !m.is_file() => {
                return Err(Failure::error(format!(
                    "`{shown}` exists and is not a regular file; refusing to replace it"
                )));
            }
            Ok(_) => match &kind {
                FileKind::HostConfig { servers_key, label } => {
                    let mine = fsutil::read_text(path, TEXT_LIMIT)
                        .map_err(|e| Failure::error(format!("could not read `{shown}`: {e}")))?;
                    let merged = merge_host_entry(&mine, contents, servers_key, label).map_err(
                        |why| {
                            Failure::error(format!(
                                "could not add this server to `{shown}`: {why}; it was left as it is"
                            ))
                            .with_note(
                                "fix or remove the file and run init --force again, or paste the entry from mcp-dev/README.md by hand; nothing was written",
                            )
                        },
                    )?;
                    let mode =
                        fsutil::regular_file_mode(path).map_or(new_mode, fsutil::FileMode::Exactly);
                    (
                        merged,
                        mode,
                        false,
                        format!(
                            "updated {shown} (set the `{label}` entry in `{servers_key}`; every other entry kept)"
                        ),
                    )
                }
                _ => (
                    contents.to_string(),
                    new_mode,
                    false,
                    format!("overwrote {shown}"),
                ),
            },
        };
        self.planned.push(PlannedWrite {
            path: path.to_path_buf(),
            within: within.to_path_buf(),
            contents,
            mode,
            is_new,
            done_line,
        });
        Ok(())
    }

    /// Plans Claude Code's project settings ([`host_sandbox`]): its sandbox strict and the
    /// `protected` directories denied to its file tools and sandboxed commands. Merged into
    /// with or without `--force` (it only adds, and never weakens what the user set); nothing
    /// planned when everything is there. A file that cannot be merged is left as it is, with a
    /// warning (`status` says what is missing), and the rest of the run goes on.
    pub fn plan_host_settings(
        &mut self,
        within: &Path,
        path: &Path,
        protected: &host_sandbox::Protected,
    ) -> Result<(), Failure> {
        let shown = self.display(path);
        let warn = |text: String| {
            if !self.quiet {
                stderr::warn(&text);
            }
        };
        for problem in &protected.problems {
            warn(format!("{shown}: {problem}"));
        }
        let dir = path.parent().unwrap_or(within);
        fsutil::check_dirs_below(within, dir).map_err(|e| {
            Failure::error(format!("refusing to write `{shown}`: {e}")).with_note(
                "generated files are only written inside the package; nothing was written",
            )
        })?;
        let rules = host_sandbox::deny_rules(&protected.dirs);
        let existing = fsutil::metadata_nofollow(path);
        let (mine, is_new) = match &existing {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (String::new(), true),
            Err(e) => return Err(Failure::error(format!("could not inspect `{shown}`: {e}"))),
            Ok(m) if !m.is_file() => {
                warn(format!(
                    "`{shown}` is not a regular file (a symbolic link?); it was left as it is: add Claude Code's sandbox settings to it by hand (`cargo mcp-dev status` says what is missing)"
                ));
                return Ok(());
            }
            Ok(_) => (
                fsutil::read_text(path, TEXT_LIMIT)
                    .map_err(|e| Failure::error(format!("could not read `{shown}`: {e}")))?,
                false,
            ),
        };
        let merged = match host_sandbox::merge_settings(&mine, &rules) {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(()),
            Err(why) => {
                warn(format!(
                    "could not add Claude Code's sandbox settings to `{shown}`: {why}; it was left as it is (`cargo mcp-dev status` says what is missing)"
                ));
                return Ok(());
            }
        };
        for line in host_sandbox::check_written(&shown, &merged.text, &rules) {
            warn(line);
        }
        let what = if is_new {
            format!(
                "created {shown} (Claude Code: sandbox on, strict; {} denied to its tools and commands)",
                protected
                    .dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            format!(
                "updated {shown} (added {}; every other setting kept)",
                merged.added.join(", ")
            )
        };
        let mode = if is_new {
            fsutil::FileMode::New(0o644)
        } else {
            fsutil::regular_file_mode(path)
                .map_or(fsutil::FileMode::New(0o644), fsutil::FileMode::Exactly)
        };
        self.planned.push(PlannedWrite {
            path: path.to_path_buf(),
            within: within.to_path_buf(),
            contents: merged.text,
            mode,
            is_new,
            done_line: what,
        });
        Ok(())
    }

    /// Plans the user's Cargo.toml with the metadata block appended (`new_text`): replaced
    /// atomically, keeping its permissions; a link there is refused rather than replaced.
    fn plan_manifest_update(&mut self, project: &Project, new_text: &str) -> Result<(), Failure> {
        let path = &project.manifest_path;
        let shown = self.display(path);
        let Some(bits) = fsutil::regular_file_mode(path) else {
            return Err(Failure::error(format!(
                "`{}` is not a regular file (a symbolic link?); refusing to replace it",
                path.display()
            ))
            .with_note("add [package.metadata.mcp-dev] by hand; `cargo mcp-dev new` shows a complete example"));
        };
        self.planned.push(PlannedWrite {
            path: path.clone(),
            within: project.package_root.clone(),
            contents: new_text.to_string(),
            mode: fsutil::FileMode::Exactly(bits),
            is_new: false,
            done_line: format!(
                "updated {shown} (added [package.metadata.mcp-dev]: label = {}, bin = {})",
                toml_string(&project.label),
                toml_string(&project.bin)
            ),
        });
        Ok(())
    }

    /// Writes every planned file (each atomically: a temporary file renamed into place) and
    /// prints their lines; returns how many. New files go first and existing ones are replaced
    /// last, so that when a write fails the files and directories this run created can be
    /// removed again and no existing file has been touched (unless the failure was among
    /// those last replacements).
    pub fn commit(&mut self) -> Result<usize, Failure> {
        let mut order: Vec<&PlannedWrite> = self.planned.iter().filter(|p| p.is_new).collect();
        order.extend(self.planned.iter().filter(|p| !p.is_new));
        let mut created_files: Vec<PathBuf> = Vec::new();
        let mut created_dirs: Vec<PathBuf> = Vec::new();
        for p in order {
            let dir = p.path.parent().unwrap_or(&p.within);
            let written =
                fsutil::create_dirs_below(&p.within, dir, &mut created_dirs).and_then(|()| {
                    fsutil::write_atomic_with_mode(&p.path, p.contents.as_bytes(), p.mode)
                });
            if let Err(e) = written {
                fsutil::remove_created(&created_files, &created_dirs);
                let undone = if created_files.is_empty() && created_dirs.is_empty() {
                    String::new()
                } else {
                    " (the files and directories this run had created were removed)".to_string()
                };
                return Err(Failure::error(format!(
                    "could not write `{}`: {e}{undone}",
                    self.display(&p.path)
                )));
            }
            if p.is_new {
                created_files.push(p.path.clone());
            }
        }
        for p in &self.planned {
            self.line(&p.done_line);
        }
        Ok(self.planned.len())
    }

    /// The closing lines: one for every file left alone, then the hint.
    pub fn finish(&self, project: &Project) {
        if !self.skipped.is_empty() && !self.force {
            self.line(&format!(
                "kept {} existing file{} ({}); --force overwrites them, mcp-dev/README.md has the text of every host snippet",
                self.skipped.len(),
                if self.skipped.len() == 1 { "" } else { "s" },
                self.skipped.join(", ")
            ));
        }
        stderr::note(&format!(
            "point a host at `cargo mcp-dev run --manifest-path {}` (see mcp-dev/README.md); approve gated tools with `cargo mcp-dev approve`",
            project.manifest_path.display()
        ));
    }
}

/// `existing` (a host configuration) with `label`'s entry in its `servers_key` object set to
/// the one in `generated` (our rendered snippet). Every other member, at either level, keeps
/// its place and its text as written; only the whitespace between them is redone. An error
/// (why, for the user) when `existing` is not a JSON object or its `servers_key` is not one.
pub fn merge_host_entry(
    existing: &str,
    generated: &str,
    servers_key: &str,
    label: &str,
) -> Result<String, String> {
    let servers_of = |doc: &OrderedMembers<'_>| -> Result<Vec<usize>, String> {
        let at: Vec<usize> = (0..doc.0.len())
            .filter(|&i| doc.0[i].0 == servers_key)
            .collect();
        if at.len() > 1 {
            return Err(format!("`{servers_key}` appears more than once"));
        }
        Ok(at)
    };
    let ours: OrderedMembers<'_> =
        serde_json::from_str(generated).expect("a host template is a JSON object");
    let our_servers: OrderedMembers<'_> =
        serde_json::from_str(ours.0[servers_of(&ours)?[0]].1.get())
            .expect("a host template's servers are an object");
    let our_entry = our_servers
        .0
        .iter()
        .find(|(k, _)| k == label)
        .map(|(_, v)| v.get())
        .expect("a host template holds its label's entry");

    // An empty file holds nothing to keep.
    let doc = host_sandbox::object_members(existing)?;
    let mut top = doc.owned();
    let mut servers: Vec<(String, &str)> = Vec::new();
    let at = match servers_of(&doc)?.first() {
        Some(&i) => {
            let inner: OrderedMembers<'_> = serde_json::from_str(doc.0[i].1.get())
                .map_err(|_| format!("its `{servers_key}` is not a JSON object"))?;
            servers.extend(inner.0.iter().map(|(k, v)| (k.clone(), v.get())));
            i
        }
        None => {
            top.push((servers_key.to_string(), String::new()));
            top.len() - 1
        }
    };
    // Ours replaces the first entry of that name (and any repeat), or goes last.
    match servers.iter().position(|(k, _)| k == label) {
        Some(i) => {
            servers[i].1 = our_entry;
            let mut first = true;
            servers.retain(|(k, _)| k != label || std::mem::take(&mut first));
        }
        None => servers.push((label.to_string(), our_entry)),
    }
    top[at].1 = object_text(&servers, 2);
    let top: Vec<(String, &str)> = top.iter().map(|(k, v)| (k.clone(), v.as_str())).collect();
    Ok(format!("{}\n", object_text(&top, 0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: &str) -> String {
        serde_json::json!({"installs": {
            "ripgrep 14.1.0 (registry+https://github.com/rust-lang/crates.io-index)": {},
            key: {"bins": ["cargo-mcp-dev"]}
        }})
        .to_string()
    }

    #[test]
    fn reads_where_cargo_installed_it_from() {
        assert_eq!(
            installed_from(
                &record(
                    "cargo-mcp-dev 0.1.0 (git+https://github.com/acme/cargo-mcp-dev?rev=1a2b#1a2b3c4d5e6f)"
                ),
                "0.1.0"
            ),
            Some(InstalledFrom::Git {
                url: "https://github.com/acme/cargo-mcp-dev".into(),
                rev: "1a2b3c4d5e6f".into()
            })
        );
        assert_eq!(
            installed_from(
                &record(
                    "cargo-mcp-dev 0.1.0 (registry+https://github.com/rust-lang/crates.io-index)"
                ),
                "0.1.0"
            ),
            Some(InstalledFrom::Registry)
        );
        assert_eq!(
            installed_from(
                &record("cargo-mcp-dev 0.1.0 (path+file:///home/you/src/cargo-mcp-dev)"),
                "0.1.0"
            ),
            Some(InstalledFrom::Path("/home/you/src/cargo-mcp-dev".into()))
        );
        // Another version installed, or no record: nothing to derive from.
        assert_eq!(
            installed_from(&record("cargo-mcp-dev 0.0.9 (path+file:///x)"), "0.1.0"),
            None
        );
        assert_eq!(installed_from("not json", "0.1.0"), None);
    }

    #[test]
    fn only_urls_ci_can_clone_are_used() {
        assert_eq!(
            public_git_url("git@github.com:acme/cargo-mcp-dev.git\n").as_deref(),
            Some("https://github.com/acme/cargo-mcp-dev.git")
        );
        assert_eq!(
            public_git_url("https://gitlab.com/acme/cargo-mcp-dev").as_deref(),
            Some("https://gitlab.com/acme/cargo-mcp-dev")
        );
        for local in [
            "/work/repo",
            "file:///work/repo",
            "../repo",
            "https://x/a b",
        ] {
            assert_eq!(public_git_url(local), None, "{local}");
        }
    }

    const OURS: &str =
        "{\n  \"mcpServers\": {\n    \"srv\": {\n      \"command\": \"cargo\"\n    }\n  }\n}\n";

    #[test]
    fn merging_sets_our_entry_and_keeps_everything_else_as_written() {
        let mine = r#"{"z": 1, "mcpServers": {"b": {"x": 1.50}, "srv": {"command": "old"}, "a": {}}, "y": [ 1, 2 ]}"#;
        let merged = merge_host_entry(mine, OURS, "mcpServers", "srv").unwrap();
        assert_eq!(
            merged,
            "{\n  \"z\": 1,\n  \"mcpServers\": {\n    \"b\": {\"x\": 1.50},\n    \"srv\": {\n      \"command\": \"cargo\"\n    },\n    \"a\": {}\n  },\n  \"y\": [ 1, 2 ]\n}\n"
        );
        // Merging again changes nothing.
        assert_eq!(
            merge_host_entry(&merged, OURS, "mcpServers", "srv").unwrap(),
            merged
        );
    }

    #[test]
    fn merging_adds_the_servers_object_or_our_entry_when_missing() {
        let doc = |text: &str| -> serde_json::Value { serde_json::from_str(text).unwrap() };
        let merged = merge_host_entry(r#"{"inputs": []}"#, OURS, "mcpServers", "srv").unwrap();
        assert_eq!(
            doc(&merged),
            serde_json::json!({"inputs": [], "mcpServers": {"srv": {"command": "cargo"}}})
        );
        for empty in ["", " \n", "{}"] {
            assert_eq!(
                doc(&merge_host_entry(empty, OURS, "mcpServers", "srv").unwrap()),
                serde_json::json!({"mcpServers": {"srv": {"command": "cargo"}}}),
                "{empty:?}"
            );
        }
        // A repeated entry of ours collapses into one; other servers stay.
        let merged = merge_host_entry(
            r#"{"mcpServers": {"srv": 1, "o": 2, "srv": 3}}"#,
            OURS,
            "mcpServers",
            "srv",
        )
        .unwrap();
        assert_eq!(merged.matches("\"srv\"").count(), 1, "{merged}");
        assert!(merged.contains("\"o\": 2"), "{merged}");
    }

    #[test]
    fn merging_refuses_what_it_cannot_merge_into() {
        for (mine, why) in [
            ("edited", "not valid JSON"),
            ("{\"mcpServers\": {},}", "not valid JSON"),
            ("// c\n{}", "not valid JSON"),
            ("[1]", "top level is not a JSON object"),
            ("\"s\"", "top level is not a JSON object"),
            (r#"{"mcpServers": []}"#, "`mcpServers` is not a JSON object"),
            (
                r#"{"mcpServers": null}"#,
                "`mcpServers` is not a JSON object",
            ),
            (
                r#"{"mcpServers": {}, "mcpServers": {}}"#,
                "`mcpServers` appears more than once",
            ),
        ] {
            let err = merge_host_entry(mine, OURS, "mcpServers", "srv").unwrap_err();
            assert!(err.contains(why), "{mine}: {err}");
        }
    }

    /// Something changes between planning and writing (here a file appears where a planned
    /// directory goes): the write fails, and the files and directories this run had created
    /// are removed again.
    #[test]
    fn a_failed_commit_removes_what_it_created() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let mut out = Writer::new(root, false);
        out.quiet = true;
        out.plan(root, &root.join("a/deep/one.txt"), "1", FileKind::Text)
            .unwrap();
        out.plan(root, &root.join("top.txt"), "2", FileKind::Script)
            .unwrap();
        out.plan(root, &root.join("b/two.txt"), "3", FileKind::Text)
            .unwrap();
        assert_eq!(out.pending(), 3);
        std::fs::write(root.join("b"), "in the way").unwrap();
        let err = out.commit().unwrap_err();
        assert!(
            err.message.contains("could not write `b/two.txt`"),
            "{}",
            err.message
        );
        assert!(err.message.contains("were removed"), "{}", err.message);
        let left: Vec<_> = std::fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["b"], "only what was there before");
    }

    #[test]
    fn plan_keeps_existing_files_without_force_and_checks_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::write(root.join("kept.txt"), "mine").unwrap();
        std::os::unix::fs::symlink(tmp.path(), root.join("linked")).unwrap();
        let mut out = Writer::new(root, false);
        out.plan(root, &root.join("kept.txt"), "x", FileKind::Text)
            .unwrap();
        assert_eq!(out.skipped, ["kept.txt"]);
        let err = out
            .plan(root, &root.join("linked/new.txt"), "x", FileKind::Text)
            .unwrap_err();
        assert!(
            err.message.contains("refusing to write `linked/new.txt`")
                && err.message.contains("is a symbolic link"),
            "{}",
            err.message
        );
        assert_eq!(out.pending(), 0);
    }
}
