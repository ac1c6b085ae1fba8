//! `GET /v1/openapi.json` over real HTTP: the document parses, and every
//! route the router serves is in it with exactly the methods it serves.
//!
//! The served routes are read from the router itself (its `Debug` lists the
//! paths of its route table) and their methods are found by calling each
//! path with each method over HTTP (a method that is not served answers
//! 405 `method_not_allowed`), so a route added without documentation, or a
//! method added to a documented path, fails this test.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use sync_worker::api::{ApiSettings, ApiState};
use sync_worker::app::serve::{self, Parts};
use sync_worker::app::wiring;
use sync_worker::testing::TestDb;
use sync_worker::Config;

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

async fn parts() -> (Parts, TestDb) {
    let db = TestDb::sqlite("openapi").expect("a test database");
    let storage = db.open().await.expect("storage");
    let config = Config::default();
    let mut settings = ApiSettings::new(&config);
    settings.listen = "127.0.0.1:0".parse().unwrap();
    let parts = Parts { storage, backend: wiring::in_process(), config, settings };
    (parts, db)
}

/// The paths of the router's route table, from its `Debug` (`RouteId(n): "/path"`).
fn served_paths(parts: &Parts) -> BTreeSet<String> {
    let state = ApiState::new(
        parts.storage.clone(),
        parts.backend.store().clone(),
        parts.backend.bus().clone(),
        parts.settings.clone(),
    );
    let debug = format!("{:?}", sync_worker::api::router(state));
    // Only the main route table: the fallback router comes after it.
    let table = debug.split("fallback_router").next().expect("a Debug text");
    let mut paths = BTreeSet::new();
    let mut rest = table;
    while let Some(i) = rest.find("RouteId(") {
        rest = &rest[i..];
        let Some(start) = rest.find(": \"") else { break };
        let after = &rest[start + 3..];
        let Some(end) = after.find('"') else { break };
        paths.insert(after[..end].to_string());
        rest = &after[end..];
    }
    paths
}

/// `/v1/accounts/{id}` with every parameter filled in.
fn concrete(path: &str) -> String {
    let mut out = String::new();
    let mut in_param = false;
    for c in path.chars() {
        match c {
            '{' => in_param = true,
            '}' => {
                in_param = false;
                out.push_str("x1");
            }
            _ if in_param => {}
            c => out.push(c),
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_served_route_is_documented_with_its_methods() {
    let (parts, _dir) = parts().await;
    let served = served_paths(&parts);
    assert!(served.len() >= 11, "could not read the router's paths from its Debug text: {served:?}");
    let running = serve::start(parts, None).await.expect("start");
    let base = format!("http://{}", running.addr());
    let http = reqwest::Client::new();

    let resp = http.get(format!("{base}/v1/openapi.json")).send().await.expect("GET openapi.json");
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("application/json"));
    let doc: Value = serde_json::from_str(&resp.text().await.unwrap()).expect("the document is JSON");
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")), "{}", doc["openapi"]);

    let mut documented: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        let methods = item
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| METHODS.iter().any(|m| m.eq_ignore_ascii_case(k)))
            .map(|k| k.to_ascii_uppercase())
            .collect();
        documented.insert(path.clone(), methods);
    }
    assert_eq!(documented.keys().cloned().collect::<BTreeSet<_>>(), served, "documented paths vs served paths");

    for path in &served {
        let mut methods = BTreeSet::new();
        for m in METHODS {
            let resp = http.request(m.parse().unwrap(), format!("{base}{}", concrete(path))).send().await.unwrap();
            let status = resp.status();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            if status == 405 {
                assert_eq!(body["error"]["code"], "method_not_allowed", "{m} {path}: {body}");
            } else {
                assert!(status.as_u16() < 500, "{m} {path}: {status} {body}");
                methods.insert(m.to_string());
            }
        }
        assert_eq!(methods, documented[path], "methods of {path}: served (left) vs documented (right)");
    }

    // Each operation documents its answers, errors in the one shape.
    let schemas = &doc["components"]["schemas"];
    assert!(schemas["ErrorBody"].is_object(), "ErrorBody schema");
    for name in ["AccountView", "AddAccount", "Credentials", "LoginAnswer", "MessagePage", "MessageDetail", "Created"] {
        assert!(schemas[name].is_object(), "schema {name} is documented");
    }
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap_or_else(|| panic!("{method} {path}: responses"));
            assert!(!responses.is_empty(), "{method} {path}: no responses");
            for (status, r) in responses {
                if status.starts_with('4') || status.starts_with('5') {
                    let schema = &r["content"]["application/json"]["schema"]["$ref"];
                    assert_eq!(schema, "#/components/schemas/ErrorBody", "{method} {path} {status}");
                }
            }
        }
    }
    let add = &doc["paths"]["/v1/accounts"]["post"];
    assert_eq!(add["requestBody"]["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/AddAccount");
    assert!(add["security"].is_array(), "protected routes name the bearer scheme");
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    running.shutdown().await.unwrap();
}
