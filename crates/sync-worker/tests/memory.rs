//! The acceptance cases on the memory backend, in paused tokio time.

#[macro_use]
mod common;

macro_rules! memory_cases {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(start_paused = true)]
        async fn $name() {
            common::cases::$name(common::Mem::backend()).await;
        }
    )*};
}

acceptance_cases!(memory_cases);
