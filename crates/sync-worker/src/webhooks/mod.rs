//! Webhooks: mail events POSTed to a user's receivers, at least once.
//!
//! * A user registers a receiver URL and the events it takes
//!   (`message.new`, `message.updated`, `message.deleted`) through the API
//!   (`POST /v1/webhooks`); it gets a signing secret back, once.
//! * The engine's fenced write records one delivery per (event, webhook)
//!   in the same SQL transaction as the change (`storage/webhooks.rs`),
//!   so an event is stored exactly when its change is.
//! * Every worker runs a [`dispatcher`]: the deliveries of one commit are
//!   one run of the core's unit queue (`UnitQueue`), one unit per delivery.
//!   The queue hands each to one worker at a time, reclaims it from a
//!   worker that died, and counts its retries (`WEBHOOK_RETRIES`, with a
//!   doubling backoff from `WEBHOOK_BACKOFF` up to `WEBHOOK_BACKOFF_MAX`).
//!   A delivery that uses up its retries fails and pauses its webhook: no
//!   POST goes out for it until the user resumes it
//!   (`POST /v1/webhooks/{id}/resume`), and its events meanwhile are held,
//!   then sent.
//! * Each POST carries the event id (in the body and `X-Webhook-Event-Id`)
//!   for de-duplication and an HMAC-SHA256 signature ([`signature`]).
//!   Deliveries of different events may arrive in any order.
//! * Receivers follow the address rule of IMAP hosts ([`sender`]).

pub mod dispatcher;
mod recorder;
pub mod sender;
mod settings;
pub mod signature;

pub use dispatcher::{spawn, DispatchError, DispatcherHandle};
pub use sender::{check_url, ClientError, Sender, UrlError};
pub use settings::WebhookSettings;
