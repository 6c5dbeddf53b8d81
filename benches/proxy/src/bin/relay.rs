//! relay: the floor of one proxy hop. Spawns `argv[1..]` and copies bytes stdin -> child stdin and
//! child stdout -> stdout on two threads, with no parsing and no buffering beyond one read. Child
//! stderr is inherited. Exits when the child's stdout closes (after closing its stdin on our EOF).

use std::io::{Read, Write};
use std::process::{Command, Stdio};

fn pump(mut from: impl Read, mut to: impl Write) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // A line may be split across reads; each read is forwarded as is, like any byte proxy.
        if to.write_all(&buf[..n]).and_then(|()| to.flush()).is_err() {
            return;
        }
    }
}

fn main() {
    let mut args = std::env::args_os().skip(1);
    let program = args.next().expect("usage: relay PROGRAM [ARGS...]");
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let child_in = child.stdin.take().expect("piped");
    let child_out = child.stdout.take().expect("piped");
    // Dropping child_in when our stdin reaches EOF closes the child's stdin.
    std::thread::spawn(move || pump(std::io::stdin().lock(), child_in));
    pump(child_out, std::io::stdout().lock());
    let code = child.wait().map(|s| s.code().unwrap_or(1)).unwrap_or(1);
    std::process::exit(code);
}
