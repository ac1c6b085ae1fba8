//! The first-run demo (`cargo xtask demo`, `examples/demo.rs`) as a newcomer
//! meets it: the printed login opens a console that shows the demo mail in
//! its folders, and new mail arrives on its own.

use std::time::Duration;

use sync_worker::testing::demo::{Demo, DemoOptions, DEMO_EMAIL, DEMO_PASSWORD};

mod browser;
use browser::Browser;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_console_shows_its_mail_and_new_mail_arrives() {
    let options = DemoOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        inbox_messages: 80,
        new_mail_every: Duration::from_secs(5),
    };
    let demo =
        Demo::start(options).await.unwrap_or_else(|e| panic!("the demo: {}", sync_worker::errors::error_chain(&e)));
    let b = Browser::start().await;
    b.open(demo.url()).await;
    b.type_into("#email", DEMO_EMAIL).await;
    b.type_into("#password", DEMO_PASSWORD).await;
    b.click("#login").await;
    b.wait_for("return !document.getElementById('app').hidden", Duration::from_secs(10)).await;
    b.wait_for(
        "const r = document.querySelector('tr.account'); return r && r.innerText.includes('up to date')",
        Duration::from_secs(30),
    )
    .await;
    b.click("tr.account").await;
    b.wait_for("return document.querySelectorAll('tr.message').length === 50", Duration::from_secs(20)).await;
    // Every folder of the demo mailbox, the non-ASCII one decoded.
    let folders = b
        .wait_for(
            "const t = document.getElementById('folder').innerText; \
             return t.includes('Projects/Ärger (20,') && t.includes('Archive (20,') ? t : null",
            Duration::from_secs(30),
        )
        .await;
    eprintln!("folders: {folders}");
    b.screenshot("demo").await;
    let first = b.eval("return document.querySelector('tr.message').dataset.id").await;
    // A new message within 30 s, on top, without a reload.
    b.wait_for(
        &format!("const r = document.querySelector('tr.message'); return r && r.dataset.id !== {first}"),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(b.eval("return document.getElementById('error').textContent").await, "");
    demo.stop().await.expect("the demo stops");
}
