//! The commands (`run`, `report`, `status`) as library functions, and what
//! they are built from: the build and worker ids ([`identity`]) and each
//! tool's specifics ([`tools`]: how its units run, and its agent command),
//! and what a rerun of an earlier build's failures runs ([`rerun`]).
//! The binary only parses arguments into the option structs and prints
//! errors.

pub mod identity;
mod report;
pub mod rerun;
mod run;
pub mod tools;

pub use report::{report, status, status_text, ReportOptions, StatusOptions};
pub use run::{run, RunOptions, LOCAL_BUILD};
pub use tools::ExecutionChoice;
