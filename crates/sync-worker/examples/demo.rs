//! `cargo xtask demo`: a first run with mail to see, and nothing to set up.
//!
//! Starts a private Dovecot with a demo mailbox (a few hundred realistic
//! messages in several folders, a new one every 20 s) and `sync-worker
//! serve` (memory backend, SQLite in a temporary directory) with a demo login
//! that already has the mailbox's account, then prints where to look.
//! `LISTEN` moves the console (default `127.0.0.1:8080`). Ctrl-C ends it and
//! removes everything it made.

use anyhow::Context;
use sync_worker::testing::demo::{Demo, DemoOptions, DEMO_EMAIL, DEMO_PASSWORD};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(sync_worker::logging::filter(&std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))?)
        .with_writer(std::io::stderr)
        .init();
    let mut options = DemoOptions::default();
    if let Ok(listen) = std::env::var("LISTEN") {
        options.listen =
            listen.trim().parse().with_context(|| format!("LISTEN={listen:?} is not an address and port"))?;
    }
    eprintln!("starting a private Dovecot with the demo mailbox, and sync-worker serve ...");
    let mut demo = Demo::start(options).await.context("the demo could not start")?;
    println!();
    println!("  sync-worker demo: open {}", demo.url());
    println!("  log in as {DEMO_EMAIL} with the password {DEMO_PASSWORD}");
    println!("  a new message arrives in INBOX every 20 s; Ctrl-C ends the demo");
    println!();
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("could not listen for Ctrl-C")?,
        r = demo.finished() => return r,
    }
    demo.stop().await
}
