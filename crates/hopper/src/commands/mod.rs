//! The commands (`run`, `report`, `status`) as library functions, and what
//! they are built from: the build and worker ids ([`identity`]) and each
//! tool's specifics ([`tools`]: how its units run, and its agent command).
//! The binary only parses arguments into the option structs and prints
//! errors.

pub mod identity;
mod report;
mod run;
pub mod tools;

pub use report::{report, status, status_text, ReportOptions, StatusOptions};
pub use run::{run, RunOptions, LOCAL_BUILD};
pub use tools::ExecutionChoice;
