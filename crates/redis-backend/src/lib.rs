//! The Redis backend (in progress).
#![warn(missing_docs)]
