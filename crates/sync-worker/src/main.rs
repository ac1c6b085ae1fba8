//! `sync-worker`: the worker and the operator commands (see `sync_worker::cli`).

// The API builds rows and JSON on many threads and frees them on others;
// glibc's arenas spent a quarter of the message list's CPU on that (perf).
// With `override`, SQLite's own allocations use it too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sync_worker::cli::run().await
}
