//! `sync-worker`: the worker and the operator commands (see `sync_worker::cli`).

// The API builds rows and JSON on many threads and frees them on others;
// glibc's arenas spent a quarter of the message list's CPU on that (perf).
// With `override`, SQLite's own allocations use it too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    if let Err(e) = sync_worker::allocator::restart_with_commit_on_demand() {
        eprintln!(
            "sync-worker: could not restart with {}=0 ({e}); going on with mimalloc's defaults",
            sync_worker::allocator::ARENA_EAGER_COMMIT
        );
    }
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(sync_worker::cli::run())
}
