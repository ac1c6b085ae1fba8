//! hopper, the distributed test runner (in progress).
#![warn(missing_docs)]
