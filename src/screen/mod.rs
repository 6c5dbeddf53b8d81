//! The screen layer: what a person sees: the status lines on stderr (and the feed kept for `status
//! --follow`), stdout, the sanitizer for untrusted text, shared wording.
//!
//! It imports only from its own layer and the ones below it (see `tests/layers.rs`).

pub mod output;
pub mod sanitize;
pub mod status_lines;
pub mod stderr;
pub mod stderr_feed;
pub mod wording;
