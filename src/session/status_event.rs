//! What the session tells a human watching the terminal, as typed events: each names what
//! happened and carries its data. Their English wording is the screen's
//! (`crate::status_lines`), rendered by the shell and by the test shell.

/// One status event of the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusEvent {
    /// A line not yet given its own event (worded where it happened).
    Text(String),
}
