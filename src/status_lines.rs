//! The wording of the session's status lines (the screen layer): every [`StatusEvent`] the
//! session core reports, as the line a human reads on stderr. The `run` shell and the
//! session's test shell both render through this `Display`, so tests read the text users do.

use std::fmt;

use crate::session::StatusEvent;

impl fmt::Display for StatusEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatusEvent::Text(line) => f.write_str(line),
        }
    }
}
