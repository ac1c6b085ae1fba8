//! A headless Chromium for tests, driven over WebDriver by a private
//! chromedriver (Debian's chromium-driver, installed by `cargo xtask setup`).
#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// A headless Chromium driven over WebDriver by a private chromedriver.
pub struct Browser {
    driver: std::process::Child,
    http: reqwest::Client,
    session: String,
    base: String,
}

pub const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    pub async fn start() -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // Its own process group, so that Drop ends chromedriver and the
        // Chromium it started together (killing chromedriver alone orphans it).
        let driver = std::process::Command::new("chromedriver")
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("chromedriver (Debian's chromium-driver) is needed: {e}"));
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]}}}});
        let deadline = Instant::now() + Duration::from_secs(20);
        let session = loop {
            match http.post(format!("{base}/session")).json(&caps).send().await {
                Ok(r) => {
                    let v: Value = r.json().await.expect("session answer");
                    break v["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {v}")).to_string();
                }
                Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("chromedriver never answered: {e}"),
            }
        };
        Browser { driver, http, session, base }
    }

    pub async fn cmd(&self, method: &str, path: &str, body: Value) -> Value {
        self.try_cmd(method, path, body).await.unwrap_or_else(|v| panic!("{method} {path}: {v}"))
    }

    /// A WebDriver command: its value, or the whole answer when it is an error.
    async fn try_cmd(&self, method: &str, path: &str, body: Value) -> Result<Value, Value> {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let r = self.http.request(method.parse().unwrap(), url).json(&body).send().await.expect("webdriver");
        let v: Value = r.json().await.expect("webdriver json");
        if v["value"].get("error").is_some() {
            return Err(v);
        }
        Ok(v["value"].clone())
    }

    pub async fn element(&self, css: &str) -> String {
        let v = self.cmd("POST", "/element", json!({"using": "css selector", "value": css})).await;
        v[ELEMENT].as_str().unwrap_or_else(|| panic!("no element {css}: {v}")).to_string()
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css).await;
        self.cmd("POST", &format!("/element/{e}/clear"), json!({})).await;
        self.cmd("POST", &format!("/element/{e}/value"), json!({"text": text})).await;
    }

    /// Clicks the element `css` finds. The console re-renders a row when a
    /// push about it arrives, so an element found a moment ago may be gone
    /// (a "stale element reference"): it is found again, a few times.
    pub async fn click(&self, css: &str) {
        for _ in 0..4 {
            let e = self.element(css).await;
            match self.try_cmd("POST", &format!("/element/{e}/click"), json!({})).await {
                Ok(_) => return,
                Err(v) if v["value"]["error"] == "stale element reference" => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(v) => panic!("click {css}: {v}"),
            }
        }
        let e = self.element(css).await;
        self.cmd("POST", &format!("/element/{e}/click"), json!({})).await;
    }

    pub async fn eval(&self, script: &str) -> Value {
        self.cmd("POST", "/execute/sync", json!({"script": script, "args": []})).await
    }

    /// Waits until `script` returns something truthy.
    pub async fn wait_for(&self, script: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let v = self.eval(script).await;
            if !(v.is_null() || v == false || v == "") {
                return v;
            }
            let error = self.eval("return document.getElementById('error').textContent").await;
            assert!(Instant::now() < deadline, "never true within {within:?}: {script}; page error: {error}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let group = format!("-{}", self.driver.id());
        let _ = std::process::Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    /// Saves a PNG of the page to `$CONSOLE_SCREENSHOTS/NAME.png` when that
    /// variable names a directory (for looking at the console; tests do not
    /// need it).
    pub async fn screenshot(&self, name: &str) {
        let Some(dir) = std::env::var_os("CONSOLE_SCREENSHOTS") else { return };
        use base64::Engine as _;
        let url = format!("{}/session/{}/screenshot", self.base, self.session);
        let v: Value = self.http.get(url).send().await.expect("webdriver").json().await.expect("webdriver json");
        let b64 = v["value"].as_str().unwrap_or_else(|| panic!("no screenshot: {v}"));
        let png = base64::engine::general_purpose::STANDARD.decode(b64).expect("base64 PNG");
        std::fs::write(std::path::Path::new(&dir).join(format!("{name}.png")), png).expect("write the screenshot");
    }

    /// Opens `url`.
    pub async fn open(&self, url: &str) {
        self.cmd("POST", "/url", json!({ "url": url })).await;
    }
}
