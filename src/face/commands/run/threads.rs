//! The `run` shell's threads: the host reader (framing, batching lines read together into one
//! step), the servers' readers and the event loop that hands every other event to the session,
//! the signal and parent watchers. Each step is handed to the session under the shared lock and
//! its effects performed by the shell (`shell`); lines for servers are written after the lock
//! is released.
//!
//! Must not touch: decisions (the session's), what an effect does (`shell`).

use super::*;

/// The session behind its lock. Host and child lines are handled on the thread that read them
/// (no hand-off on the hot path); slower events go through the event channel.
pub(super) type Shared = Arc<Mutex<Running>>;

/// Hands an event to the session on the current thread; wakes the main thread when the session
/// decided to end.
pub(super) fn deliver(me: &Weak<Mutex<Running>>, events: Vec<Event>) -> bool {
    deliver_and_pump(me, events).is_some()
}

/// [`deliver`], returning the server outlets it wrote to (`None`: the session ended).
pub(super) fn deliver_and_pump(
    me: &Weak<Mutex<Running>>,
    events: Vec<Event>,
) -> Option<Vec<Outlet>> {
    let shared = me.upgrade()?;
    let mut running = shared.lock().unwrap_or_else(|e| e.into_inner());
    // One reading of the clocks for everything done for these events (see `Moment`), taken
    // under the lock, so moments follow the order the session sees events in.
    let moment = Moment::now();
    running.shell.begin_moment(moment);
    let now = running.shell.now(moment);
    // Lines for the server are queued under the lock and written after it is released: the
    // write wakes the server, and its answer must not find the session still locked by us.
    running.step(events, now, true);
    let Running { session, shell } = &mut *running;
    shell.flush_audit();
    let pumps = std::mem::take(&mut shell.pumps);
    // A due anchor rewrite is done last, after the lock (the next host or server line need not
    // wait for it), and only when nothing went to a server: then the answer (written under the
    // lock) is already with the host. When a request was just forwarded, its answer's delivery
    // takes the rewrite instead: on a busy core, writing here would delay that answer.
    let (anchor, prepare) = if pumps.is_empty() {
        // Likewise the next part of the log's reserved space, when it is nearly used up, and
        // (at a host's pace) its next pages: here no call waits for them (see
        // `AuditLog::reserve_ahead` and [`HOST_PACE`]).
        let now = moment.mono;
        let paced = shell
            .last_quiet_delivery
            .replace(now)
            .is_none_or(|last| now.duration_since(last) >= HOST_PACE);
        let prepare = shell.audit.reserve_ahead(paced).unwrap_or_else(|e| {
            shell.audit_warning(&e);
            None
        });
        (shell.audit.take_anchor_update(), prepare)
    } else {
        (None, None)
    };
    shell.end_moment();
    let ended = session.exit_code().is_some();
    if ended {
        let _ = shell.done.try_send(());
    }
    drop(running);
    for outlet in &pumps {
        outlet.pump();
    }
    // Outside the lock: the next line, host's or server's, need not wait for it.
    if let Some(pages) = prepare {
        pages.apply();
    }
    if let Some(Err(e)) = anchor.map(AnchorUpdate::write) {
        let running = shared.lock().unwrap_or_else(|e| e.into_inner());
        running.shell.audit_warning(&e);
    }
    (!ended).then_some(pumps)
}

/// Answers further apart than this are a host's pace: after one, the log's next pages are
/// made writable (`AuditLog::reserve_ahead`) in the host's pause, where a record copied into
/// a page not yet written would fault on the next call's path, with cold caches. Closer
/// together (calls back to back or pipelined) the pages are left to fault as they are first
/// written: there, preparing them measured as a slower 99th percentile, since the work lands
/// between one call and the next anyway.
pub(super) const HOST_PACE: Duration = Duration::from_millis(1);

/// Lines handed to the session under one lock at most (see [`next_batch`]).
pub(super) const BATCH: usize = 32;

/// The next frame, then every further line already in the reader's buffer (up to [`BATCH`]):
/// lines that arrived together are handled under one lock instead of one lock each, and the
/// reader never waits for more input while it holds some. The flag says the stream ended
/// (after the returned events).
pub(super) fn next_batch<R: std::io::Read>(
    reader: &mut LineReader<BufReader<R>>,
    mut event: impl FnMut(Frame) -> Option<Event>,
) -> (Vec<Event>, bool) {
    let mut batch = Vec::new();
    loop {
        match reader.next_frame().ok().and_then(&mut event) {
            Some(e) => batch.push(e),
            None => return (batch, true),
        }
        if batch.len() >= BATCH || !reader.line_buffered() {
            return (batch, false);
        }
    }
}

pub(super) fn event_loop(
    shared: &Shared,
    events: &Receiver<Event>,
    controls: &Receiver<control_socket::ControlCall>,
    done: &Receiver<()>,
) -> i32 {
    let exit_code = || {
        shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .session
            .exit_code()
    };
    // One event as one step, at the time it is handled.
    let handle = |event: Event| {
        let mut running = shared.lock().unwrap_or_else(|e| e.into_inner());
        // A reader thread that panicked mid-delivery left its moment set: these events
        // read the clocks.
        running.shell.end_moment();
        let now = running.shell.now(Moment::now());
        running.step(vec![event], now, false);
        running.shell.flush_audit_anchored();
        running.session.exit_code()
    };
    loop {
        crossbeam_channel::select! {
            recv(events) -> event => {
                let Ok(event) = event else { return exit_codes::OK };
                if let Some(code) = handle(event) {
                    return code;
                }
            }
            recv(controls) -> call => {
                let Ok(control_socket::ControlCall { request, reply }) = call else { continue };
                // Taken up (or dropped) and handled under one lock each; the ticket names it.
                let ticket = shared.lock().unwrap_or_else(|e| e.into_inner()).shell.take_up(reply);
                if let Some(ticket) = ticket
                    && let Some(code) = handle(Event::Control { request, ticket })
                {
                    return code;
                }
            }
            recv(done) -> _ => {
                if let Some(code) = exit_code() {
                    return code;
                }
            }
        }
    }
}

pub(super) fn spawn_host_reader(me: Weak<Mutex<Running>>) {
    let _ = std::thread::Builder::new()
        .name("host-in".into())
        .spawn(move || {
            let stdin = std::io::stdin();
            let mut reader = LineReader::new(
                BufReader::with_capacity(1 << 16, stdin.lock()),
                DEFAULT_MAX_LINE,
            );
            loop {
                let (mut batch, ended) = next_batch(&mut reader, |frame| match frame {
                    Frame::Line(line) => Some(Event::HostLine(line)),
                    Frame::Oversize { prefix, len } => Some(Event::HostOversize { prefix, len }),
                    Frame::Eof => None,
                });
                if ended {
                    batch.push(Event::HostEof);
                }
                let Some(written) = deliver_and_pump(&me, batch) else {
                    break;
                };
                if ended {
                    break;
                }
                wait_for_the_server_to_catch_up(&written);
            }
        });
}

/// Bytes of host lines queued for the server beyond what its pipe holds before the host reader
/// waits for them to drain, as a byte relay would (the host's own pipe holds the rest).
pub(super) const READ_AHEAD: usize = 256 << 10;

/// Backpressure from the server to the host: a host that sends faster than the server reads
/// (20,000 pipelined calls) fills the host's pipe, not our memory. Bounded: a server that stops
/// reading altogether costs each batch at most 100 ms of waiting (the host's next message, or its
/// end, is still read), and the outlet's own bound then answers what does not fit.
pub(super) fn wait_for_the_server_to_catch_up(written: &[Outlet]) {
    // The outlets' own counters: the session is not locked again (its other reader may be
    // handling the server's answer right now).
    let started = Instant::now();
    while written.iter().map(Outlet::queued_bytes).sum::<usize>() > READ_AHEAD
        && started.elapsed() < Duration::from_millis(100)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub(super) fn spawn_signal_watch(events: Sender<Event>) -> Result<(), Failure> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| Failure::error(format!("cannot install signal handlers: {e}")))?;
    let _ = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                let _ = events.send(Event::Shutdown(format!(
                    "received {}",
                    unix::signal_name(sig)
                )));
            }
        });
    Ok(())
}

/// Some hosts die without closing our stdin; when our parent changes, the host is gone.
/// The thread sleeps until then (a pidfd on Linux: no periodic wake-ups while idle).
pub(super) fn spawn_parent_watch(events: Sender<Event>) {
    let parent = unix::parent_pid();
    let _ = std::thread::Builder::new()
        .name("parent-watch".into())
        .spawn(move || {
            unix::wait_for_parent_exit(parent, Duration::from_millis(500));
            let _ = events.send(Event::Shutdown("the host process exited".into()));
        });
}
