//! `sync-worker`: the worker and the operator commands (see `sync_worker::cli`).

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sync_worker::cli::run().await
}
