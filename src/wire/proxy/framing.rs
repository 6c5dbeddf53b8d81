//! Newline-delimited framing: one JSON message per line, `\r\n` accepted, bounded line length.
//!
//! A line longer than the limit is consumed to its end and reported as [`Frame::Oversize`] so the
//! stream stays in sync; the caller decides what to say about it.

use std::io::{self, BufRead};

/// Default maximum line length: well above the 16 MiB the hosts' SDKs may send.
pub const DEFAULT_MAX_LINE: usize = 64 * 1024 * 1024;

/// How much of an oversize line is kept (enough to find its id).
const PREFIX_KEEP: usize = 4096;

/// A line at least this long is "long": the next line that does not fit the reader's buffer
/// starts with room for as much, and the pipe it came through is worth widening (a pipe's
/// default capacity).
pub const LONG_LINE: usize = 64 << 10;

#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// One line without its terminator (`\n` or `\r\n`). Blank lines are skipped.
    Line(Vec<u8>),
    /// A line longer than the limit; `prefix` holds its first bytes (for error messages and to
    /// recover an id), `len` its full length.
    Oversize { prefix: Vec<u8>, len: usize },
    /// End of stream.
    Eof,
}

/// Reads frames from a buffered reader.
pub struct LineReader<R> {
    inner: R,
    max: usize,
    /// Length of the last line that did not fit in the reader's buffer: the next such line
    /// starts with that much room instead of being copied at every doubling (a large
    /// `tools/list` answer, hundreds of KB, usually comes again at the same size).
    last_long: usize,
}

impl<R: BufRead> LineReader<R> {
    pub fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner,
            max,
            last_long: 0,
        }
    }

    /// The next non-blank frame.
    pub fn next_frame(&mut self) -> io::Result<Frame> {
        loop {
            let mut line = Vec::new();
            let mut len = 0usize;
            let mut oversize = false;
            let mut saw_any = false;
            let mut long = false;
            loop {
                let buf = match self.inner.fill_buf() {
                    Ok(b) => b,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
                if buf.is_empty() {
                    if !saw_any {
                        return Ok(Frame::Eof);
                    }
                    break; // last line without a newline
                }
                saw_any = true;
                let (chunk, done) = match memchr_newline(buf) {
                    Some(i) => (&buf[..i], Some(i + 1)),
                    None => (buf, None),
                };
                if done.is_none() && line.is_empty() && !oversize {
                    long = true;
                    line.reserve(self.last_long.max(2 * chunk.len()).min(self.max));
                }
                len += chunk.len();
                if !oversize && line.len() + chunk.len() > self.max {
                    oversize = true;
                    line.truncate(PREFIX_KEEP);
                }
                let room = if oversize {
                    PREFIX_KEEP.saturating_sub(line.len())
                } else {
                    chunk.len()
                };
                line.extend_from_slice(&chunk[..room.min(chunk.len())]);
                let consumed = done.unwrap_or(buf.len());
                self.inner.consume(consumed);
                if done.is_some() {
                    break;
                }
            }
            if oversize {
                return Ok(Frame::Oversize { prefix: line, len });
            }
            if long && line.len() >= LONG_LINE {
                self.last_long = line.len();
            } else if line.capacity() > 2 * line.len().max(PREFIX_KEEP) {
                // Room reserved for a long line that turned out short: not kept with it.
                line.shrink_to_fit();
            }
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            return Ok(Frame::Line(line));
        }
    }
}

impl<R> LineReader<R> {
    /// The reader underneath (its descriptor, for the caller's own settings).
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// Whether a line of at least [`LONG_LINE`] bytes was read.
    pub fn saw_long_line(&self) -> bool {
        self.last_long >= LONG_LINE
    }
}

impl<R: io::Read> LineReader<io::BufReader<R>> {
    /// Whether [`LineReader::next_frame`] would return a line without reading: the first
    /// non-blank line in the buffer is complete. Lets a reader hand several lines that arrived
    /// together to the session in one go, and never wait for more input while holding some.
    pub fn line_buffered(&self) -> bool {
        let mut rest = self.inner.buffer();
        while let Some(i) = memchr_newline(rest) {
            if !rest[..i].iter().all(|b| b.is_ascii_whitespace()) {
                return true;
            }
            rest = &rest[i + 1..];
        }
        false
    }
}

fn memchr_newline(buf: &[u8]) -> Option<usize> {
    memchr::memchr(b'\n', buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(input: &[u8], max: usize) -> Vec<Frame> {
        let mut r = LineReader::new(io::BufReader::with_capacity(7, input), max);
        let mut out = Vec::new();
        loop {
            let f = r.next_frame().unwrap();
            let end = f == Frame::Eof;
            out.push(f);
            if end {
                return out;
            }
        }
    }

    #[test]
    fn splits_lines_accepting_crlf_and_skipping_blanks() {
        let f = frames(b"{\"a\":1}\r\n\n  \r\n{\"b\":2}\n{\"c\":3}", 100);
        assert_eq!(
            f,
            vec![
                Frame::Line(b"{\"a\":1}".to_vec()),
                Frame::Line(b"{\"b\":2}".to_vec()),
                Frame::Line(b"{\"c\":3}".to_vec()),
                Frame::Eof
            ]
        );
    }

    #[test]
    fn oversize_line_is_skipped_and_stream_stays_in_sync() {
        let mut input = vec![b'x'; 50];
        input.extend_from_slice(b"\n{\"ok\":true}\n");
        let f = frames(&input, 20);
        assert!(matches!(&f[0], Frame::Oversize { len: 50, prefix } if prefix.len() == 50));
        assert_eq!(f[1], Frame::Line(b"{\"ok\":true}".to_vec()));
    }

    #[test]
    fn a_buffered_line_is_seen_only_when_complete_and_not_blank() {
        let input: &[u8] = b"{\"a\":1}\n \r\n\n{\"b\":2}\n{\"c\"";
        let mut r = LineReader::new(io::BufReader::with_capacity(64, input), 100);
        assert!(!r.line_buffered(), "nothing read yet");
        assert_eq!(r.next_frame().unwrap(), Frame::Line(b"{\"a\":1}".to_vec()));
        assert!(r.line_buffered(), "blank lines then a whole one");
        assert_eq!(r.next_frame().unwrap(), Frame::Line(b"{\"b\":2}".to_vec()));
        assert!(!r.line_buffered(), "the last line has no end yet");
        let mut blanks = LineReader::new(io::BufReader::with_capacity(64, &b"{}\n \n\n"[..]), 100);
        blanks.next_frame().unwrap();
        assert!(!blanks.line_buffered(), "only blank lines follow");
    }

    /// A long line leaves a hint (the next long line starts with that much room) and says the
    /// pipe is worth widening; a short line that crossed the buffer's end afterwards is not
    /// kept with the long line's room.
    #[test]
    fn long_lines_leave_room_for_the_next_and_short_ones_do_not_keep_it() {
        // 200,699 bytes and its `\n`: the short line starts 4 bytes before the end of the
        // reader's 1,024-byte buffer, so its first chunk has no newline.
        let mut input = vec![b'a'; 200_699];
        input.extend_from_slice(b"\n{\"short\":1}\n");
        input.extend_from_slice(&[b'c'; 199_999]);
        input.push(b'\n');
        let mut r = LineReader::new(io::BufReader::with_capacity(1024, &input[..]), 1 << 20);
        assert!(!r.saw_long_line());
        let Frame::Line(first) = r.next_frame().unwrap() else {
            panic!()
        };
        assert_eq!(first.len(), 200_699);
        assert!(r.saw_long_line());
        let Frame::Line(short) = r.next_frame().unwrap() else {
            panic!()
        };
        assert_eq!(short, b"{\"short\":1}");
        assert!(short.capacity() < 1 << 16, "capacity {}", short.capacity());
        let Frame::Line(next) = r.next_frame().unwrap() else {
            panic!()
        };
        assert_eq!(next.len(), 199_999);
    }

    #[test]
    fn sixteen_mib_line_passes() {
        let mut input = vec![b'a'; 16 * 1024 * 1024 + 10];
        input.push(b'\n');
        let mut r = LineReader::new(io::BufReader::new(&input[..]), DEFAULT_MAX_LINE);
        match r.next_frame().unwrap() {
            Frame::Line(l) => assert_eq!(l.len(), 16 * 1024 * 1024 + 10),
            other => panic!("{other:?}"),
        }
    }
}
