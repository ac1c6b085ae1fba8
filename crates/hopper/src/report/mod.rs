//! What the queue knows about a build, for people: the report with its
//! verdict and JUnit XML, the status snapshot, and the timeline of lanes as
//! one HTML page. The report and the timeline read the event log through the
//! one reader in [`event_log`].

pub mod event_log;
pub mod html;
mod run_report;
pub mod status;
pub mod timeline;

pub use run_report::*;
