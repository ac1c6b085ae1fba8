//! The in-memory backend (in progress).
#![warn(missing_docs)]
