//! Which package and target each binary of a `cargo test` run is, from
//! `cargo metadata`.
//!
//! cargo names a test binary on stderr by its source path, relative to its
//! package (`Running unittests src/lib.rs (target/debug/deps/beta-04b5…)`).
//! In a workspace two packages each have a `src/lib.rs`; a binary's source
//! is `src/main.rs` or `src/bin/tool.rs` with no name cargo can select it by
//! (`--bin beta-tool`); and a `[[test]]` may sit at any path. The binary's
//! file name gives its crate name (`beta_tool`), and `cargo metadata` gives
//! every target's package, kind, name and source: together they name the
//! target exactly.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::listing::{run_first_installed, ListCommand};

/// The target a listed test belongs to, as far as cargo can select it
/// without ambiguity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CargoTarget {
    /// The library's unit tests (`--lib`).
    Lib,
    /// A binary's unit tests (`--bin NAME`).
    Bin(String),
    /// An integration test target (`--test NAME`).
    Test(String),
    /// A bench target's tests (`--bench NAME`).
    Bench(String),
    /// An example's tests (`--example NAME`).
    Example(String),
    /// The doctests (`--doc`).
    Doc,
    /// A target not told from cargo's output: run with every target, `--exact`.
    Other,
}

impl CargoTarget {
    /// `cargo test`'s flags that select it.
    pub(crate) fn flags(&self) -> Vec<String> {
        let named = |flag: &str, name: &str| vec![flag.to_owned(), name.to_owned()];
        match self {
            CargoTarget::Lib => vec!["--lib".into()],
            CargoTarget::Bin(name) => named("--bin", name),
            CargoTarget::Test(name) => named("--test", name),
            CargoTarget::Bench(name) => named("--bench", name),
            CargoTarget::Example(name) => named("--example", name),
            CargoTarget::Doc => vec!["--doc".into()],
            CargoTarget::Other => Vec::new(),
        }
    }

    /// The target of a `Running ...` or `Doc-tests ...` line of cargo's
    /// stderr, told from its path alone (without `cargo metadata`); `None`
    /// for other lines.
    pub(crate) fn of_line(line: &str) -> Option<Self> {
        let line = line.trim();
        if line.starts_with("Doc-tests ") {
            return Some(CargoTarget::Doc);
        }
        let (source, _) = running_line(line)?;
        if line.contains("Running unittests ") && source.ends_with("src/lib.rs") {
            return Some(CargoTarget::Lib);
        }
        // `tests/it.rs` is target `it`, `tests/it/main.rs` too.
        let path = Path::new(source);
        let parent = path.parent().and_then(|p| p.file_name()).and_then(|n| n.to_str());
        let name = match (parent, path.file_stem().and_then(|n| n.to_str())) {
            (Some("tests"), Some(stem)) => Some(stem),
            (Some(dir), Some("main")) if path.parent().and_then(Path::parent).is_some_and(|p| p.ends_with("tests")) => {
                Some(dir)
            }
            _ => None,
        };
        Some(name.map_or(CargoTarget::Other, |n| CargoTarget::Test(n.to_owned())))
    }
}

/// The source and the binary of a `Running [unittests ]SOURCE (BINARY)` line.
pub(crate) fn running_line(line: &str) -> Option<(&str, &str)> {
    let rest = line.trim().strip_prefix("Running ")?;
    let rest = rest.strip_prefix("unittests ").unwrap_or(rest);
    match rest.rsplit_once(" (") {
        Some((source, binary)) => Some((source, binary.strip_suffix(')').unwrap_or(binary))),
        None => Some((rest, "")),
    }
}

#[derive(Debug, Deserialize)]
struct Metadata {
    packages: Vec<Package>,
    workspace_root: PathBuf,
}

#[derive(Debug, Deserialize)]
struct Package {
    name: String,
    manifest_path: PathBuf,
    targets: Vec<Target>,
}

#[derive(Debug, Deserialize)]
struct Target {
    name: String,
    kind: Vec<String>,
    src_path: PathBuf,
}

/// One target cargo can build a test binary from.
#[derive(Debug, Clone)]
struct Known {
    package: String,
    /// The source, relative to the package's directory.
    source: PathBuf,
    /// The target's name as rustc's crate name (`-` made `_`), which the
    /// binary's file name starts with.
    crate_name: String,
    target: CargoTarget,
}

/// The targets of the packages `cargo metadata` reported.
#[derive(Debug, Clone, Default)]
pub struct Packages {
    known: Vec<Known>,
    /// Each package's directory, relative to the workspace's root.
    roots: Vec<(String, PathBuf)>,
}

impl Packages {
    /// Reads `cargo metadata --format-version 1` output.
    pub fn parse(json: &[u8]) -> Result<Self, serde_json::Error> {
        let metadata: Metadata = serde_json::from_slice(json)?;
        let mut known = Vec::new();
        let mut roots = Vec::new();
        for package in metadata.packages {
            let root = package.manifest_path.parent().map(Path::to_path_buf).unwrap_or_default();
            if let Ok(relative) = root.strip_prefix(&metadata.workspace_root) {
                roots.push((package.name.clone(), relative.to_path_buf()));
            }
            for target in package.targets {
                let Some(selected) = target_of(&target) else { continue };
                known.push(Known {
                    package: package.name.clone(),
                    source: target.src_path.strip_prefix(&root).map_or(target.src_path.clone(), Path::to_path_buf),
                    crate_name: target.name.replace('-', "_"),
                    target: selected,
                });
            }
        }
        Ok(Self { known, roots })
    }

    /// Runs `cargo metadata` as the listing command `list` would run cargo
    /// (its cargo, toolchain, global options and `--manifest-path`). `None`
    /// when that fails: targets are then told from their paths alone.
    pub async fn load(list: &[String]) -> Option<Self> {
        let argv = metadata_command(list)?;
        let (command, output) = match run_first_installed(&[ListCommand { argv, env: Vec::new() }]).await {
            Ok(ran) => ran,
            Err(error) => {
                tracing::debug!(%error, "cargo metadata did not start; test targets are told from their paths");
                return None;
            }
        };
        if !output.status.success() {
            tracing::debug!(%command, status = %output.status, "cargo metadata failed; test targets are told from their paths");
            return None;
        }
        Self::parse(&output.stdout)
            .inspect_err(|error| tracing::debug!(%command, %error, "cargo metadata's output did not parse"))
            .ok()
    }

    /// The package and target of a `Running SOURCE (BINARY)` line's binary:
    /// the one target with that source whose crate name the binary's file
    /// name starts with.
    pub fn running(&self, source: &str, binary: &str) -> Option<(String, CargoTarget)> {
        let file = Path::new(binary).file_stem()?.to_str()?;
        let crate_name = file.rsplit_once('-').map_or(file, |(name, _hash)| name);
        let source = Path::new(source);
        self.unique(|k| k.source == source && k.crate_name == crate_name)
    }

    /// The package of a `Doc-tests CRATE` line: the library named `CRATE`.
    pub fn doc_tests(&self, crate_name: &str) -> Option<String> {
        self.unique(|k| k.target == CargoTarget::Lib && k.crate_name == crate_name).map(|(package, _)| package)
    }

    /// The package of a doctest (`beta/src/lib.rs - two (line 1)`): the one
    /// whose directory holds its source, the deepest if they nest.
    pub fn of_doctest(&self, name: &str) -> Option<String> {
        let source = Path::new(name.split(" - ").next()?);
        self.roots
            .iter()
            .filter(|(_, root)| source.starts_with(root))
            .max_by_key(|(_, root)| root.components().count())
            .map(|(package, _)| package.clone())
    }

    fn unique(&self, matches: impl Fn(&Known) -> bool) -> Option<(String, CargoTarget)> {
        let mut found = self.known.iter().filter(|k| matches(k));
        let first = found.next()?;
        found.next().is_none().then(|| (first.package.clone(), first.target.clone()))
    }
}

/// The target `cargo test` can select a metadata target by; `None` for
/// kinds it builds no test binary from (build scripts).
fn target_of(target: &Target) -> Option<CargoTarget> {
    let name = target.name.clone();
    let kind = target.kind.first()?.as_str();
    Some(match kind {
        "lib" | "rlib" | "dylib" | "cdylib" | "staticlib" | "proc-macro" => CargoTarget::Lib,
        "bin" => CargoTarget::Bin(name),
        "test" => CargoTarget::Test(name),
        "bench" => CargoTarget::Bench(name),
        "example" => CargoTarget::Example(name),
        _ => return None,
    })
}

/// `cargo [+toolchain] [global options] metadata --no-deps --format-version
/// 1 [--manifest-path P]` for a listing command `cargo … test …`.
fn metadata_command(list: &[String]) -> Option<Vec<String>> {
    let cargo = list.iter().position(|a| Path::new(a).file_name().is_some_and(|n| n == "cargo"))?;
    let test = cargo + list[cargo..].iter().position(|a| a == "test")?;
    let end = list.iter().position(|a| a == "--").unwrap_or(list.len());
    let mut argv: Vec<String> = list[..test].to_vec();
    argv.extend(["metadata", "--no-deps", "--format-version", "1"].map(String::from));
    let options = list.get(test + 1..end).unwrap_or_default();
    for (i, arg) in options.iter().enumerate() {
        if arg == "--manifest-path" {
            argv.extend(options.get(i..i + 2).unwrap_or_default().iter().cloned());
        } else if arg.starts_with("--manifest-path=") {
            argv.push(arg.clone());
        }
    }
    Some(argv)
}

#[cfg(test)]
pub(crate) use tests::WORKSPACE as WORKSPACE_FIXTURE;

#[cfg(test)]
mod tests {
    use super::*;

    /// A workspace of `alpha` (a library) and `beta` (a library, its main
    /// binary, a binary `beta-tool`, a `[[test]]` at a path of its own, and
    /// a build script), as `cargo metadata --no-deps` reports it.
    pub(crate) const WORKSPACE: &str = r#"{"packages":[
        {"name":"alpha","manifest_path":"/ws/alpha/Cargo.toml","targets":[
            {"kind":["lib"],"name":"alpha","src_path":"/ws/alpha/src/lib.rs"}]},
        {"name":"beta","manifest_path":"/ws/beta/Cargo.toml","targets":[
            {"kind":["lib"],"name":"beta","src_path":"/ws/beta/src/lib.rs"},
            {"kind":["bin"],"name":"beta","src_path":"/ws/beta/src/main.rs"},
            {"kind":["bin"],"name":"beta-tool","src_path":"/ws/beta/src/bin/tool.rs"},
            {"kind":["test"],"name":"custom","src_path":"/ws/beta/checks/custom_check.rs"},
            {"kind":["custom-build"],"name":"build-script-build","src_path":"/ws/beta/build.rs"}]}
    ],"workspace_root":"/ws"}"#;

    #[test]
    fn each_binary_is_its_package_and_target() {
        let packages = Packages::parse(WORKSPACE.as_bytes()).unwrap();
        let lib = |p: &str| Some((p.to_owned(), CargoTarget::Lib));
        assert_eq!(packages.running("src/lib.rs", "target/debug/deps/alpha-e629"), lib("alpha"));
        assert_eq!(packages.running("src/lib.rs", "/ws/target/debug/deps/beta-04b5"), lib("beta"));
        assert_eq!(
            packages.running("src/main.rs", "target/debug/deps/beta-3c49"),
            Some(("beta".into(), CargoTarget::Bin("beta".into())))
        );
        assert_eq!(
            packages.running("src/bin/tool.rs", "target/debug/deps/beta_tool-699b"),
            Some(("beta".into(), CargoTarget::Bin("beta-tool".into())))
        );
        assert_eq!(
            packages.running("checks/custom_check.rs", "target/debug/deps/custom-2e70.exe"),
            Some(("beta".into(), CargoTarget::Test("custom".into())))
        );
        assert_eq!(packages.running("src/lib.rs", "target/debug/deps/gamma-1"), None, "not in the metadata");
        assert_eq!(packages.doc_tests("beta").as_deref(), Some("beta"));
        assert_eq!(packages.doc_tests("delta"), None);
        assert_eq!(packages.of_doctest("beta/src/lib.rs - two (line 1)").as_deref(), Some("beta"));
        assert_eq!(packages.of_doctest("alpha/src/lib.rs - f (line 3)").as_deref(), Some("alpha"));
        assert_eq!(packages.of_doctest("gamma/src/lib.rs - f (line 3)"), None);
    }

    #[test]
    fn metadata_runs_with_the_listings_cargo_and_manifest() {
        let list = |parts: &[&str]| parts.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            metadata_command(&list(&[
                "cargo",
                "+nightly",
                "test",
                "--manifest-path",
                "x/Cargo.toml",
                "--lib",
                "--",
                "--list"
            ])),
            Some(list(&[
                "cargo",
                "+nightly",
                "metadata",
                "--no-deps",
                "--format-version",
                "1",
                "--manifest-path",
                "x/Cargo.toml"
            ]))
        );
        assert_eq!(
            metadata_command(&list(&["/usr/bin/cargo", "test", "--manifest-path=y/Cargo.toml"])),
            Some(list(&[
                "/usr/bin/cargo",
                "metadata",
                "--no-deps",
                "--format-version",
                "1",
                "--manifest-path=y/Cargo.toml"
            ]))
        );
        assert_eq!(metadata_command(&list(&["make", "test"])), None);
    }
}
