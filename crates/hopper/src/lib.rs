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
//! `Arc<dyn UnitQueue>`. The modules, in the order a unit meets them:
//!
//! * [`commands`]: `run`, `report` and `status` as functions, the ids, and each tool's agent command;
//! * [`units`]: where units come from: a list, globs, the tool's own listing, earlier timings;
//! * [`worker`]: the worker: its slots (batches or agents), heartbeats and fenced transitions;
//! * [`agent`]: a persistent test process and the JSON-lines protocol it speaks;
//! * [`exec`]: one invocation: the `{unit}` template, the process and its process group;
//! * [`verdicts`]: the verdict on each unit of an invocation, from its exit code or the tool's report;
//! * [`queue`]: the backend a `--queue` URL names, and queue calls that ride out an outage;
//! * [`report`]: what the queue knows, as a report, JUnit XML, a status snapshot and an HTML timeline;
//! * [`errors`]: precise error types and exit codes.
#![warn(missing_docs)]

pub mod agent;
pub mod commands;
pub mod errors;
pub mod exec;
pub mod queue;
pub mod report;
pub mod units;
pub mod verdicts;
pub mod worker;

pub use errors::{exit, HopperError};
