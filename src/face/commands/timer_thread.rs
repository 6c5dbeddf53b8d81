//! The one thread that keeps every timer `run`'s session asks for (`Io::schedule`): a heap of
//! deadlines fed over a channel; each timer that falls due is handed back (as an event).
//!
//! Owns: the deadlines and the thread. Must not touch: what a timer means (the session's).
//! It replaced a sleeping thread per timer, so a burst of re-armed timers costs nothing but
//! heap entries, and the process's thread list no longer churns.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use crossbeam_channel::{RecvTimeoutError, Sender};

/// Hands timers to its thread; dropping it ends the thread (pending timers are dropped too:
/// the session that asked for them is gone).
pub struct TimerThread<T> {
    tx: Sender<(Instant, T)>,
}

impl<T: Send + 'static> TimerThread<T> {
    /// Starts the thread; `deliver` gets each timer when it is due and returns `false` once
    /// nobody listens any more (the thread then ends).
    pub fn start(deliver: impl Fn(T) -> bool + Send + 'static) -> std::io::Result<TimerThread<T>> {
        let (tx, rx) = crossbeam_channel::unbounded::<(Instant, T)>();
        std::thread::Builder::new()
            .name("timers".into())
            .spawn(move || {
                let mut heap: BinaryHeap<Due<T>> = BinaryHeap::new();
                let mut seq = 0u64;
                loop {
                    let next = heap.peek().map(|d| d.at);
                    let received = match next {
                        None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                        Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
                    };
                    match received {
                        Ok((at, timer)) => {
                            seq += 1;
                            heap.push(Due { at, seq, timer });
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                    let now = Instant::now();
                    while heap.peek().is_some_and(|d| d.at <= now) {
                        let due = heap.pop().expect("peeked");
                        if !deliver(due.timer) {
                            return;
                        }
                    }
                }
            })?;
        Ok(TimerThread { tx })
    }

    /// `timer` is handed back after `delay` (timers due at the same time in the order asked).
    pub fn schedule(&self, delay: Duration, timer: T) {
        let _ = self.tx.send((Instant::now() + delay, timer));
    }
}

/// A deadline in the heap: the earliest (then the first asked) on top.
struct Due<T> {
    at: Instant,
    seq: u64,
    timer: T,
}

impl<T> PartialEq for Due<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl<T> Eq for Due<T> {}

impl<T> PartialOrd for Due<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for Due<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: `BinaryHeap` is a max-heap.
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Timers come back in deadline order (ties in the order asked), each once, on one thread,
    /// however many are pending; a timer asked for later with an earlier deadline comes first.
    #[test]
    fn timers_fall_due_in_deadline_order_on_one_thread() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let seen = got.clone();
        let timers = TimerThread::start(move |t: (u32, std::thread::ThreadId)| {
            seen.lock()
                .unwrap()
                .push((t.0, std::thread::current().id()));
            true
        })
        .unwrap();
        let me = std::thread::current().id();
        timers.schedule(Duration::from_millis(120), (3, me));
        timers.schedule(Duration::from_millis(60), (2, me));
        timers.schedule(Duration::from_millis(60), (22, me));
        timers.schedule(Duration::from_millis(0), (1, me));
        for _ in 0..200 {
            timers.schedule(Duration::from_secs(3600), (9, me)); // pending, never due here
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.lock().unwrap().len() < 4 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(50));
        let got = got.lock().unwrap().clone();
        let order: Vec<u32> = got.iter().map(|g| g.0).collect();
        assert_eq!(order, [1, 2, 22, 3]);
        let threads: std::collections::BTreeSet<String> =
            got.iter().map(|g| format!("{:?}", g.1)).collect();
        assert_eq!(threads.len(), 1, "one thread delivers every timer");
        assert_ne!(got[0].1, me);
    }

    /// Once nobody listens, the thread ends at the next timer; dropping the handle ends it too.
    #[test]
    fn the_thread_ends_when_nobody_listens() {
        let delivered = Arc::new(Mutex::new(0));
        let count = delivered.clone();
        let timers = TimerThread::start(move |_: ()| {
            *count.lock().unwrap() += 1;
            false
        })
        .unwrap();
        timers.schedule(Duration::ZERO, ());
        timers.schedule(Duration::from_millis(20), ());
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            *delivered.lock().unwrap(),
            1,
            "nothing after the listener left"
        );
        drop(timers);
    }
}
