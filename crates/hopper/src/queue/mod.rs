//! The queue as hopper uses it: the one module that turns a `--queue` URL
//! into a backend, the wrapper whose calls ride out an outage, the
//! deliveries it keeps to hand back, and (in tests) a queue that fails on
//! purpose.

pub mod backend;
mod orphans;
pub mod outage;
#[cfg(test)]
pub(crate) mod test_queue;
