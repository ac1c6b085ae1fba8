//! One build on a shared queue, for the tests of distributed builds: its
//! queue options, its workers over a unit list of shell units, its report and
//! its progress.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use leasehold_redis::test_support::{redis_url, unique_prefix};

use super::hopper;

/// One build on one queue URL.
pub struct Build {
    url: String,
    /// The key prefix, when the build shares its Redis with other tests.
    prefix: Option<String>,
    build: String,
}

impl Build {
    /// A build on the tests' shared Redis, under a key prefix of its own.
    pub fn on_shared_redis(tag: &str) -> Self {
        Self { url: redis_url(), prefix: Some(unique_prefix(tag)), build: format!("b-{}", unique_prefix(tag)) }
    }

    /// A build on `url` (a server of the test's own), with hopper's default key prefix.
    pub fn on(url: String, tag: &str) -> Self {
        Self { url, prefix: None, build: format!("b-{}", unique_prefix(tag)) }
    }

    /// The build id.
    pub fn id(&self) -> &str {
        &self.build
    }

    /// `--queue`, `--key-prefix` (when there is one) and `--build`.
    pub fn args(&self) -> Vec<String> {
        self.args_as(&self.build)
    }

    /// [`Self::args`] for another build `id` on the same queue (a rerun's).
    pub fn args_as(&self, id: &str) -> Vec<String> {
        let mut args = vec!["--queue".into(), self.url.clone()];
        if let Some(prefix) = &self.prefix {
            args.extend(["--key-prefix".into(), prefix.clone()]);
        }
        args.extend(["--build".into(), id.to_owned()]);
        args
    }

    /// The worker `name`, in `dir`, over the units listed in `list`, each run
    /// as `sh {unit}`, with `options`; its output piped.
    pub fn worker(&self, dir: &Path, list: &Path, name: &str, options: &[&str]) -> Child {
        hopper(dir)
            .arg("run")
            .args(self.args())
            .args(["--worker", name, "--requeue-tolerance", "0.5", "--units-from"])
            .arg(list)
            .args(options)
            .args(["--", "sh", "{unit}"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a worker")
    }

    /// `hopper report --junit JUNIT`, in `dir`, waiting up to 300 s; output piped.
    pub fn report(&self, dir: &Path, junit: &Path) -> Child {
        hopper(dir)
            .arg("report")
            .args(self.args())
            .arg("--junit")
            .arg(junit)
            .args(["--wait-timeout", "300"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the report")
    }

    /// Finalized units, from `hopper status` (`None` while it cannot tell).
    pub fn finalized(&self, dir: &Path) -> Option<u64> {
        let output = hopper(dir).arg("status").args(self.args()).args(["--outage-grace", "1"]).output().ok()?;
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let counts = text.split(": ").nth(2)?;
        counts.split('/').next()?.trim().parse().ok()
    }

    /// Waits until at least `n` units are finalized.
    pub fn wait_finalized(&self, dir: &Path, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.finalized(dir).is_none_or(|done| done < n) {
            assert!(Instant::now() < deadline, "the build did not get to {n} finalized units");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
