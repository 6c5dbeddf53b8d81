//! The clocks of the records: [`Moment`], one reading of both clocks for an event, and
//! `RecordClock`, the `time` text of a record (RFC 3339, UTC, milliseconds), formatted from a
//! time it is given. Must not touch: files, the chain (the sealer in [`super::seal`] asks it for
//! text), and the clocks themselves except in [`Moment::now`].

use std::time::{Instant, SystemTime};

/// The `time` of records: RFC 3339, UTC, milliseconds. The text up to the second is kept and
/// reused within that second (formatting a date per record was a visible share of a call).
#[derive(Debug, Default)]
pub(crate) struct RecordClock {
    second: u64,
    /// `2025-06-01T12:00:00.` for `second`; empty before the first stamp.
    prefix: String,
    /// The last stamp (reused: no string per record).
    stamp: String,
}

/// One reading of both clocks: the time of an event, shared by everything done for it (a call
/// read the clocks ten times, at ~25 ns each, before `run` took one reading per event).
#[derive(Debug, Clone, Copy)]
pub struct Moment {
    pub mono: Instant,
    pub wall: SystemTime,
}

impl Moment {
    pub fn now() -> Moment {
        Moment {
            mono: Instant::now(),
            wall: SystemTime::now(),
        }
    }
}

impl RecordClock {
    pub(crate) fn stamp(&mut self, t: SystemTime) -> &str {
        let since = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        if self.prefix.is_empty() || since.as_secs() != self.second {
            let full = humantime::format_rfc3339_millis(t).to_string();
            // `YYYY-MM-DDTHH:MM:SS.mmmZ`: keep through the `.`.
            self.prefix = full[..full.len() - 4].to_string();
            self.second = since.as_secs();
        }
        let ms = since.subsec_millis();
        self.stamp.clear();
        self.stamp.push_str(&self.prefix);
        for d in [ms / 100, ms / 10 % 10, ms % 10] {
            self.stamp.push(char::from(b'0' + d as u8));
        }
        self.stamp.push('Z');
        &self.stamp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::writer::testing::*;

    #[test]
    fn record_clock_writes_what_humantime_writes_across_seconds() {
        let mut clock = RecordClock::default();
        let base = std::time::UNIX_EPOCH + Duration::from_millis(1_764_000_000_000);
        // Within a second, across a second, a minute and a day, and back in time.
        for ms in [
            0u64, 7, 999, 1000, 1001, 59_999, 60_000, 86_399_999, 86_400_000, 5, 123_456,
        ] {
            let t = base + Duration::from_millis(ms);
            assert_eq!(
                clock.stamp(t),
                humantime::format_rfc3339_millis(t).to_string(),
                "{ms}"
            );
        }
    }
}
