//! # hopper
//!
//! A distributed test runner on leasehold's fenced unit queue. A build's test
//! suite is cut into units (files or single tests); any number of workers pull
//! units from a shared queue, run them, and report. Failed units are retried
//! within budgets, units of dead workers are reclaimed, and one report step
//! waits for the end and prints the verdict, JUnit XML and the flaky units. On
//! one machine (the default `mem://` queue) it is a local parallel runner with
//! no server at all.
//!
//! The crate is cut like cargo-nextest: a thin binary (`src/main.rs`: clap and
//! anyhow) over this library, whose logic is generic over
//! `Arc<dyn UnitQueue>`:
//!
//! * [`units`]: unit lists from a file, globs, or the test tool's own listing;
//! * [`discover`]: the test tool's own listing, checked against its own count
//!   (and, for cargo-test, each unit run exactly: [`discover::cargo_exact`]);
//! * [`agent`]: persistent test processes fed over a JSON-lines pipe;
//! * [`launch`]: units started without a command template (Rust test binaries, directly);
//! * [`template`]: the `{unit}` command template;
//! * [`process`]: one invocation in its own process group, bounded output,
//!   TERM-then-KILL on timeout or stop;
//! * [`runner`]: the worker (slots, batches, heartbeats, fenced transitions);
//! * [`verdicts`]: each unit's result in a batch, from the tool's own report,
//!   and the errors the tool reports outside any test ([`verdicts::outside`]),
//!   which fail the build whatever the mode;
//! * [`outage`]: queue calls that ride out an outage for `--outage-grace`;
//! * [`unit_groups`]: the unit process groups a second signal or the reaper kills;
//! * [`report`] and [`status`]: what the queue knows, as text and JUnit XML;
//! * [`timeline`] and [`html`]: the build's lanes over time, as one HTML page;
//! * [`timings`]: earlier durations that order units slowest first;
//! * [`backend`]: the one module that turns a `--queue` URL into a backend;
//! * [`subcommands`]: `run`, `report` and `status` as functions;
//! * [`errors`]: precise error types and exit codes.
#![warn(missing_docs)]

pub mod agent;
pub mod backend;
pub mod discover;
pub mod errors;
pub mod html;
pub mod identity;
pub mod launch;
pub mod observer;
mod orphans;
pub mod outage;
pub mod process;
pub mod report;
pub mod runner;
pub mod status;
pub mod subcommands;
pub mod template;
#[cfg(test)]
mod test_queue;
pub mod timeline;
pub mod timings;
pub mod unit_groups;
pub mod units;
pub mod verdicts;

pub use errors::{exit, HopperError};
