//! `cargo mcp-dev check`: the CI gate. Builds with `--locked` and fails, one sentence per
//! problem, when identity cannot be captured or differs from `--expect`.

use crate::base::error::{CmdResult, Failure};
use crate::base::hashing::short;
use crate::face::cli::{CheckArgs, MessageFormat};
use crate::identity::cycle::{self, CycleOutcome, Prepared};
use crate::identity::fingerprint;
use crate::{base::exit_codes, screen::output, screen::stderr};

pub fn execute(args: CheckArgs) -> CmdResult {
    let mut cargo = args.cargo.selection();
    if !args.no_locked {
        cargo.locked = true;
    }
    let json = args.message_format == MessageFormat::Json;
    let expect = match &args.expect {
        Some(p) => Some(cycle::read_record(p)?),
        None => None,
    };
    if args.no_locked {
        // `cargo metadata` without --locked would create a missing lockfile; look first.
        require_lockfile(&cargo)?;
    }
    let prep = Prepared::new(&cargo).map_err(lockfile_sentence)?;
    if !crate::base::beneath::followed::is_file(&prep.target.resolved.lockfile) {
        return Err(Failure::new(exit_codes::IDENTITY_NOT_CAPTURED, NO_LOCKFILE));
    }
    let outcome = cycle::run_cycle(&prep, &[], !stderr::quiet()).map_err(lockfile_sentence)?;
    super::build::report(&prep, &outcome, json)?;
    let (record, problems) = match outcome {
        CycleOutcome::Failed { summary, .. } => {
            if let Some(s) = summary.filter(|s| s.contains("--locked")) {
                return Err(lockfile_sentence(Failure::error(s)));
            }
            return Err(Failure::new(
                exit_codes::BUILD_FAILED,
                "build failed: identity not captured",
            ));
        }
        CycleOutcome::Complete {
            record, problems, ..
        } => (record, problems),
    };
    if let Some(out) = &args.out {
        cycle::write_record(out, &record)?;
        stderr::verbose_line(&format!("wrote identity record to {}", out.display()));
    }
    if !problems.is_empty() {
        let mut f = Failure::new(
            exit_codes::IDENTITY_NOT_CAPTURED,
            format!(
                "identity not captured completely ({} problem{})",
                problems.len(),
                if problems.len() == 1 { "" } else { "s" }
            ),
        );
        for p in &problems {
            f = f.with_note(p.to_string());
        }
        return Err(f);
    }
    if let Some(expected) = expect {
        let cmp = fingerprint::compare_for_expect(&expected, &record, args.include_launch_dir);
        if !cmp.differing.is_empty() {
            let mut f = Failure::new(
                exit_codes::IDENTITY_DIFFERS,
                format!(
                    "identity differs from the expected record ({} -> {}): {}",
                    short(&expected.identity_digest),
                    short(&record.identity_digest),
                    cmp.differing.join(", ")
                ),
            );
            for d in fingerprint::dependency_changes(&expected, &record) {
                f = f.with_note(format!("dependency {d}"));
            }
            if let Some((old, new)) = cmp.launch_dir.filter(|_| args.include_launch_dir) {
                f = f.with_note(format!("launch directory `{old}` -> `{new}`"));
            }
            return Err(f);
        }
        if let Some((old, new)) = &cmp.launch_dir {
            stderr::note(&format!(
                "launch directory differs (`{old}` -> `{new}`): recorded, not compared (--include-launch-dir compares it)"
            ));
        }
    }
    if json {
        output::stdout_line(
            &serde_json::json!({"event": "check-passed", "identity": record.identity_digest})
                .to_string(),
        )?;
    } else {
        stderr::line(&format!(
            "check passed: identity {}",
            short(&record.identity_digest)
        ));
    }
    Ok(exit_codes::OK)
}

const NO_LOCKFILE: &str = "no Cargo.lock: the dependency versions that will run are not pinned (run `cargo generate-lockfile` and commit it)";

/// Fails when the workspace has no Cargo.lock, without letting cargo create one.
fn require_lockfile(cargo: &crate::identity::build::CargoSelection) -> Result<(), Failure> {
    let cargo_bin = crate::identity::workspace::find_cargo()?;
    let manifest = crate::identity::workspace::locate_manifest(cargo.manifest_path.as_deref())?;
    let out = std::process::Command::new(cargo_bin)
        .args([
            "locate-project",
            "--workspace",
            "--message-format",
            "plain",
            "--manifest-path",
        ])
        .arg(&manifest)
        .output()?;
    if !out.status.success() {
        return Err(Failure::new(
            exit_codes::METADATA_FAILED,
            format!(
                "cargo locate-project failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    let root_manifest = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let lock = root_manifest.with_file_name("Cargo.lock");
    if !crate::base::beneath::followed::is_file(&lock) {
        return Err(Failure::new(exit_codes::IDENTITY_NOT_CAPTURED, NO_LOCKFILE));
    }
    Ok(())
}

/// cargo's `--locked` refusals become one specific sentence with the identity exit code.
fn lockfile_sentence(f: Failure) -> Failure {
    if f.message.contains("--locked") {
        let sentence = if f.message.contains("cannot create the lock file") {
            NO_LOCKFILE
        } else {
            "Cargo.lock is out of date: cargo would have to change it to build (run `cargo update --workspace` and commit Cargo.lock)"
        };
        return Failure::new(exit_codes::IDENTITY_NOT_CAPTURED, sentence).with_note(f.message);
    }
    f
}
