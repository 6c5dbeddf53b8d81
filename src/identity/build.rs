//! The build driver: runs `$CARGO build --message-format=json-render-diagnostics` with the
//! pass-through flags, streams its messages, shows progress, and finds the server executable.
//!
//! Owns the cargo invocation and its output. cargo renders compiler diagnostics itself on its
//! stderr, which we relay line by line (above the progress bar on a TTY). It never starts or
//! touches the server's processes.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cargo_metadata::{Message, TargetKind};

use crate::base::error::Failure;
use crate::base::exit_codes;
use crate::screen::stderr;

/// Which package, binary, profile, features and target cargo builds, and how it may resolve
/// the graph: the pass-through cargo flags as plain data (the command line's clap types stay
/// in the face; `cli::CargoArgs::selection` converts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CargoSelection {
    /// `--package`
    pub package: Option<String>,
    /// `--bin` (else the config's `bin`, the only bin, or `default-run`)
    pub bin: Option<String>,
    /// `--release`
    pub release: bool,
    /// `--profile`
    pub profile: Option<String>,
    /// `--features`
    pub features: Vec<String>,
    /// `--all-features`
    pub all_features: bool,
    /// `--no-default-features`
    pub no_default_features: bool,
    /// `--target`
    pub target: Option<String>,
    /// `--target-dir`
    pub target_dir: Option<PathBuf>,
    /// `--manifest-path`
    pub manifest_path: Option<PathBuf>,
    /// `--locked`
    pub locked: bool,
    /// `--offline`
    pub offline: bool,
    /// `--frozen`
    pub frozen: bool,
}

impl CargoSelection {
    /// The flags that decide how cargo resolves the package graph, in the order cargo prints
    /// them: the one place both `cargo metadata` and `cargo build` get them from.
    pub fn resolution_flags(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.locked {
            v.push("--locked".into());
        }
        if self.offline {
            v.push("--offline".into());
        }
        if self.frozen {
            v.push("--frozen".into());
        }
        if self.all_features {
            v.push("--all-features".into());
        }
        if self.no_default_features {
            v.push("--no-default-features".into());
        }
        for f in &self.features {
            v.push("--features".into());
            v.push(f.clone());
        }
        v
    }
}

/// What to build.
#[derive(Debug, Clone)]
pub struct BuildRequest {
    pub cargo: PathBuf,
    pub args: CargoSelection,
    pub manifest_path: PathBuf,
    pub package_id: String,
    pub package_name: String,
    pub bin: String,
    /// Rough number of compilation units (packages in the graph), for the progress bar total.
    pub expected_units: u64,
    /// Relay cargo's own stderr (Compiling… lines and diagnostics).
    pub relay_stderr: bool,
}

/// The profile name cargo will use, as `--profile` spells it.
pub fn profile_name(args: &CargoSelection) -> String {
    if let Some(p) = &args.profile {
        p.clone()
    } else if args.release {
        "release".into()
    } else {
        "dev".into()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildOutcome {
    Built {
        executable: PathBuf,
        /// cargo did not recompile the server binary itself.
        fresh: bool,
        warnings: usize,
        duration: Duration,
    },
    Failed {
        errors: usize,
        /// The first file named by a diagnostic (`src/main.rs`).
        first_file: Option<String>,
        /// `file:line:col` of the first error.
        first_location: Option<String>,
        /// cargo's last `error:` line (e.g. lockfile needs to be updated but --locked was passed).
        summary: Option<String>,
        duration: Duration,
    },
}

/// The `cargo build` argument list for a request (exposed for tests and `-v`).
pub fn cargo_build_args(req: &BuildRequest) -> Vec<String> {
    let a = &req.args;
    let mut v: Vec<String> = vec![
        "build".into(),
        "--message-format=json-render-diagnostics".into(),
        "--manifest-path".into(),
        req.manifest_path.display().to_string(),
        "--package".into(),
        req.package_id.clone(),
        "--bin".into(),
        req.bin.clone(),
    ];
    if let Some(p) = &a.profile {
        v.extend(["--profile".into(), p.clone()]);
    } else if a.release {
        v.push("--release".into());
    }
    v.extend(a.resolution_flags());
    if let Some(t) = &a.target {
        v.extend(["--target".into(), t.clone()]);
    }
    if let Some(d) = &a.target_dir {
        v.extend(["--target-dir".into(), d.display().to_string()]);
    }
    v.push("--color".into());
    v.push(if stderr::color_enabled() {
        "always".into()
    } else {
        "never".into()
    });
    if stderr::quiet() {
        v.push("--quiet".into());
    }
    for _ in 0..stderr::verbose().saturating_sub(1) {
        v.push("--verbose".into());
    }
    v
}

/// Pid of the cargo build in progress (0 when none): `run` stops it on shutdown so a supervisor
/// told to exit (e.g. a host's probing copy) does not leave cargo holding the build lock. cargo
/// stays in our process group so Ctrl-C in a terminal reaches it as usual.
static RUNNING_BUILD: AtomicU32 = AtomicU32::new(0);

/// Set once this process stops building for good (shutdown, or the build was handed to the
/// background): a build thread that was about to start cargo (it may still be reading metadata
/// when the host leaves) must not start a second cargo behind our back.
static NO_MORE_BUILDS: AtomicBool = AtomicBool::new(false);

/// Terminates the cargo build in progress, if any, and keeps this process from starting another.
pub fn cancel_running() {
    // Flag first, then take the pid; `run_build` stores the pid, then reads the flag. With both
    // sequentially consistent, at least one side sees the other, so no cargo is left running.
    NO_MORE_BUILDS.store(true, Ordering::SeqCst);
    let pid = RUNNING_BUILD.swap(0, Ordering::SeqCst);
    if pid != 0 {
        crate::base::sys::unix::signal_process(pid, crate::base::sys::unix::Sig::Term);
    }
}

/// Hands a build the host abandoned (it closed the connection during a cold build, as hosts
/// do before retrying) to a detached cargo of its own: our cargo is stopped, and the same
/// `cargo build` goes on in its own process group with its output in `log`, so the host's retry
/// finds it further along or done. cargo's lock on the target directory keeps it the only build
/// of that directory: the retry's build waits for it instead of starting a second one.
pub fn continue_in_background(req: &BuildRequest, log: &Path) -> std::io::Result<u32> {
    use std::os::unix::process::CommandExt as _;
    cancel_running();
    // Owned by one process with a deadline (`cargo mcp-dev background-build`), in its own
    // process group so the host's stop sequence for us does not reach it.
    let me = std::env::current_exe()?;
    let child = Command::new(me)
        .arg("mcp-dev")
        .arg("background-build")
        .arg("--log")
        .arg(log)
        .arg("--timeout-secs")
        .arg(BACKGROUND_BUILD_TIMEOUT.as_secs().to_string())
        .arg("--")
        .arg(&req.cargo)
        .args(cargo_build_args(req))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    Ok(child.id())
}

fn cancelled() -> Failure {
    Failure::new(
        exit_codes::ERROR,
        "the build was cancelled: the supervisor is stopping",
    )
}

/// How long an abandoned first build may go on in the background.
pub const BACKGROUND_BUILD_TIMEOUT: Duration = Duration::from_secs(900);

/// Runs cargo build and waits for it; compiler diagnostics appear on stderr as cargo renders them.
pub fn run_build(req: &BuildRequest) -> Result<BuildOutcome, Failure> {
    if NO_MORE_BUILDS.load(Ordering::SeqCst) {
        return Err(cancelled());
    }
    let started = Instant::now();
    let args = cargo_build_args(req);
    stderr::verbose_line(&format!(
        "     Running `{} {}`",
        req.cargo.display(),
        args.join(" ")
    ));
    let mut child = Command::new(&req.cargo)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            Failure::new(
                exit_codes::METADATA_FAILED,
                format!("could not run `{}`: {e}", req.cargo.display()),
            )
        })?;

    RUNNING_BUILD.store(child.id(), Ordering::SeqCst);
    if NO_MORE_BUILDS.load(Ordering::SeqCst)
        && RUNNING_BUILD
            .compare_exchange(child.id(), 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    {
        // Shutdown began while cargo was being started, and `cancel_running` did not see it.
        let _ = child.kill();
        let _ = child.wait();
        return Err(cancelled());
    }
    let progress = Progress::new(req.expected_units);
    let stderr = child.stderr.take().expect("piped");
    let relay = req.relay_stderr;
    let bar = progress.bar.clone();
    // cargo's stderr carries Compiling lines and rendered diagnostics: relay it and count errors.
    let stderr_thread =
        std::thread::spawn(move || scan_cargo_stderr(BufReader::new(stderr), relay, bar.as_ref()));

    let stdout = child.stdout.take().expect("piped");
    let mut executable: Option<PathBuf> = None;
    let mut fresh = true;
    for msg in Message::parse_stream(BufReader::new(stdout)) {
        let Ok(msg) = msg else { continue };
        match msg {
            Message::CompilerArtifact(art) => {
                progress.unit(&art.target.name);
                let is_server = art.target.kind.contains(&TargetKind::Bin)
                    && art.target.name == req.bin
                    && art.package_id.repr == req.package_id;
                if is_server {
                    fresh = art.fresh;
                    executable = art.executable.map(|p| p.into_std_path_buf());
                }
            }
            Message::BuildScriptExecuted(_) => progress.unit("build script"),
            _ => {}
        }
    }
    let exit = child.wait()?;
    let _ = RUNNING_BUILD.compare_exchange(child.id(), 0, Ordering::SeqCst, Ordering::SeqCst);
    let mut scan = stderr_thread.join().unwrap_or_default();
    if let Some(n) = scan.reported_errors {
        scan.errors = n;
    }
    progress.finish();
    let duration = started.elapsed();
    if !exit.success() {
        return Ok(BuildOutcome::Failed {
            errors: scan.errors.max(1),
            first_file: scan.first_file,
            first_location: scan.first_location,
            summary: scan.first_error.or(scan.last_error),
            duration,
        });
    }
    let executable = executable.ok_or_else(|| {
        Failure::new(
            exit_codes::IDENTITY_NOT_CAPTURED,
            format!(
                "cargo reported no executable for bin `{}` of `{}`",
                req.bin, req.package_name
            ),
        )
    })?;
    Ok(BuildOutcome::Built {
        executable,
        fresh,
        warnings: scan.warnings,
        duration,
    })
}

#[derive(Debug, Default)]
struct StderrScan {
    errors: usize,
    reported_errors: Option<usize>,
    warnings: usize,
    first_file: Option<String>,
    /// `file:line:col` of the first error.
    first_location: Option<String>,
    /// The first error's message.
    first_error: Option<String>,
    last_error: Option<String>,
}

fn scan_cargo_stderr(
    reader: impl BufRead,
    relay: bool,
    bar: Option<&indicatif::ProgressBar>,
) -> StderrScan {
    let mut scan = StderrScan::default();
    for line in reader.split(b'\n') {
        let Ok(line) = line else { break };
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches('\r');
        let plain = console::strip_ansi_codes(text);
        let trimmed = plain.trim_start();
        if let Some(rest) = trimmed.strip_prefix("error") {
            // `error[E0425]: …` counts; cargo's closing `error: could not compile …` does not.
            if rest.starts_with(':') && rest.contains("could not compile") {
                // cargo's own count is authoritative when it gives one.
                if let Some(n) = previous_errors(rest) {
                    scan.reported_errors = Some(scan.reported_errors.unwrap_or(0) + n);
                }
            } else if rest.starts_with(": aborting due to") {
            } else if rest.starts_with(':') || rest.starts_with('[') {
                scan.errors += 1;
                if scan.first_error.is_none() {
                    scan.first_error = Some(trimmed.to_string());
                }
                scan.last_error = Some(trimmed.to_string());
            }
        } else if trimmed.starts_with("warning:") && !trimmed.contains("generated") {
            scan.warnings += 1;
        } else if let Some(loc) = trimmed.strip_prefix("--> ")
            && scan.first_file.is_none()
            && scan.errors > 0
        {
            scan.first_file = loc.split(':').next().map(str::to_string);
            scan.first_location = Some(loc.trim().to_string());
        }
        if relay {
            // Not all cargo's own text: a build script's warnings are the package's code.
            let text = crate::screen::sanitize::colored_line(text);
            match bar {
                Some(b) => b.suspend(|| stderr::raw(&text)),
                None => stderr::raw(&text),
            }
        } else if let Some(b) = bar
            && let Some(name) = trimmed.strip_prefix("Compiling ")
        {
            b.set_message(name.split(' ').next().unwrap_or("").to_string());
        }
    }
    scan
}

/// `could not compile `x` (bin "x") due to 3 previous errors` → 3.
fn previous_errors(line: &str) -> Option<usize> {
    let idx = line.find("due to ")?;
    let rest = &line[idx + "due to ".len()..];
    let rest = rest
        .strip_prefix("a previous error")
        .map(|_| "1")
        .unwrap_or(rest);
    rest.split(' ').next()?.parse().ok()
}

/// An indicatif bar on an interactive stderr only.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    fn new(total: u64) -> Progress {
        if !stderr::progress_enabled() {
            return Progress { bar: None };
        }
        let bar = indicatif::ProgressBar::new(total.max(1));
        bar.set_style(
            indicatif::ProgressStyle::with_template("    Building [{bar:27}] {pos}/{len}: {msg}")
                .expect("static template")
                .progress_chars("=> "),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        Progress { bar: Some(bar) }
    }
    fn unit(&self, name: &str) {
        if let Some(b) = &self.bar {
            if b.position() + 1 >= b.length().unwrap_or(0) {
                b.set_length(b.position() + 2);
            }
            b.inc(1);
            b.set_message(name.to_string());
        }
    }
    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// Where cargo puts the bin for a profile (used when no build ran, e.g. `identity --no-build`).
pub fn expected_executable(target_dir: &Path, args: &CargoSelection, bin: &str) -> PathBuf {
    let profile = profile_name(args);
    let dir = match profile.as_str() {
        "dev" | "test" => "debug".to_string(),
        "release" | "bench" => "release".to_string(),
        other => other.to_string(),
    };
    let mut p = target_dir.to_path_buf();
    if let Some(t) = &args.target {
        p.push(t);
    }
    p.push(dir);
    p.push(bin);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_errors_from_cargo_summary() {
        assert_eq!(
            previous_errors(": could not compile `x` (bin \"x\") due to 3 previous errors"),
            Some(3)
        );
        assert_eq!(
            previous_errors(
                ": could not compile `x` (bin \"x\") due to 1 previous error; 2 warnings emitted"
            ),
            Some(1)
        );
        assert_eq!(
            previous_errors(": could not compile `x` due to a previous error"),
            Some(1)
        );
    }

    #[test]
    fn scan_finds_first_file_and_error_count() {
        let text = "   Compiling x v0.1.0\nerror[E0425]: cannot find value `y`\n --> src/main.rs:3:5\n  |\nerror: aborting due to 2 previous errors\nerror: could not compile `x` (bin \"x\") due to 2 previous errors\n";
        let s = scan_cargo_stderr(text.as_bytes(), false, None);
        assert_eq!(s.errors, 1);
        assert_eq!(s.reported_errors, Some(2));
        assert_eq!(s.first_file.as_deref(), Some("src/main.rs"));
    }

    #[test]
    fn profile_names() {
        let mut a = CargoSelection::default();
        assert_eq!(profile_name(&a), "dev");
        a.release = true;
        assert_eq!(profile_name(&a), "release");
        a.profile = Some("fast".into());
        assert_eq!(profile_name(&a), "fast");
        assert!(expected_executable(Path::new("/t"), &a, "s").ends_with("fast/s"));
    }
}
