//! The server slot: at most one server process per session, and what is known about the next.
//!
//! Owns: [`Server`] and its transitions. Every change of the slot goes through one of the
//! functions here, each of which names (and in debug builds asserts) the states it may start
//! from, so "a child and a replacement at once" or "a restart scheduled for a running server"
//! cannot be written down. What a running server is doing (handshake, tools) is its
//! [`ChildPhase`]; why no server runs (build broken, crash loop…) is the lifecycle's.
//!
//! Must not touch: decisions (the lifecycle room decides when to start, stop or replace), I/O.

use super::state::{ChildPhase, ChildState, Replacing, Spawning};

/// The one server slot of a session.
#[derive(Debug)]
pub enum Server {
    /// No server process runs, and none is on its way by itself (a build may be running: its
    /// result starts one).
    Idle,
    /// The server exited and its restart is scheduled for `due_ms` (`Timer::Restart`). A timer
    /// armed for an earlier restart that did not happen (a build's server started in the gap)
    /// finds it not due: a restart never comes sooner than its status line said.
    RestartScheduled { due_ms: u64 },
    /// A build runs because the last server could not start from its stored copy (was the
    /// target directory cleaned?); its result starts the server. `restart_due`: a crash
    /// restart scheduled before, still due at that time (it starts the latest build then).
    RebuildingToStart { restart_due: Option<u64> },
    /// Supervise mode: the old server is stopping; the new epoch starts when it has stopped.
    Replacing(Replacing),
    /// A server was asked for ([`super::Effect::Spawn`]); its start is not reported yet.
    Spawning(Spawning),
    /// A server process runs, from its spawn until it exits or is stopped.
    Running(ChildState),
}

impl Server {
    /// The running server, if one runs.
    pub fn child(&self) -> Option<&ChildState> {
        match self {
            Server::Running(c) => Some(c),
            _ => None,
        }
    }

    pub fn child_mut(&mut self) -> Option<&mut ChildState> {
        match self {
            Server::Running(c) => Some(c),
            _ => None,
        }
    }

    /// The running server's phase, if one runs.
    pub fn phase(&self) -> Option<&ChildPhase> {
        self.child().map(|c| &c.phase)
    }

    /// A server runs, or its start, replacement or restart is under way (not counting builds).
    pub fn runs_or_restarts(&self) -> bool {
        matches!(
            self,
            Server::Running(_)
                | Server::Spawning(_)
                | Server::Replacing(_)
                | Server::RestartScheduled { .. }
        )
    }

    // ----- transitions ---------------------------------------------------------------------

    /// A server is asked for: from any state but a running one (its predecessor is gone). A
    /// crash restart scheduled now goes with it, for the case it fails to start.
    pub fn spawning(&mut self, mut spawning: Spawning) {
        debug_assert!(
            !matches!(self, Server::Running(_)),
            "a second server asked for while one runs"
        );
        spawning.restart_due = self.scheduled_restart();
        *self = Server::Spawning(spawning);
    }

    /// When the crash restart still scheduled is due, in whatever state carries it.
    fn scheduled_restart(&self) -> Option<u64> {
        match self {
            Server::RestartScheduled { due_ms } => Some(*due_ms),
            Server::RebuildingToStart { restart_due } => *restart_due,
            Server::Spawning(s) => s.restart_due,
            _ => None,
        }
    }

    /// The server asked for under `epoch` is reported (started or failed): taken out, and the
    /// slot is idle until the caller says what it is now.
    pub fn take_spawning(&mut self, epoch: &str) -> Option<Spawning> {
        let asked = matches!(self, Server::Spawning(s) if s.epoch == epoch);
        match self.take_if(asked) {
            Some(Server::Spawning(s)) => Some(s),
            _ => None,
        }
    }

    /// The slot's state, taken out (the slot is idle) when `take`.
    fn take_if(&mut self, take: bool) -> Option<Server> {
        take.then(|| std::mem::replace(self, Server::Idle))
    }

    /// A server was spawned: from any state but a running one (its predecessor is gone).
    pub fn started(&mut self, child: ChildState) {
        debug_assert!(
            !matches!(self, Server::Running(_)),
            "a second server started while one runs"
        );
        *self = Server::Running(child);
    }

    /// The running server is gone (it exited, could not serve, or the session ends): taken
    /// out, and the slot is idle.
    pub fn take_running(&mut self) -> Option<ChildState> {
        let running = matches!(self, Server::Running(_));
        match self.take_if(running) {
            Some(Server::Running(c)) => Some(c),
            _ => None,
        }
    }

    /// The server just taken out ([`Server::take_running`]) is being replaced: the slot holds
    /// the replacement until the old one has stopped.
    pub fn begin_replacement(&mut self, replacing: Replacing) {
        debug_assert!(matches!(self, Server::Idle), "a replacement of {self:?}");
        *self = Server::Replacing(replacing);
    }

    /// The replacement whose old server (`old_epoch`) has stopped, taken out to be started.
    pub fn take_replacement(&mut self, old_epoch: &str) -> Option<Replacing> {
        let stopped = matches!(self, Server::Replacing(r) if r.old_epoch == old_epoch);
        match self.take_if(stopped) {
            Some(Server::Replacing(r)) => Some(r),
            _ => None,
        }
    }

    /// The server exited and will be started again at `due_ms`: from idle only (it was just
    /// taken out).
    pub fn schedule_restart(&mut self, due_ms: u64) {
        debug_assert!(matches!(self, Server::Idle), "restart of {self:?}");
        *self = Server::RestartScheduled { due_ms };
    }

    /// A restart timer fired at `now_ms`: whether the scheduled restart is due (the slot is idle
    /// again). A timer of a restart that was overtaken finds nothing, or a later one not due.
    pub fn restart_due(&mut self, now_ms: u64) -> bool {
        match self {
            Server::RestartScheduled { due_ms } if *due_ms <= now_ms => {
                *self = Server::Idle;
                true
            }
            // A failed start's rebuild runs: the restart still happens when it was announced
            // (the latest build; the rebuild's result then finds it running).
            Server::RebuildingToStart { restart_due }
                if restart_due.is_some_and(|d| d <= now_ms) =>
            {
                *restart_due = None;
                true
            }
            _ => false,
        }
    }

    /// A server could not start from its stored copy and a build runs to capture it again;
    /// `restart_due`: a crash restart still scheduled (see [`Server::RebuildingToStart`]).
    pub fn rebuild_to_start(&mut self, restart_due: Option<u64>) {
        debug_assert!(
            !matches!(self, Server::Running(_) | Server::Replacing(_)),
            "a rebuild to start while {self:?}"
        );
        *self = Server::RebuildingToStart { restart_due };
    }

    /// A build finished: a rebuild to start is over (its result, if any, starts the server;
    /// a restart still scheduled stays so).
    pub fn build_finished(&mut self) {
        if let Server::RebuildingToStart { restart_due } = *self {
            *self = match restart_due {
                Some(due_ms) => Server::RestartScheduled { due_ms },
                None => Server::Idle,
            };
        }
    }

    /// Whether the build under way was asked for because a server could not start.
    pub fn rebuilding_to_start(&self) -> bool {
        matches!(self, Server::RebuildingToStart { .. })
    }
}
