//! `cargo mcp-dev identity`: print the identity record (human summary or `--json`), the resolved
//! dependency set (`--deps`), or what changed between two records (`--diff`).

use crate::base::error::{CmdResult, Failure};
use crate::base::hashing::short;
use crate::face::cli::IdentityArgs;
use crate::identity::cycle::{self, CycleOutcome, Prepared};
use crate::identity::fingerprint::{self, IdentityRecord};
use crate::{base::exit_codes, screen::output, screen::stderr};

pub fn execute(args: IdentityArgs) -> CmdResult {
    if let (Some(old), Some(new)) = (&args.diff, &args.against) {
        let old = cycle::read_record(old)?;
        let new = cycle::read_record(new)?;
        return print_diff(&old, &new, args.json);
    }
    let record = current(&args)?;
    if let Some(old) = &args.diff {
        let old = cycle::read_record(old)?;
        return print_diff(&old, &record, args.json);
    }
    if args.json {
        output::stdout_line(&serde_json::to_string_pretty(&record).expect("serializes"))?;
    } else if args.deps {
        output::stdout_text(&deps_text(&record))?;
    } else {
        output::stdout_text(&summary_text(&record))?;
    }
    Ok(exit_codes::OK)
}

fn current(args: &IdentityArgs) -> Result<IdentityRecord, Failure> {
    let prep = Prepared::new(&args.cargo.selection())?;
    if args.no_build {
        return prep.last_identity().ok_or_else(|| {
            Failure::new(
                exit_codes::IDENTITY_NOT_CAPTURED,
                format!(
                    "no identity recorded yet for `{}` (run `cargo mcp-dev build`)",
                    prep.target.label
                ),
            )
        });
    }
    let outcome = cycle::run_cycle(&prep, &[], !stderr::quiet())?;
    stderr::line(&cycle::status_line(&prep, &outcome));
    match outcome {
        CycleOutcome::Complete { record, .. } => Ok(record),
        CycleOutcome::Failed { .. } => Err(Failure::new(
            exit_codes::BUILD_FAILED,
            "build failed; no identity captured",
        )),
    }
}

fn print_diff(old: &IdentityRecord, new: &IdentityRecord, json: bool) -> CmdResult {
    let changed = fingerprint::changed_components(old, new);
    let deps = fingerprint::dependency_changes(old, new);
    if json {
        let v = serde_json::json!({
            "old": old.identity_digest, "new": new.identity_digest,
            "changed": changed.iter().map(|c| c.name()).collect::<Vec<_>>(),
            "dependencies": deps,
        });
        output::stdout_line(&v.to_string())?;
    } else if changed.is_empty() {
        output::stdout_line(&format!(
            "identity unchanged ({})",
            short(&new.identity_digest)
        ))?;
    } else {
        let mut text = format!(
            "identity changed ({} -> {}): {}\n",
            short(&old.identity_digest),
            short(&new.identity_digest),
            fingerprint::component_list(&changed)
        );
        for c in &changed {
            text.push_str(&format!(
                "  {}: {}\n",
                c.name(),
                describe_change(*c, old, new)
            ));
        }
        for d in deps {
            text.push_str(&format!("    {d}\n"));
        }
        output::stdout_text(&text)?;
    }
    Ok(exit_codes::OK)
}

fn describe_change(
    c: fingerprint::Component,
    old: &IdentityRecord,
    new: &IdentityRecord,
) -> String {
    use fingerprint::Component::*;
    match c {
        Executable => format!(
            "{} -> {}",
            short(&old.executable.sha256),
            short(&new.executable.sha256)
        ),
        Lockfile => format!(
            "{} -> {}",
            old.lockfile
                .as_ref()
                .map(|l| short(&l.sha256))
                .unwrap_or_else(|| "none".into()),
            new.lockfile
                .as_ref()
                .map(|l| short(&l.sha256))
                .unwrap_or_else(|| "none".into())
        ),
        DependencyTree => format!(
            "{} packages -> {} packages",
            old.dependency_tree.packages, new.dependency_tree.packages
        ),
        Runtime => {
            let (o, n) = (&old.runtime, &new.runtime);
            let mut parts = Vec::new();
            if o.rustc_release != n.rustc_release || o.rustc_commit != n.rustc_commit {
                parts.push(format!("rustc {} -> {}", o.rustc_release, n.rustc_release));
            }
            if o.profile != n.profile {
                parts.push(format!("profile {} -> {}", o.profile, n.profile));
            }
            if o.target != n.target {
                parts.push(format!("target {} -> {}", o.target, n.target));
            }
            if o.rustflags != n.rustflags || o.encoded_rustflags != n.encoded_rustflags {
                parts.push(format!("RUSTFLAGS {:?} -> {:?}", o.rustflags, n.rustflags));
            }
            if o.features != n.features {
                parts.push(format!("features {:?} -> {:?}", o.features, n.features));
            }
            parts.join(", ")
        }
        Env => {
            let names: Vec<String> = new
                .env
                .iter()
                .filter(|e| !old.env.contains(e))
                .map(|e| e.name.clone())
                .collect();
            format!("variables changed: {}", names.join(", "))
        }
        ExtraInputs => {
            let names: Vec<String> = new
                .extra_inputs
                .iter()
                .filter(|e| !old.extra_inputs.contains(e))
                .map(|e| e.path.clone())
                .collect();
            format!("changed: {}", names.join(", "))
        }
        Wrapper => format!(
            "{} -> {}",
            old.wrapper
                .as_ref()
                .map(|w| format!("{} {}", w.path, short(&w.sha256)))
                .unwrap_or_else(|| "none".into()),
            new.wrapper
                .as_ref()
                .map(|w| format!("{} {}", w.path, short(&w.sha256)))
                .unwrap_or_else(|| "none".into())
        ),
        Launcher => format!(
            "{} {} -> {} {}",
            old.launcher.version,
            short(&old.launcher.sha256),
            new.launcher.version,
            short(&new.launcher.sha256)
        ),
        Config => format!(
            "{} -> {}",
            short(&old.config.sha256),
            short(&new.config.sha256)
        ),
        Launch => format!(
            "argv {:?} cwd {} -> argv {:?} cwd {}",
            old.launch.argv.len(),
            old.launch.cwd,
            new.launch.argv.len(),
            new.launch.cwd
        ),
    }
}

pub fn summary_text(r: &IdentityRecord) -> String {
    let mut s = String::new();
    s.push_str(&format!("identity   {}\n", r.identity_digest));
    s.push_str(&format!(
        "label      {} ({} {}, bin {})\n",
        r.label, r.package.name, r.package.version, r.bin
    ));
    s.push_str(&format!(
        "executable {} ({} bytes, {})\n",
        r.executable.path, r.executable.size, r.executable.sha256
    ));
    s.push_str(&format!("runs as    {}\n", r.launch.argv.join(" ")));
    s.push_str(&format!("cwd        {}\n", r.launch.cwd));
    match &r.lockfile {
        Some(l) => s.push_str(&format!("lockfile   {} ({})\n", l.path, l.sha256)),
        None => s.push_str("lockfile   none\n"),
    }
    s.push_str(&format!(
        "deps       {} packages ({}) [--deps to list]\n",
        r.dependency_tree.packages, r.dependency_tree.sha256
    ));
    let rt = &r.runtime;
    s.push_str(&format!(
        "runtime    rustc {} ({}) host {} target {} profile {}{}\n",
        rt.rustc_release,
        rt.rustc_commit,
        rt.host,
        rt.target,
        rt.profile,
        rt.rustflags
            .as_ref()
            .map(|f| format!(" RUSTFLAGS={f:?}"))
            .unwrap_or_default()
    ));
    s.push_str(&format!("config     {}\n", r.config.sha256));
    for e in &r.env {
        s.push_str(&format!(
            "env        {} {}\n",
            e.name,
            e.sha256.as_deref().unwrap_or("unset")
        ));
    }
    for x in &r.extra_inputs {
        s.push_str(&format!(
            "extra      {} ({}, {} files, {})\n",
            x.path, x.kind, x.files, x.sha256
        ));
    }
    if let Some(w) = &r.wrapper {
        s.push_str(&format!(
            "wrapper    {} ({}) starts {}\n",
            w.path, w.sha256, w.starts
        ));
    }
    s.push_str(&format!(
        "launcher   {} {} ({})\n",
        r.launcher.name, r.launcher.version, r.launcher.sha256
    ));
    s.push_str(&format!("captured   {}\n", r.captured_at));
    s
}

fn deps_text(r: &IdentityRecord) -> String {
    let mut s = format!(
        "{} packages ({})\n",
        r.dependency_tree.packages, r.dependency_tree.sha256
    );
    for d in &r.dependency_tree.list {
        let source = d.source.clone().unwrap_or_else(|| "path".into());
        s.push_str(&format!("{} {} {}", d.name, d.version, source));
        if let Some(c) = &d.checksum {
            s.push_str(&format!(
                " checksum {}",
                crate::screen::sanitize::first_chars(c, 16)
            ));
        }
        if let Some(sd) = &d.source_digest {
            s.push_str(&format!(" sources {}", short(sd)));
        }
        if !d.features.is_empty() {
            s.push_str(&format!(" [{}]", d.features.join(", ")));
        }
        s.push('\n');
    }
    s
}
