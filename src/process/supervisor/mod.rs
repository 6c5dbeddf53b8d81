//! The server's process: spawn in its own process group, watch for exit, stop it with the
//! hosts' sequence (close stdin, grace, SIGTERM to the group, grace, SIGKILL to the group).
//!
//! Owns processes and exit statuses; it never reads or writes JSON-RPC content (the session
//! gets the pipes). Platform calls live in [`crate::base::sys::unix`].

use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::base::sys::unix;
pub use crate::base::sys::unix::ExitInfo;

/// What to start.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    /// Extra environment for the server (e.g. `CARGO_MCP_DEV_EPOCH`).
    pub env: Vec<(String, String)>,
    /// The verified, open executable named by `argv[0]` (see [`crate::identity::store::open_verified`]):
    /// when set, the process is started from this descriptor (`argv[0]` stays as given), so the
    /// bytes that were hashed are the bytes that run.
    pub program: Option<Arc<std::fs::File>>,
}

#[derive(Default)]
struct ExitCell {
    exit: Mutex<Option<ExitInfo>>,
    cond: Condvar,
}

/// A running (or exited) server process. Cheap to clone; all clones see the same exit.
#[derive(Clone)]
pub struct Worker {
    pub pid: u32,
    cell: Arc<ExitCell>,
}

/// A freshly spawned worker and its pipes.
pub struct Spawned {
    pub worker: Worker,
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
    pub stderr: ChildStderr,
}

/// How the stop sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escalation {
    /// Exited after stdin closed.
    StdinClosed,
    /// Needed SIGTERM.
    Terminated,
    /// Needed SIGKILL.
    Killed,
}

/// Spawns the server in its own process group; `on_exit` runs on a waiter thread when it ends.
pub fn spawn(
    spec: &LaunchSpec,
    on_exit: impl FnOnce(ExitInfo) + Send + 'static,
) -> std::io::Result<Spawned> {
    let (program, args) = spec
        .argv
        .split_first()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty argv"))?;
    let mut attempt = 0;
    let mut child: Child = loop {
        let mut cmd = match &spec.program {
            Some(file) => unix::command_from_fd(file, program),
            None => Command::new(program),
        };
        cmd.args(args)
            .current_dir(&spec.cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &spec.env {
            cmd.env(k, v);
        }
        unix::own_process_group(&mut cmd);
        match cmd.spawn() {
            Ok(c) => break c,
            // A store entry written a moment ago can still be open for writing in a child forked
            // by another thread (ETXTBSY until that child execs); retry briefly.
            Err(e) if unix::is_text_busy(&e) && attempt < 20 => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    };
    let stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let worker = Worker {
        pid: child.id(),
        cell: Arc::new(ExitCell::default()),
    };
    let cell = worker.cell.clone();
    std::thread::Builder::new()
        .name(format!("wait-{}", worker.pid))
        .spawn(move || {
            let status = child.wait();
            let info = match status {
                Ok(s) => unix::exit_info(s),
                Err(_) => ExitInfo {
                    code: None,
                    signal: None,
                },
            };
            *cell.exit.lock().expect("exit cell") = Some(info);
            cell.cond.notify_all();
            on_exit(info);
        })?;
    Ok(Spawned {
        worker,
        stdin,
        stdout,
        stderr,
    })
}

impl Worker {
    pub fn exited(&self) -> Option<ExitInfo> {
        *self.cell.exit.lock().expect("exit cell")
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<ExitInfo> {
        let deadline = Instant::now() + timeout;
        let mut guard = self.cell.exit.lock().expect("exit cell");
        while guard.is_none() {
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            guard = self
                .cell
                .cond
                .wait_timeout(guard, deadline - now)
                .expect("exit cell")
                .0;
        }
        *guard
    }

    /// The stop sequence. `close_stdin` must close the child's stdin (the caller owns the pipe).
    /// Whatever happens, the whole process group gets SIGKILL at the end so grandchildren that
    /// stayed in the group do not outlive the server.
    pub fn stop(
        &self,
        close_stdin: impl FnOnce(),
        grace: Duration,
    ) -> (Option<ExitInfo>, Escalation) {
        close_stdin();
        let (exit, escalation) = if let Some(e) = self.wait_timeout(grace) {
            (Some(e), Escalation::StdinClosed)
        } else {
            unix::signal_group(self.pid, unix::Sig::Term);
            match self.wait_timeout(grace) {
                Some(e) => (Some(e), Escalation::Terminated),
                None => {
                    unix::signal_group(self.pid, unix::Sig::Kill);
                    (
                        self.wait_timeout(Duration::from_secs(2)),
                        Escalation::Killed,
                    )
                }
            }
        };
        unix::signal_group(self.pid, unix::Sig::Kill);
        (exit, escalation)
    }

    /// SIGKILL to the group, now (used when the supervisor itself must go at once).
    pub fn kill_group(&self) {
        unix::signal_group(self.pid, unix::Sig::Kill);
    }
}
