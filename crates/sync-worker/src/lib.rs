//! sync-worker, the IMAP account syncer (in progress).
#![warn(missing_docs)]
