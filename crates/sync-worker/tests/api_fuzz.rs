//! Bad input anywhere gets a 4xx, never a 500 or a panic: a property test
//! that sends generated requests over real HTTP to a running API (SQLite,
//! no worker) — any method on any route, with mangled path segments, query
//! strings, `Authorization` headers and bodies (random bytes, or JSON objects
//! with the real field names and values of every type) — and checks each
//! answer is below 500 and, for an error, in the one error shape.

use proptest::prelude::*;
use serde_json::{json, Value};
use sync_worker::api::ApiSettings;
use sync_worker::app::serve::{self, Parts, Running};
use sync_worker::app::wiring;
use sync_worker::testing::TestDb;
use sync_worker::Config;

const ROUTES: [&str; 19] = [
    "/",
    "/v1/openapi.json",
    "/v1/users",
    "/v1/login",
    "/v1/logout",
    "/v1/accounts",
    "/v1/accounts/{id}",
    "/v1/accounts/{id}/folders",
    "/v1/accounts/{id}/messages",
    "/v1/accounts/{id}/messages/{id}",
    "/v1/accounts/{id}/messages/{id}/raw",
    "/v1/accounts/{id}/messages/{id}/attachments/{id}",
    "/v1/accounts/{id}/messages/{id}/move",
    "/v1/accounts/{id}/messages/actions",
    "/v1/webhooks",
    "/v1/webhooks/{id}",
    "/v1/webhooks/{id}/resume",
    "/v1/webhooks/{id}/deliveries",
    "/v1/ws",
];
const FIELDS: [&str; 17] = [
    "email", "password", "host", "port", "security", "username", "folder", "limit", "x", "ids", "action", "update",
    "seen", "flagged", "keywords", "url", "events",
];

struct Api {
    rt: tokio::runtime::Runtime,
    _running: Running,
    base: String,
    token: String,
    http: reqwest::Client,
    _db: TestDb,
}

fn api() -> Api {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let db = TestDb::sqlite("api_fuzz").expect("a test database");
    let (running, token, http) = rt.block_on(async {
        let storage = db.open().await.unwrap();
        let config = Config::default();
        let mut settings = ApiSettings::new(&config);
        settings.listen = "127.0.0.1:0".parse().unwrap();
        settings.imap.connect_timeout = std::time::Duration::from_millis(500);
        // Generated logins must not lock the real one out.
        settings.login.free = u32::MAX;
        settings.login.per_client = u32::MAX;
        settings.signups_per_hour = u32::MAX;
        let parts = Parts { storage, backend: wiring::in_process(), config, settings };
        let running = serve::start(parts, None).await.unwrap();
        let base = format!("http://{}", running.addr());
        let http = reqwest::Client::new();
        let creds = json!({"email": "fuzz@example.org", "password": "fuzz-password-1"});
        let r = http.post(format!("{base}/v1/users")).json(&creds).send().await.unwrap();
        assert_eq!(r.status(), 201);
        let v: Value = http.post(format!("{base}/v1/login")).json(&creds).send().await.unwrap().json().await.unwrap();
        (running, v["token"].as_str().unwrap().to_string(), http)
    });
    let base = format!("http://{}", running.addr());
    Api { rt, _running: running, base, token, http, _db: db }
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-zA-Z0-9._~-]{1,40}",
        "[^/?#]{1,20}".prop_map(|s| percent(&s)),
        Just("00000000-0000-0000-0000-000000000000".to_string()),
        Just("..".to_string()),
    ]
}

fn percent(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

fn query() -> impl Strategy<Value = String> {
    let pair = (prop::sample::select(&FIELDS[..]), "[ -~]{0,12}")
        .prop_map(|(k, v)| format!("{}={}", if k == "x" { "cursor" } else { k }, percent(&v)));
    prop_oneof![
        Just(String::new()),
        prop::collection::vec(pair, 1..4).prop_map(|v| format!("?{}", v.join("&"))),
        "[ -~]{0,30}".prop_map(|s| format!("?{}", s.replace(['#', ' '], ""))),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (0u32..70000).prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,20}".prop_map(Value::from),
        prop::sample::select(vec!["127.0.0.1", "tls", "plain", "starttls", "a@b.c", "", " "]).prop_map(Value::from),
        Just(json!([1, "x"])),
        Just(json!({"nested": {}})),
    ]
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(Vec::new()),
        prop::collection::vec(any::<u8>(), 0..64),
        prop::collection::btree_map(prop::sample::select(&FIELDS[..]), json_value(), 0..7)
            .prop_map(|m| serde_json::to_vec(&m).unwrap()),
        // The whole AddAccount shape with a refusing loopback port.
        ("[a-z]{0,8}", prop::sample::select(vec!["plain", "tls", "starttls", "none"])).prop_map(|(u, sec)| {
            serde_json::to_vec(&json!({"host": "127.0.0.1", "port": 1, "security": sec, "username": u, "password": u}))
                .unwrap()
        }),
    ]
}

#[derive(Debug, Clone)]
enum Auth {
    None,
    Valid,
    Raw(String),
}

fn auth() -> impl Strategy<Value = Auth> {
    prop_oneof![
        Just(Auth::None),
        Just(Auth::Valid),
        "[ -~]{0,40}".prop_map(Auth::Raw),
        "[ -~]{0,40}".prop_map(|t| Auth::Raw(format!("Bearer {t}"))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn bad_input_anywhere_is_a_4xx_never_a_500(
        method in prop::sample::select(vec!["GET", "POST", "PUT", "PATCH", "DELETE"]),
        route in prop::sample::select(&ROUTES[..]),
        segments in prop::collection::vec(segment(), 2),
        query in query(),
        auth in auth(),
        body in body(),
        json_type in any::<bool>(),
    ) {
        let api = API.get_or_init(api);
        let mut path = route.to_string();
        for s in &segments {
            path = path.replacen("{id}", s, 1);
        }
        let url = format!("{}{path}{query}", api.base);
        let (status, text) = api.rt.block_on(async {
            let mut req = api.http.request(method.parse().unwrap(), &url).body(body.clone());
            if json_type {
                req = req.header("content-type", "application/json");
            }
            req = match &auth {
                Auth::None => req,
                Auth::Valid => req.bearer_auth(&api.token),
                Auth::Raw(v) => req.header("authorization", v.as_str()),
            };
            let resp = req.send().await.expect("the server answers");
            (resp.status(), resp.text().await.unwrap_or_default())
        });
        prop_assert!(status.as_u16() < 500, "{method} {url} ({auth:?}, body {:?}) -> {status} {text}", String::from_utf8_lossy(&body));
        if status.is_client_error() {
            let v: Value = serde_json::from_str(&text).map_err(|e| TestCaseError::fail(format!("{status} {text}: {e}")))?;
            prop_assert!(v["error"]["code"].is_string() && v["error"]["message"].is_string(), "{status} {text}");
        }
    }
}

/// One server for every case (never dropped: it ends with the test process).
static API: std::sync::OnceLock<Api> = std::sync::OnceLock::new();
