//! `/healthz` and `/readyz` over real HTTP on a running `serve`: both pass
//! while the parts answer, and `/readyz` turns to 503 `not_ready`, in the
//! one error shape and naming the database, once the database is closed,
//! while `/healthz` still says the process is up.

use reqwest::StatusCode;
use serde_json::json;
use sync_worker::both_databases;
use sync_worker::testing::TestDb;

mod api_harness;
use api_harness::*;

both_databases!(
    async:
    readyz_follows_the_database_and_healthz_the_process,
);

async fn readyz_follows_the_database_and_healthz_the_process(db: TestDb) {
    let s = server(db, |_| {}).await;
    for path in ["/healthz", "/readyz"] {
        let (st, v) = s.call("GET", path, None, None).await;
        assert_eq!((st, v), (StatusCode::OK, json!({"status": "ok"})), "{path}");
    }
    // The server's pool is this one: closing it stops every query.
    s.storage.close().await;
    let (st, v) = s.call("GET", "/readyz", None, None).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(v["error"]["code"], "not_ready", "{v}");
    let message = v["error"]["message"].as_str().expect("a message");
    assert!(message.starts_with("the database does not answer: "), "{message}");
    let (st, v) = s.call("GET", "/healthz", None, None).await;
    assert_eq!((st, v), (StatusCode::OK, json!({"status": "ok"})));
}
