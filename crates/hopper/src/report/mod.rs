//! What the queue knows about a build, for people: the report with its
//! verdict and JUnit XML, the status snapshot, and the timeline of lanes as
//! one HTML page.

pub mod html;
mod run_report;
pub mod status;
pub mod timeline;

pub use run_report::*;
