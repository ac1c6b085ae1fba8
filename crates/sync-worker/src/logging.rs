//! The log filter: `--log` / `RUST_LOG`, with the crates that print what
//! they send and receive held below `trace`.
//!
//! At `trace`, tungstenite prints every WebSocket frame with its payload,
//! and a browser's first frame carries its session token. No secret may
//! reach a log at any level, so those crates log at `debug` at most, whatever
//! the filter asks (`tests/api_logs.rs` checks every secret at `trace`).

use tracing_subscriber::filter::{Directive, EnvFilter, ParseError};

/// Crates whose `trace` output carries the bytes of a connection.
const PAYLOAD_PRINTERS: [&str; 2] = ["tungstenite", "tokio_tungstenite"];

/// `spec` (an `EnvFilter` directive list), with [`PAYLOAD_PRINTERS`] at
/// `debug` at most.
pub fn filter(spec: &str) -> Result<EnvFilter, ParseError> {
    let mut filter = EnvFilter::try_new(spec)?;
    for name in PAYLOAD_PRINTERS {
        let cap: Directive = format!("{name}=debug").parse()?;
        filter = filter.add_directive(cap);
    }
    Ok(filter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_printers_stay_below_trace() {
        let f = filter("trace").unwrap().to_string();
        assert!(f.contains("tungstenite=debug") && f.contains("trace"), "{f}");
        assert!(filter("info,[").is_err());
    }
}
