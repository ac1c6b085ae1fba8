//! Runs the `redis-queue` benchmark of `leasehold-benches` on its own:
//! `cargo run --release -p leasehold-redis --features test-support --example redis_queue_bench`.

#[path = "../../../benches/src/redis_queue.rs"]
mod redis_queue;

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let figures = runtime.block_on(redis_queue::run())?;
    println!("{}", serde_json::to_string(&figures)?);
    Ok(())
}
