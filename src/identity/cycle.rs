//! One build cycle: build, capture identity, compare with the last recorded identity, persist.
//!
//! Shared by `build`, `check`, `identity` and the `run` loop. Owns the last-identity file under
//! the target directory and the wording of the `build complete|failed` status line. It does not
//! start servers.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::base::error::Failure;
use crate::base::exit_codes;
use crate::base::hashing::short;
use crate::identity::build::{self, BuildOutcome, BuildRequest, CargoSelection};
use crate::identity::capture::{self, CaptureContext, CaptureProblem};
use crate::identity::fingerprint::{self, Component, IdentityRecord};
use crate::identity::store::{self, Store};
use crate::identity::workspace::{self, RustcFacts, ServerTarget};

/// Everything resolved before building: cargo, rustc facts, the server target.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub cargo: PathBuf,
    pub rustc: RustcFacts,
    pub target: ServerTarget,
    pub args: CargoSelection,
}

impl Prepared {
    /// Finds cargo and rustc and resolves the package (from the metadata cache when current).
    ///
    /// `rustc -vV` runs beside the rest: the facts the last run got from the same rustc stand in
    /// until it answers, and [`Prepared::confirmed`] (called before an identity is captured)
    /// replaces a wrong guess. Without a remembered answer this waits for rustc.
    pub fn new(args: &CargoSelection) -> Result<Prepared, Failure> {
        let cargo = workspace::find_cargo()?;
        let rustc_path = workspace::find_rustc(&cargo);
        workspace::prefetch_rustc_facts(&rustc_path);
        let rustc = match workspace::remembered_rustc_facts(&rustc_path) {
            Some(guess) => guess,
            None => workspace::rustc_facts(&rustc_path)?,
        };
        let target = workspace::resolve(&cargo, &rustc.host, args)?;
        if let Some(choice) = &target.bin_choice {
            crate::screen::stderr::note(choice);
        }
        Ok(Prepared {
            cargo,
            rustc,
            target,
            args: args.clone(),
        })
    }

    /// This preparation with the facts `rustc -vV` really gave in this process (re-resolved
    /// for the real host if the remembered guess was wrong).
    pub fn confirmed(&self) -> Result<Prepared, Failure> {
        let real = workspace::rustc_facts(&workspace::find_rustc(&self.cargo))?;
        if real == self.rustc {
            return Ok(self.clone());
        }
        let target = workspace::resolve(&self.cargo, &real.host, &self.args)?;
        Ok(Prepared {
            rustc: real,
            target,
            ..self.clone()
        })
    }

    /// Re-resolves after manifests may have changed (cheap when the cache still matches).
    pub fn refresh(&self) -> Result<Prepared, Failure> {
        let target = workspace::resolve(&self.cargo, &self.rustc.host, &self.args)?;
        Ok(Prepared {
            target,
            ..self.clone()
        })
    }

    pub fn profile(&self) -> String {
        build::profile_name(&self.args)
    }

    pub fn identity_file(&self) -> PathBuf {
        self.target
            .layout()
            .identity_file(&self.target.label, &self.profile())
    }

    /// The content-addressed store, its capture stamps in the user's state directory (where
    /// the agent cannot forge one); without a state directory every capture hashes.
    pub fn store(&self) -> Store {
        let dir = self.target.layout().store_dir();
        match crate::audit::KeyStore::from_env() {
            Ok(keys) => Store::with_stamps(dir, keys.dir().join("stamps")),
            Err(_) => Store::new(dir),
        }
    }

    /// The last recorded (successful) identity for this label and profile.
    pub fn last_identity(&self) -> Option<IdentityRecord> {
        read_record(&self.identity_file()).ok()
    }

    /// The executable path as humans see it in status lines (`target/debug/inventory`).
    pub fn executable_display(&self, exe: &Path) -> String {
        self.target.display_path(exe)
    }

    pub fn request(&self, relay_stderr: bool) -> BuildRequest {
        BuildRequest {
            cargo: self.cargo.clone(),
            args: self.args.clone(),
            manifest_path: self.target.resolved.manifest_path.clone(),
            package_id: self.target.resolved.package_id.clone(),
            package_name: self.target.resolved.package_name.clone(),
            bin: self.target.bin.clone(),
            expected_units: self.target.resolved.dependencies.len() as u64 + 1,
            relay_stderr,
        }
    }
}

/// The largest identity record read back (a record lists every dependency: a few MB at most).
pub const LARGEST_RECORD: u64 = 64 << 20;

/// Reads an identity record: ours in the target directory (which the agent can write: a named
/// pipe there must not hang the read) or one the human names (`--expect`, `--diff`).
pub fn read_record(path: &Path) -> Result<IdentityRecord, Failure> {
    let text = crate::base::fsutil::read_regular(path, LARGEST_RECORD).map_err(|e| {
        Failure::error(format!(
            "could not read identity record `{}`: {e}",
            path.display()
        ))
    })?;
    serde_json::from_slice(&text).map_err(|e| {
        Failure::error(format!(
            "`{}` is not an identity record: {e}",
            path.display()
        ))
    })
}

pub fn write_record(path: &Path, record: &IdentityRecord) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(record).expect("record serializes");
    crate::base::fsutil::write_atomic(path, (text + "\n").as_bytes())?;
    Ok(())
}

/// The result of one cycle.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one per build; boxing would only add noise at every use
pub enum CycleOutcome {
    Complete {
        record: IdentityRecord,
        previous: Option<IdentityRecord>,
        changed: Vec<Component>,
        problems: Vec<CaptureProblem>,
        executable: PathBuf,
        duration: Duration,
    },
    Failed {
        errors: usize,
        first_file: Option<String>,
        /// `file:line:col` of the first error.
        first_location: Option<String>,
        /// The first error's message.
        summary: Option<String>,
        last_good: Option<IdentityRecord>,
        duration: Duration,
    },
}

impl CycleOutcome {
    pub fn is_changed(&self) -> bool {
        matches!(self, CycleOutcome::Complete { changed, .. } if !changed.is_empty())
    }
}

/// Builds, captures, compares and (on success) records the new identity.
pub fn run_cycle(
    prep: &Prepared,
    server_args: &[String],
    relay_stderr: bool,
) -> Result<CycleOutcome, Failure> {
    let previous = prep.last_identity();
    // Our own digest (the launcher component) is needed only after the build: compute it while
    // cargo runs instead of on the critical path.
    let _ = std::thread::Builder::new()
        .name("launcher-digest".into())
        .spawn(crate::identity::capture::launcher);
    match build::run_build(&prep.request(relay_stderr))? {
        BuildOutcome::Failed {
            errors,
            first_file,
            first_location,
            summary,
            duration,
        } => Ok(CycleOutcome::Failed {
            errors,
            first_file,
            first_location,
            summary,
            // Started again by `--fallback last-good`, from a file in the target directory,
            // which the agent can write: only a record whose digests are those of its own
            // fields (red-team round 14: a record edited to run another command under a digest
            // a human approved). What a consistent record names runs under its own digest, in
            // a new epoch, after its bytes are verified.
            // Its workspace must be this one: the launch directory is hashed relative to it.
            last_good: previous.filter(|r| {
                crate::identity::fingerprint::inconsistency(r).is_none()
                    && std::path::Path::new(&r.workspace_root)
                        == prep.target.resolved.workspace_root
            }),
            duration,
        }),
        BuildOutcome::Built {
            executable,
            duration,
            ..
        } => {
            // The identity names the toolchain rustc really reported, never a remembered guess.
            let confirmed = prep.confirmed()?;
            let prep = &confirmed;
            let store = prep.store();
            let ctx = CaptureContext {
                target: &prep.target,
                args: &prep.args,
                rustc: &prep.rustc,
                server_args,
                cwd: std::env::current_dir()?,
            };
            let captured = capture::capture(&ctx, &executable, &store)
                .map_err(|e| Failure::new(exit_codes::IDENTITY_NOT_CAPTURED, e.to_string()))?;
            let record = captured.record;
            let changed = match &previous {
                Some(p) => fingerprint::changed_components(p, &record),
                None => Component::ALL.to_vec(),
            };
            write_record(&prep.identity_file(), &record)?;
            let mut keep: Vec<&str> = vec![&record.executable.sha256];
            if let Some(p) = &previous {
                keep.push(&p.executable.sha256);
            }
            store.gc(store::DEFAULT_KEEP, &keep);
            Ok(CycleOutcome::Complete {
                record,
                previous,
                changed,
                problems: captured.problems,
                executable,
                duration,
            })
        }
    }
}

/// The `build complete: …` / `build failed: …` status line.
pub fn status_line(prep: &Prepared, outcome: &CycleOutcome) -> String {
    match outcome {
        CycleOutcome::Complete {
            record,
            previous,
            changed,
            executable,
            ..
        } => {
            let exe = prep.executable_display(executable);
            match previous {
                None => format!(
                    "build complete: {exe} changed (none -> {}; no previous identity)",
                    short(&record.identity_digest)
                ),
                Some(_) if changed.is_empty() => {
                    format!(
                        "build complete: {exe} unchanged ({})",
                        short(&record.identity_digest)
                    )
                }
                Some(p) => format!(
                    "build complete: {exe} changed ({} -> {}; {})",
                    short(&p.identity_digest),
                    short(&record.identity_digest),
                    fingerprint::component_list(changed)
                ),
            }
        }
        CycleOutcome::Failed {
            errors,
            first_file,
            summary,
            last_good,
            ..
        } => {
            let what = match (first_file, summary) {
                (Some(f), _) => format!("{errors} error{} in {f}", plural(*errors)),
                (None, Some(s)) if *errors <= 1 => s.trim_start_matches("error: ").to_string(),
                _ => format!("{errors} error{}", plural(*errors)),
            };
            let last = last_good
                .as_ref()
                .map(|r| short(&r.identity_digest))
                .unwrap_or_else(|| "none".into());
            format!("build failed: {what} (last good: {last})")
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The same cycle as one JSON event (for `--message-format json`).
pub fn event_json(prep: &Prepared, outcome: &CycleOutcome) -> serde_json::Value {
    match outcome {
        CycleOutcome::Complete {
            record,
            previous,
            changed,
            problems,
            executable,
            duration,
        } => json!({
            "event": "build-complete",
            "label": prep.target.label,
            "executable": prep.executable_display(executable),
            "outcome": if previous.is_some() && changed.is_empty() { "unchanged" } else { "changed" },
            "identity": record.identity_digest,
            "previousIdentity": previous.as_ref().map(|p| &p.identity_digest),
            "executableSha256": record.executable.sha256,
            "storePath": record.executable.store_path,
            "changed": changed.iter().map(|c| c.name()).collect::<Vec<_>>(),
            "problems": problems.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
            "durationMs": duration.as_millis() as u64,
            "message": status_line(prep, outcome),
        }),
        CycleOutcome::Failed {
            errors,
            first_file,
            last_good,
            duration,
            ..
        } => json!({
            "event": "build-failed",
            "label": prep.target.label,
            "errors": errors,
            "file": first_file,
            "lastGood": last_good.as_ref().map(|r| &r.identity_digest),
            "durationMs": duration.as_millis() as u64,
            "message": status_line(prep, outcome),
        }),
    }
}
