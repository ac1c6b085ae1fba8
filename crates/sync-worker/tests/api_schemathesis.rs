//! Schemathesis (from the tests' venv, `cargo xtask setup`) against the
//! API's own OpenAPI document, positive and negative: every request the
//! document allows is accepted, every one it forbids is refused with a 4xx,
//! every answer matches its documented status and schema, and nothing is a
//! 5xx. It runs with a real account and message, so the routes that take
//! ids reach their logic. What it does not run, and why, is in
//! `tests/schemathesis.toml`.

use std::path::Path;
use std::process::Command;

use sync_worker::storage::DbKind;
use sync_worker::testing::TestDb;

mod api_harness;
use api_harness::*;

fn schemathesis() -> std::path::PathBuf {
    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/schemathesis-venv/bin/schemathesis");
    let ok = Command::new(&bin).arg("--version").output();
    assert!(
        ok.as_ref().is_ok_and(|o| o.status.success()),
        "Schemathesis is required: {} --version failed; run `cargo xtask setup`",
        bin.display()
    );
    bin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_against_the_openapi_document() {
    let bin = schemathesis();
    let db = TestDb::fresh(DbKind::Sqlite, "schemathesis").unwrap_or_else(|e| panic!("a SQLite test database: {e}"));
    let s = server(db, |a| {
        // Schemathesis signs up and fails logins far past the abuse bounds.
        a.signups_per_hour = u32::MAX;
        a.login.free = u32::MAX;
        a.login.per_client = u32::MAX;
    })
    .await;
    s.append("alice", "for-schemathesis");
    let token = s.user("alice@example.org").await;
    let account = s.add_account(&token, "alice").await;
    let listed = s.wait_listed(&token, &account, 1).await;
    let message = listed[0]["id"].as_str().expect("a message id").to_string();

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("schemathesis.toml");
    let ids = format!("\n[parameters]\n\"path.id\" = \"{account}\"\n\"path.message_id\" = \"{message}\"\n");
    std::fs::write(&config, format!("{}{ids}", include_str!("schemathesis.toml"))).unwrap();
    let url = format!("{}/v1/openapi.json", s.base);
    let out = tokio::task::block_in_place(|| {
        Command::new(&bin)
            .current_dir(dir.path())
            .arg("--no-color")
            .arg("--config-file")
            .arg(&config)
            .args(["run", &url, "--mode", "all", "--max-examples", "25", "--seed", "2026"])
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .output()
            .expect("run schemathesis")
    });
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let summary: Vec<&str> = text.lines().filter(|l| l.contains("generated") || l.contains("Selected")).collect();
    eprintln!("schemathesis: {summary:?}");
    assert!(out.status.success(), "Schemathesis found failures:\n{text}");
    assert!(text.contains("passed"), "{text}");
}
