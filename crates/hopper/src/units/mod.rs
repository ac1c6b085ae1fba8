//! Where units come from: a file list, glob patterns, or a discovery command
//! (the test tool itself lists its tests).
//!
//! Every source is read completely and checked before anything is written to
//! the queue, so bad input never leaves a half-made run behind.

pub mod discover;
pub mod groups;
pub mod timings;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use leasehold_core::{UnitId, UnitSpec};

use crate::agent::plugins::Plugins;
use crate::errors::UnitsError;

pub use crate::units::discover::DiscoverKind;

/// Where to take the units from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitSource {
    /// One unit per line (blank lines and `#` comments skipped); `-` is stdin.
    File(PathBuf),
    /// Paths matching any of these glob patterns, sorted, each once.
    Globs(Vec<String>),
    /// The test tool's own listing.
    Discover(DiscoverKind),
}

impl UnitSource {
    /// A short description for messages.
    pub fn describe(&self) -> String {
        match self {
            UnitSource::File(path) => format!("unit list {}", path.display()),
            UnitSource::Globs(patterns) => format!("glob {}", patterns.join(" ")),
            UnitSource::Discover(kind) => format!("--discover {kind}"),
        }
    }
}

fn make_units(names: Vec<String>, kind: &str, source_name: &str, dedupe: bool) -> Result<Vec<UnitSpec>, UnitsError> {
    let mut seen = HashSet::new();
    let mut units = Vec::with_capacity(names.len());
    for name in names {
        if dedupe && !seen.insert(name.clone()) {
            continue;
        }
        let id = UnitId::new(&name).map_err(|error| UnitsError::BadUnit {
            source_name: source_name.to_owned(),
            value: crate::errors::cut(&name.escape_debug().to_string(), crate::errors::NAME_SHOWN),
            error,
        })?;
        units.push(UnitSpec::new(id, kind));
    }
    if units.is_empty() {
        return Err(UnitsError::Empty { source_name: source_name.to_owned() });
    }
    Ok(units)
}

/// Parses a unit list: one unit per line, trimmed; blank lines and lines
/// starting with `#` are skipped.
pub fn parse_unit_list(text: &str) -> Vec<String> {
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_owned).collect()
}

/// Expands glob patterns into sorted, de-duplicated paths (files only).
pub fn expand_globs(patterns: &[String]) -> Result<Vec<String>, UnitsError> {
    let mut paths = Vec::new();
    for pattern in patterns {
        let entries = glob::glob(pattern).map_err(|source| UnitsError::BadGlob { pattern: pattern.clone(), source })?;
        for entry in entries {
            let path = entry.map_err(|source| UnitsError::GlobWalk { pattern: pattern.clone(), source })?;
            if path.is_dir() {
                continue;
            }
            paths.push(path.to_string_lossy().into_owned());
        }
    }
    paths.sort();
    paths.dedup();
    Ok(paths)
}

/// Reads the units of a source. Errors on an empty result.
pub async fn collect_units(source: &UnitSource) -> Result<Vec<UnitSpec>, UnitsError> {
    let source_name = source.describe();
    match source {
        UnitSource::File(path) => {
            let text = read_list(path).await?;
            make_units(parse_unit_list(&text), "file", &source_name, false)
        }
        UnitSource::Globs(patterns) => make_units(expand_globs(patterns)?, "file", &source_name, true),
        UnitSource::Discover(kind) => {
            let plugins = Plugins::new().map_err(|source| UnitsError::Scratch { source })?;
            Ok(crate::units::discover::discover(*kind, &[], &plugins).await?.units)
        }
    }
}

async fn read_list(path: &Path) -> Result<String, UnitsError> {
    if path == Path::new("-") {
        use tokio::io::AsyncReadExt;
        let mut text = String::new();
        tokio::io::stdin()
            .read_to_string(&mut text)
            .await
            .map_err(|source| UnitsError::ReadFile { path: path.to_owned(), source })?;
        return Ok(text);
    }
    tokio::fs::read_to_string(path).await.map_err(|source| UnitsError::ReadFile { path: path.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_lists_skip_blanks_and_comments() {
        assert_eq!(parse_unit_list("a\n\n  # no\n b \r\nc d\n"), vec!["a", "b", "c d"]);
    }

    #[test]
    fn unknown_discover_kind_is_a_clear_error() {
        let err = "jest".parse::<DiscoverKind>().unwrap_err().to_string();
        assert!(err.contains("jest") && err.contains("nextest, cargo-test, pytest"), "{err}");
        assert_eq!("cargo-test".parse::<DiscoverKind>().unwrap(), DiscoverKind::CargoTest);
    }

    #[tokio::test]
    async fn globs_sort_and_dedupe_and_empty_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b_test.sh", "a_test.sh", "c.txt"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let pattern = format!("{}/*_test.sh", dir.path().display());
        let units = collect_units(&UnitSource::Globs(vec![pattern.clone(), pattern])).await.unwrap();
        let names: Vec<_> = units.iter().map(|u| u.id.as_str().rsplit('/').next().unwrap().to_owned()).collect();
        assert_eq!(names, vec!["a_test.sh", "b_test.sh"]);

        let none = format!("{}/*.rb", dir.path().display());
        let err = collect_units(&UnitSource::Globs(vec![none])).await.unwrap_err();
        assert!(matches!(err, UnitsError::Empty { .. }), "{err}");
        let err = collect_units(&UnitSource::Globs(vec!["[".into()])).await.unwrap_err();
        assert!(matches!(err, UnitsError::BadGlob { .. }), "{err}");
    }

    #[tokio::test]
    async fn unit_files_are_read_and_missing_ones_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("units.txt");
        std::fs::write(&path, "one\ntwo\n").unwrap();
        let units = collect_units(&UnitSource::File(path)).await.unwrap();
        assert_eq!(units.len(), 2);
        let err = collect_units(&UnitSource::File(dir.path().join("nope"))).await.unwrap_err();
        assert!(err.to_string().contains("cannot read unit list"), "{err}");
        let empty = dir.path().join("empty.txt");
        std::fs::write(&empty, "# nothing\n").unwrap();
        assert!(matches!(collect_units(&UnitSource::File(empty)).await, Err(UnitsError::Empty { .. })));
    }
}
