//! Red team of the reshaped session core (issue 34, branch `core-state`): interleavings in which
//! the new server slot, routing table or host view behaves differently from the old core (main
//! at 8b20d72). Each test is named for what must hold; its doc says the interleaving, what the
//! old core did and what the new one does. They use only the harness (no field of the session),
//! so the same file runs against both cores.

use proptest::prelude::*;
use serde_json::json;

use super::testing::*;
use super::*;

/// The server of the current epoch exits with code 101 (a panic), at the current time. Returns
/// when the restart it announced is due (`None`: no restart was announced for this exit).
fn crash(h: &mut Harness) -> Option<u64> {
    let epoch = h.current_epoch().expect("a server runs");
    let lines = h.io().status.len();
    h.handle(Event::ChildExited {
        epoch,
        exit: ExitInfo {
            code: Some(101),
            signal: None,
        },
    });
    h.serve();
    let now = h.io().now_ms;
    h.io().status[lines..].iter().find_map(|line| {
        let ms = line
            .strip_prefix("restarting server in ")?
            .strip_suffix(" ms")?;
        Some(now + ms.parse::<u64>().ok()?)
    })
}

/// Moves the clock `ms` on, firing due timers in order (as [`Harness::advance`]); every server
/// a restart timer starts is started no earlier than the last restart announced on the
/// terminal (`announced`) said: "restarting server in N ms" is a promise the human and the
/// backoff rely on.
fn advance_checked(h: &mut Harness, ms: u64, announced: Option<u64>, what: &str) {
    let target = h.io().now_ms + ms;
    while let Some(timer) = h.io().take_due_timer(target) {
        let restart = matches!(timer, Timer::Restart);
        let spawned = h.io().spawned.len();
        h.handle(Event::Timer(timer));
        h.serve();
        if restart && h.io().spawned.len() > spawned {
            let now = h.io().now_ms;
            assert!(
                announced.is_some_and(|due| now >= due),
                "{what}: a restart timer started a server at {now} ms, but the last restart \
                 announced was due at {announced:?} ms; status: {:?}",
                h.io().status
            );
        }
    }
    h.io().now_ms = target;
}

/// A server runs (it was restarted).
fn assert_runs(h: &mut Harness) {
    let status = h.io().status.clone();
    assert!(h.current_epoch().is_some(), "no server runs: {status:?}");
}

/// The server crashes, `start` starts one in the gap before the restart timer fires, and that
/// one crashes `after` ms later: every restart comes when the terminal said.
fn second_crash_after_a_start_in_the_gap(h: &mut Harness, start: fn(&mut Harness), after: u64) {
    let announced = crash(h);
    assert!(announced.is_some(), "{:?}", h.io().status);
    start(h);
    assert!(h.current_epoch().is_some(), "a server starts in the gap");
    advance_checked(h, after, announced, "before the second crash");
    let announced = crash(h).or(announced);
    advance_checked(h, 2_000, announced, "after the second crash");
    assert_runs(h);
}

/// Interleaving: the server crashes (restart announced in 250 ms); within that gap a save's
/// build finishes and starts the new code at once; that server crashes too, 200 ms after the
/// first crash, before the first restart timer fired.
///
/// Old core (8b20d72, lifecycle.rs:479 `} else if !self.restart_scheduled {`): the flag stays
/// set while the build's server runs, so the second crash schedules nothing and says nothing;
/// the one restart timer starts the server at 250 ms, as announced.
///
/// New core (lifecycle.rs `} else { self.server.schedule_restart(); …`): `Server::started`
/// overwrote `RestartScheduled`, so the first timer is left armed with nothing to cancel it.
/// The second crash prints "restarting server in 500 ms" and arms a second timer; the stale
/// first one fires 50 ms after the crash, finds the new `RestartScheduled` and restarts at
/// once: the terminal says 500 ms, the restart comes after 50.
#[test]
fn a_restart_comes_no_sooner_than_the_status_line_said() {
    let (mut h, _) = Harness::serving_legacy();
    second_crash_after_a_start_in_the_gap(&mut h, |h| h.build(complete("b")), 200);
}

/// The same, one crash further: a stale timer must not cut a later backoff. Every crash
/// announces its own restart and keeps it (the old core said nothing on the second crash and
/// let the first crash's timer restart the server 50 ms after it; the reshaped slot carries
/// each restart's due time, so the first timer finds the second restart not due). The third
/// crash in the window then waits its whole second.
#[test]
fn an_earlier_crash_timer_never_cuts_a_later_backoff() {
    let (mut h, _) = Harness::serving_legacy();
    let t0 = h.io().now_ms;
    assert_eq!(crash(&mut h), Some(t0 + 250), "{:?}", h.io().status);
    h.build(complete("b"));
    h.advance(200);
    let second = crash(&mut h).expect("the second crash announces its restart");
    assert_eq!(second, t0 + 200 + 500, "{:?}", h.io().status);
    // The first crash's timer (250 ms) finds the second restart not due.
    advance_checked(&mut h, 60, Some(second), "before the second restart");
    assert!(h.current_epoch().is_none(), "{:?}", h.io().status);
    advance_checked(&mut h, 500, Some(second), "the second restart");
    assert_runs(&mut h);
    let now = h.io().now_ms;
    let third = crash(&mut h).expect("the third crash announces its restart");
    assert_eq!(
        third,
        now + 1_000,
        "the third crash's backoff: {:?}",
        h.io().status
    );
    advance_checked(&mut h, 3_000, Some(third), "after the third crash");
    assert_runs(&mut h);
}

/// The same through the human: the server crashes (restart in 250 ms) and the developer runs
/// `cargo mcp-dev restart` at once; that server crashes on the same bug 100 ms later. Old core:
/// nothing new is announced, the one timer restarts it at 250 ms. New core: `control.rs`'s
/// `Some(record) => … self.spawn_child(record, None, None)` puts `Running` over
/// `RestartScheduled` without cancelling its timer; the second crash announces 500 ms and the
/// stale timer restarts the server 150 ms after it.
#[test]
fn a_human_restart_in_the_gap_leaves_no_timer_behind() {
    let (mut h, _) = Harness::serving_legacy();
    let human = |h: &mut Harness| {
        let answer = h.control(json!({"op": "restart"}));
        assert_eq!(answer["result"]["started"], json!(true), "{answer}");
    };
    second_crash_after_a_start_in_the_gap(&mut h, human, 100);
}

/// Interleaving: the server crashes ("restarting server in 250 ms"); in that gap a save's build
/// finishes and starting it fails once (a transient `spawn` error: ETXTBSY while the copy is
/// written, EAGAIN), so a build runs again to capture a fresh copy (`rebuild_to_start`). The
/// start would succeed now.
///
/// Old core: the restart stays scheduled (`restart_scheduled` and `rebuilt_for_start.pending`
/// were two facts); at 250 ms `restart_due` starts the newest build, as announced, and the
/// rebuild's result then finds it running. New core: `Server::rebuild_to_start` overwrote
/// `RestartScheduled` (its debug assertion allows it), so the restart timer finds
/// `RebuildingToStart` and does nothing: no server until the rebuild ends, and none at all if
/// that build fails (a save with a compile error meanwhile): the announced restart was
/// silently dropped.
#[test]
fn a_failed_start_in_the_gap_does_not_drop_the_announced_restart() {
    let (mut h, _) = Harness::serving_legacy();
    let announced = crash(&mut h).expect("a restart is announced");
    h.io().spawn_error = Some("Text file busy (os error 26)".into());
    let builds = h.io().builds_started;
    h.build(complete("b"));
    let started = h.io().builds_started;
    assert_eq!(
        started,
        builds + 1,
        "a build to start it again: {:?}",
        h.io().status
    );
    h.io().spawn_error = None;
    let now = h.io().now_ms;
    h.advance(announced + 50 - now);
    assert!(
        h.current_epoch().is_some(),
        "the restart announced for {announced} ms did not happen: {:?}",
        h.io().status
    );
    // The rebuild then fails: a server still runs (the last good build).
    h.build(failed(Some("b")));
    assert!(h.current_epoch().is_some(), "{:?}", h.io().status);
}

/// An operation of [`restarts_keep_their_announced_delay`].
#[derive(Debug, Clone)]
enum Op {
    /// The running server exits (nothing if none runs).
    Crash,
    /// A save's build finishes with new code (no effect on a running server but a
    /// replacement, whose old server stops at once).
    Build,
    /// The human runs `cargo mcp-dev restart`.
    ControlRestart,
    /// Time passes.
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Crash),
        2 => Just(Op::Build),
        1 => Just(Op::ControlRestart),
        4 => (1u64..1_500).prop_map(Op::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// What the server slot should guarantee and the new one does not: whatever crashes,
    /// builds and human restarts interleave, a restart timer starts a server only when the
    /// last restart the terminal announced is due (one scheduled restart, one timer that
    /// counts: a timer armed for a restart that another start made moot must not fire into a
    /// later one).
    #[test]
    fn restarts_keep_their_announced_delay(ops in proptest::collection::vec(op(), 1..24)) {
        let (mut h, _) = Harness::serving_legacy();
        let mut announced: Option<u64> = None;
        let mut exe = 0;
        for op in ops {
            match op {
                Op::Crash if h.current_epoch().is_some() => {
                    if let Some(due) = crash(&mut h) {
                        announced = Some(due);
                    }
                }
                Op::Crash => {}
                Op::Build => {
                    exe += 1;
                    let old = h.current_epoch();
                    h.build(complete(&format!("b{exe}")));
                    if let Some(old) = old.filter(|o| h.current_epoch().as_ref() != Some(o)) {
                        h.handle(Event::ChildStopped { epoch: old });
                        h.serve();
                    }
                }
                Op::ControlRestart => {
                    let old = h.current_epoch();
                    h.control(json!({"op": "restart"}));
                    if let Some(old) = old.filter(|o| h.current_epoch().as_ref() != Some(o)) {
                        h.handle(Event::ChildStopped { epoch: old });
                        h.serve();
                    }
                }
                Op::Advance(ms) => advance_checked(&mut h, ms, announced, "property"),
            }
        }
    }
}
