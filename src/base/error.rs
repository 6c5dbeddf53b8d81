//! The error every command returns: a message for a human plus the documented exit code.

use crate::base::exit_codes;

/// A command failure: printed as `error: MESSAGE` (and `note: …` lines) on stderr, then the
/// process exits with `code` (see [`crate::base::exit_codes`]).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    pub code: i32,
    pub message: String,
    pub notes: Vec<String>,
}

impl Failure {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
            notes: Vec::new(),
        }
    }
    pub fn error(message: impl Into<String>) -> Self {
        Self::new(exit_codes::ERROR, message)
    }
    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.notes.push(note.into());
        self
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure::error(e.to_string())
    }
}

pub type CmdResult<T = i32> = Result<T, Failure>;
