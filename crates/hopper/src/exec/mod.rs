//! One invocation of a test command: the `{unit}` template that builds its
//! command line, the process run in its own process group with bounded
//! output, and the registry of those groups that a second signal or the
//! reaper kills.

pub mod groups;
pub mod process;
pub mod template;
