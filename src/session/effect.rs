//! What the session core asks of its shell, as data: [`Effect`]s out, result events in.
//!
//! Owns: the [`Effect`] enum, the [`Outbox`] the rooms append effects to while one step is
//! handled, the step's clock ([`Now`]) and the id source ([`IdMint`]). Must not touch: any
//! I/O. The shell (`commands/run.rs`; `session::testing` in tests) performs a step's effects
//! with one rule for the audit log (group commit): every [`Effect::Audit`] of the step is
//! written, in one write, before any of the step's lines; when that write fails, the step's
//! `tools/call` lines to servers ([`Effect::ToChild`] with `call`) are dropped and the session
//! hears [`super::Event::AuditFailed`] with their ids.

use std::time::Duration;

use serde_json::Value;

use super::Timer;
use super::state::RecordedFacts;
use crate::audit::RecordData;
use crate::identity::epoch::LaunchRecord;
use crate::identity::fingerprint::IdentityRecord;
use crate::screen::status_lines::StatusEvent;

/// Names one control request from the shell's table of waiting clients; its answer is an
/// [`Effect::AnswerControl`] carrying it.
pub type Ticket = u64;

/// One thing the shell does for the session.
#[derive(Debug)]
pub enum Effect {
    /// One line (with `\n`) for the host. `droppable`: a notification that may be dropped (and
    /// counted) when the host stops reading and its queue is at its bound.
    ToHost { line: Vec<u8>, droppable: bool },
    /// One line for the server of `epoch` (dropped by the shell when that server is gone or
    /// never started). `call`: our id of a forwarded `tools/call`, dropped when the step's
    /// audit write fails.
    ToChild {
        epoch: String,
        line: Vec<u8>,
        droppable: bool,
        call: Option<u64>,
    },
    /// One audit record (written with the step's others before its lines).
    Audit {
        kind: &'static str,
        epoch: Option<String>,
        data: RecordData,
    },
    /// Start a build (never two at once); [`super::Event::BuildFinished`] follows.
    StartBuild,
    /// The last build is not used: undo what it recorded, so the next build is compared with
    /// the build in use.
    SetAsideBuild,
    /// Start the server of `record` under `epoch`; [`super::Event::Spawned`] or
    /// [`super::Event::SpawnFailed`] follows.
    Spawn {
        epoch: String,
        record: Box<IdentityRecord>,
    },
    /// Run the stop sequence of the server of `epoch`; [`super::Event::ChildStopped`] follows.
    Stop { epoch: String, grace: Duration },
    /// The server of `epoch` exited by itself: kill what is left of its process group.
    Reap { epoch: String },
    /// Deliver [`super::Event::Timer`] after `delay`.
    Arm { delay: Duration, timer: Timer },
    /// Close the host's connection after everything queued for it.
    CloseHost,
    /// Something a human watching the terminal is told (worded by `crate::screen::status_lines`;
    /// boxed: effects on the hot path stay small).
    Status(Box<StatusEvent>),
    /// The same, shown only with `-v`.
    Verbose(Box<StatusEvent>),
    /// The status document (`status`, the status file).
    Publish(Box<Value>),
    /// Keep the launch record of a new epoch.
    KeepLaunch(Box<LaunchRecord>),
    /// Keep what real servers of this package said, for later first contacts.
    KeepFacts(Box<RecordedFacts>),
    /// The answer to the control request of `ticket`.
    AnswerControl { ticket: Ticket, answer: Value },
}

/// What every room writes to and reads during a step: the effects, the step's time, where new
/// ids come from, and the deadlines the timers are armed for (so an unchanged deadline arms
/// nothing). Owned by mod.rs; the rooms only push effects and read the time.
#[derive(Debug)]
pub struct Step {
    /// The effects of the step being handled.
    pub out: Outbox,
    /// The time of the step being handled.
    pub now: Now,
    /// Where new epoch, run, grant and prompt ids come from.
    pub ids: IdMint,
    /// Our next request id (to servers and, for the server's requests, to the host).
    pub next_id: u64,
    /// The deadlines the one held-request, prompt and server timers are armed for.
    pub armed: super::state::ArmedTimers,
}

/// The effects of the step being handled, in order.
#[derive(Debug, Default)]
pub struct Outbox(Vec<Effect>);

impl Outbox {
    pub fn take(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.0)
    }

    /// Keeps a performed step's emptied list for the next step (no allocation per step).
    pub fn give_back(&mut self, mut spent: Vec<Effect>) {
        if self.0.is_empty() && spent.capacity() > self.0.capacity() {
            spent.clear();
            self.0 = spent;
        }
    }

    fn push(&mut self, effect: Effect) {
        self.0.push(effect);
    }

    pub fn to_host(&mut self, line: Vec<u8>) {
        self.push(Effect::ToHost {
            line,
            droppable: false,
        });
    }

    pub fn notify_host(&mut self, line: Vec<u8>) {
        self.push(Effect::ToHost {
            line,
            droppable: true,
        });
    }

    pub fn to_child(&mut self, epoch: &str, line: Vec<u8>) {
        self.child_line(epoch, line, false, None);
    }

    pub fn notify_child(&mut self, epoch: &str, line: Vec<u8>) {
        self.child_line(epoch, line, true, None);
    }

    /// A forwarded `tools/call` (our id `call`): dropped if the step's records are not written.
    pub fn call_to_child(&mut self, epoch: &str, line: Vec<u8>, call: u64) {
        self.child_line(epoch, line, false, Some(call));
    }

    fn child_line(&mut self, epoch: &str, line: Vec<u8>, droppable: bool, call: Option<u64>) {
        self.push(Effect::ToChild {
            epoch: epoch.to_string(),
            line,
            droppable,
            call,
        });
    }

    pub fn audit(&mut self, kind: &'static str, epoch: Option<&str>, data: RecordData) {
        self.push(Effect::Audit {
            kind,
            epoch: epoch.map(str::to_string),
            data,
        });
    }

    pub fn start_build(&mut self) {
        self.push(Effect::StartBuild);
    }

    pub fn set_aside_build(&mut self) {
        self.push(Effect::SetAsideBuild);
    }

    pub fn spawn(&mut self, epoch: &str, record: IdentityRecord) {
        self.push(Effect::Spawn {
            epoch: epoch.to_string(),
            record: Box::new(record),
        });
    }

    pub fn stop(&mut self, epoch: &str, grace: Duration) {
        self.push(Effect::Stop {
            epoch: epoch.to_string(),
            grace,
        });
    }

    pub fn reap(&mut self, epoch: &str) {
        self.push(Effect::Reap {
            epoch: epoch.to_string(),
        });
    }

    pub fn schedule(&mut self, delay: Duration, timer: Timer) {
        self.push(Effect::Arm { delay, timer });
    }

    pub fn close_host(&mut self) {
        self.push(Effect::CloseHost);
    }

    pub fn status(&mut self, event: StatusEvent) {
        self.push(Effect::Status(Box::new(event)));
    }

    pub fn verbose(&mut self, event: StatusEvent) {
        self.push(Effect::Verbose(Box::new(event)));
    }

    pub fn publish_status(&mut self, snapshot: Value) {
        self.push(Effect::Publish(Box::new(snapshot)));
    }

    pub fn record_launch(&mut self, launch: &LaunchRecord) {
        self.push(Effect::KeepLaunch(Box::new(launch.clone())));
    }

    pub fn record_facts(&mut self, facts: &RecordedFacts) {
        self.push(Effect::KeepFacts(Box::new(facts.clone())));
    }

    pub fn answer_control(&mut self, ticket: Ticket, answer: Value) {
        self.push(Effect::AnswerControl { ticket, answer });
    }
}

/// The time of a step, read once by the shell: monotonic milliseconds (deadlines, durations;
/// from any fixed start) and milliseconds since the Unix epoch (grants, records, the status
/// document).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Now {
    pub mono_ms: u64,
    pub wall_ms: u64,
}

impl Now {
    /// RFC 3339 wall time with milliseconds (`2026-12-07T21:10:32.123Z`).
    pub fn timestamp(self) -> String {
        let at = std::time::UNIX_EPOCH + Duration::from_millis(self.wall_ms);
        humantime::format_rfc3339_millis(at).to_string()
    }
}

/// Where new unique ids (epochs, agent runs, grants, prompts) come from: seeded once by the
/// shell, advanced by the session, so the core reads no clock and no random source.
#[derive(Debug, Clone)]
pub enum IdMint {
    /// ULIDs: the step's wall time, then 80 bits from a generator seeded by the shell.
    Ulid { state: u64 },
    /// `ID0001`, `ID0002`, …: deterministic ids (the test shell).
    Counted { last: u64 },
}

impl IdMint {
    /// ULIDs from `seed` (the shell takes it from the system's random source).
    pub fn ulid(seed: u64) -> IdMint {
        IdMint::Ulid { state: seed }
    }

    pub fn mint(&mut self, now: Now) -> String {
        match self {
            IdMint::Ulid { state } => {
                let high = splitmix64(state);
                let low = splitmix64(state);
                let random = ((u128::from(high) << 64) | u128::from(low)) & ((1u128 << 80) - 1);
                ulid::Ulid::from_parts(now.wall_ms, random).to_string()
            }
            IdMint::Counted { last } => {
                *last += 1;
                format!("ID{:04}", *last)
            }
        }
    }
}

/// One step of SplitMix64 (a well-mixed 64-bit sequence from any seed).
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulids_are_distinct_and_carry_the_steps_wall_time() {
        let mut ids = IdMint::ulid(7);
        let now = Now {
            mono_ms: 0,
            wall_ms: 1_700_000_000_000,
        };
        let a = ids.mint(now);
        let b = ids.mint(now);
        assert_ne!(a, b);
        let parsed = ulid::Ulid::from_string(&a).expect("a ULID");
        assert_eq!(parsed.timestamp_ms(), 1_700_000_000_000);
        assert_eq!(now.timestamp(), "2023-11-14T22:13:20.000Z");
    }
}
