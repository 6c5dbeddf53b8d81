//! The server slot: at most one server process per session, and what is known about the next.
//!
//! Owns: [`Server`] and a running server's [`ChildPhase`], and their transitions. Every change
//! of either goes through one of the functions here, each of which names (and in debug builds
//! asserts) the states it may start from, so "a child and a replacement at once", "a restart
//! scheduled for a running server" or "a fetch before the handshake" cannot be written down.
//! Why no server runs (build broken, crash loop…) is the lifecycle's.
//!
//! Must not touch: decisions (the lifecycle room decides when to start, stop or replace), I/O.

use super::state::{Audience, ChildPhase, ChildState, Fetch, Replacing, Spawning, Tools};

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

/// A running server's phase transitions (the rooms decide when; these say from where).
impl ChildPhase {
    /// Our handshake (`initialize`, or modern `server/discover`) is sent, to be answered by
    /// `due_ms`: from a fresh server, or one whose discover failed and that waits for the
    /// host's `initialize`.
    pub fn handshake_sent(&mut self, due_ms: u64) {
        debug_assert!(
            matches!(self, ChildPhase::Started),
            "handshake from {self:?}"
        );
        *self = ChildPhase::Handshaking { due_ms };
    }

    /// Its `server/discover` was refused or not answered: it waits for the host's
    /// `initialize` again.
    pub fn discover_failed(&mut self) {
        debug_assert!(
            matches!(self, ChildPhase::Handshaking { .. }),
            "discover failed from {self:?}"
        );
        *self = ChildPhase::Started;
    }

    /// Legacy: it answered our `initialize`; the host's `notifications/initialized` is awaited.
    pub fn initialized(&mut self) {
        debug_assert!(
            matches!(self, ChildPhase::Handshaking { .. }),
            "initialized from {self:?}"
        );
        *self = ChildPhase::AwaitingInitialized;
    }

    /// A fetch of its tools begins (`audience`: who hears what it brings), due by `due_ms`; or
    /// the one in flight starts over from its first page (a change was announced during it),
    /// keeping what it refreshes, its audience and its count. From a server past its handshake
    /// only. Returns whether a fetch is now in flight.
    pub fn fetch_begins(&mut self, audience: Audience, due_ms: u64) -> bool {
        match self {
            ChildPhase::Up(Tools::Fetching(f)) => {
                *f = Fetch {
                    refetches: f.refetches,
                    ..Fetch::new(f.of, f.audience, due_ms)
                }
            }
            ChildPhase::Started => {
                debug_assert!(false, "fetch before the handshake");
                return false;
            }
            phase => {
                let of = phase.listed();
                *phase = ChildPhase::Up(Tools::Fetching(Fetch::new(of, audience, due_ms)));
            }
        }
        true
    }

    /// The fetch in flight ended: its tools are now `tools` (known, or not known). Nothing
    /// happens to a server with no fetch in flight.
    pub fn fetch_ended(&mut self, tools: Tools) {
        debug_assert!(
            !matches!(tools, Tools::Fetching(_)),
            "a fetch ends in a fetch"
        );
        if self.fetch().is_some() {
            *self = ChildPhase::Up(tools);
        }
    }
}
