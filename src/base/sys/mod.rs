//! The platform seam: every call that differs between operating systems lives below here
//! (Linux first; macOS uses the same POSIX calls where it has them, and gets a conservative
//! fallback where it does not). Callers ask for what they need in domain words (own process
//! group, signal a group, peer uid of a socket, open without following links) and never use
//! `rustix` or `std::os` process/socket APIs directly for those.

pub mod mapped;
pub mod unix;
