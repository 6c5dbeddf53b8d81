//! hops-relay: a diagnostic proxy with the thread topology of `cargo mcp-dev run` but no protocol
//! work. Lines are framed (one message per line), and every line goes reader thread -> one
//! central thread -> writer thread over std mpsc channels (the same list-channel algorithm as
//! crossbeam's `unbounded`, spin-then-yield-then-park), so a round trip makes four thread
//! hand-offs where `relay` makes none. Comparing it with `relay` and with `run` separates the cost
//! of the topology from the cost of the per-message work (parsing, gating, audit).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc::channel;

enum Event {
    FromHost(Vec<u8>),
    FromChild(Vec<u8>),
    HostClosed,
    ChildClosed,
}

fn main() {
    let mut args = std::env::args_os().skip(1);
    let program = args.next().expect("usage: hops-relay PROGRAM [ARGS...]");
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let mut child_in = child.stdin.take().expect("piped");
    let child_out = child.stdout.take().expect("piped");
    let (events, central) = channel::<Event>();

    let tx = events.clone();
    std::thread::spawn(move || {
        let mut r = BufReader::new(std::io::stdin().lock());
        loop {
            let mut line = Vec::new();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx.send(Event::FromHost(line)).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = tx.send(Event::HostClosed);
    });
    let tx = events;
    std::thread::spawn(move || {
        let mut r = BufReader::new(child_out);
        loop {
            let mut line = Vec::new();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx.send(Event::FromChild(line)).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = tx.send(Event::ChildClosed);
    });
    let (to_child, child_rx) = channel::<Option<Vec<u8>>>();
    let child_writer = std::thread::spawn(move || {
        while let Ok(Some(line)) = child_rx.recv() {
            if child_in
                .write_all(&line)
                .and_then(|()| child_in.flush())
                .is_err()
            {
                break;
            }
        }
    });
    let (to_host, host_rx) = channel::<Vec<u8>>();
    let host_writer = std::thread::spawn(move || {
        let mut out = std::io::stdout().lock();
        while let Ok(line) = host_rx.recv() {
            if out.write_all(&line).and_then(|()| out.flush()).is_err() {
                break;
            }
        }
    });
    while let Ok(ev) = central.recv() {
        match ev {
            Event::FromHost(l) => {
                let _ = to_child.send(Some(l));
            }
            Event::FromChild(l) => {
                let _ = to_host.send(l);
            }
            Event::HostClosed => {
                let _ = to_child.send(None);
            }
            Event::ChildClosed => break,
        }
    }
    drop(to_host);
    let _ = host_writer.join();
    let _ = child_writer.join();
    let code = child.wait().map(|s| s.code().unwrap_or(1)).unwrap_or(1);
    std::process::exit(code);
}
