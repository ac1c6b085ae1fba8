//! What the queue knows about a build, for people: the report with its
//! verdict (flaky units by [`flaky`], quarantined ones by [`quarantine`]) and JUnit XML, the status snapshot, and the timeline of lanes as
//! one HTML page. The report and the timeline read the event log through the
//! one reader in [`event_log`].

pub mod event_log;
pub mod flaky;
pub mod html;
mod junit;
pub mod quarantine;
mod run_report;
pub mod status;
pub mod timeline;

pub use flaky::FlakyResult;
pub use junit::FLAKY_PROPERTY;
pub use quarantine::{Quarantine, QUARANTINE_PROPERTY};
pub use run_report::*;
