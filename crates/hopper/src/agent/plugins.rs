//! The agents hopper ships inside its binary, written at start to a private
//! temporary directory (removed when the worker ends): nothing to install.

use std::path::{Path, PathBuf};

/// The private directory holding the shipped plugins and scratch files.
#[derive(Debug)]
pub struct Plugins {
    dir: tempfile::TempDir,
}

const PYTEST_PLUGIN: &str = include_str!("hopper_pytest.py");
const RSPEC_AGENT: &str = include_str!("hopper_rspec.rb");

impl Plugins {
    /// The pytest plugin's module name (`-p hopper_pytest`).
    pub const PYTEST_MODULE: &'static str = "hopper_pytest";

    /// Writes the plugins to a new private directory.
    pub fn new() -> std::io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("hopper-agents-").tempdir()?;
        std::fs::write(dir.path().join(format!("{}.py", Self::PYTEST_MODULE)), PYTEST_PLUGIN)?;
        std::fs::write(dir.path().join("hopper_rspec.rb"), RSPEC_AGENT)?;
        Ok(Self { dir })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A path for a scratch file in the directory.
    pub fn scratch_file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The RSpec agent (`rspec --require FILE`).
    pub fn rspec_agent(&self) -> PathBuf {
        self.dir.path().join("hopper_rspec.rb")
    }

    /// The environment that makes `-p hopper_pytest` importable and selects
    /// the plugin's mode (`collect` or `agent`).
    pub fn pytest_env(&self, mode: &str) -> Vec<(String, String)> {
        let mut path = self.dir.path().display().to_string();
        if let Some(existing) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
            path.push(':');
            path.push_str(&existing.to_string_lossy());
        }
        vec![("PYTHONPATH".into(), path), ("HOPPER_PYTEST_MODE".into(), mode.into())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugins_are_written_and_removed() {
        let plugins = Plugins::new().unwrap();
        let dir = plugins.dir().to_path_buf();
        let text = std::fs::read_to_string(dir.join("hopper_pytest.py")).unwrap();
        assert!(text.contains("def pytest_runtestloop"));
        assert!(plugins.rspec_agent().exists());
        let env = plugins.pytest_env("collect");
        assert!(env[0].1.starts_with(&dir.display().to_string()));
        drop(plugins);
        assert!(!dir.exists());
    }
}
