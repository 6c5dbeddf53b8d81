//! A pseudo-terminal for tests of the terminal inbox (`approve --follow`): the screen it shows
//! and a keyboard to type into it.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::Read;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A pseudo-terminal: (master, slave).
pub fn pty() -> (std::fs::File, OwnedFd) {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("openpt");
    grantpt(&master).expect("grantpt");
    unlockpt(&master).expect("unlockpt");
    let name = ptsname(&master, Vec::new()).expect("ptsname");
    let slave = rustix::fs::open(
        name.as_c_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY,
        rustix::fs::Mode::empty(),
    )
    .expect("open the pty slave");
    (std::fs::File::from(master), slave)
}

/// Everything the terminal showed so far.
pub struct Screen(Arc<Mutex<String>>);

impl Screen {
    pub fn read_from(mut master: std::fs::File) -> Screen {
        let text = Arc::new(Mutex::new(String::new()));
        let copy = text.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = master.read(&mut buf) {
                if n == 0 {
                    break;
                }
                copy.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Screen(text)
    }

    pub fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }

    /// Waits until the screen shows `needle` after byte `from`; the offset just past it.
    pub fn wait_for(&self, from: usize, needle: &str) -> usize {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let t = self.text();
            if let Some(i) = t.get(from..).and_then(|rest| rest.find(needle)) {
                return from + i + needle.len();
            }
            assert!(
                Instant::now() < deadline,
                "the inbox never showed `{needle}`; screen:\n{t}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
