//! RSpec discovery: the user's rspec command with `--dry-run --format json`,
//! the JSON written to a private file (so the user's own formatters cannot
//! mix into it); `summary.example_count` gives the count.

use crate::agent::plugins::Plugins;
use crate::errors::{ListingError, UnitsError};

use super::listing::{failed, run_first_installed, without_placeholder, ListCommand, Listing};

/// The rspec command of the user's command line, or `rspec`.
pub fn base_command(command: &[String]) -> Vec<String> {
    let base = without_placeholder(command, &[]);
    if base.is_empty() {
        vec!["rspec".into()]
    } else {
        base
    }
}

/// Lists the examples; returns the command shown in messages and the listing.
pub async fn list(command: &[String], plugins: &Plugins) -> Result<(String, Listing), UnitsError> {
    let out = plugins.scratch_file("rspec-examples.json");
    let _ = std::fs::remove_file(&out);
    let mut argv = base_command(command);
    argv.extend(["--dry-run".into(), "--format".into(), "json".into(), "--out".into(), out.display().to_string()]);
    let (shown, output) = run_first_installed(&[ListCommand { argv, env: Vec::new() }]).await?;
    if !output.status.success() {
        // A file that does not load: RSpec's JSON names it, with the backtrace.
        let messages = std::fs::read_to_string(&out).ok().map(|t| messages(&t)).unwrap_or_default();
        return Err(match failed(shown, &output) {
            UnitsError::DiscoverFailed { command, status, detail } if !messages.is_empty() => {
                UnitsError::DiscoverFailed { command, status, detail: format!("{detail}\n{messages}") }
            }
            other => other,
        });
    }
    let text = std::fs::read_to_string(&out).map_err(|error| UnitsError::DiscoverParse {
        command: shown.clone(),
        source: ListingError::Inconsistent(format!("rspec wrote no JSON to {} ({error})", out.display())),
    })?;
    let listing = parse(&text).map_err(|detail| UnitsError::DiscoverParse {
        command: shown.clone(),
        source: ListingError::Inconsistent(detail),
    })?;
    Ok((shown, listing))
}

/// What RSpec printed besides the examples (its `messages`: a file that
/// did not load, with the backtrace), one after the other.
fn messages(text: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_default();
    let messages = value.get("messages").and_then(|m| m.as_array());
    messages
        .map(|m| m.iter().filter_map(|m| m.as_str()).map(str::trim).collect::<Vec<_>>().join("\n"))
        .unwrap_or_default()
}

/// Example ids and `summary.example_count` (load errors outside examples are an error).
pub fn parse(text: &str) -> Result<Listing, String> {
    let value: serde_json::Value = serde_json::from_str(text.trim()).map_err(|e| e.to_string())?;
    let summary = value.get("summary").ok_or("no \"summary\"")?;
    let errors = summary.get("errors_outside_of_examples_count").and_then(|c| c.as_u64()).unwrap_or(0);
    if errors > 0 {
        // RSpec's messages name the file and give the backtrace.
        return Err(format!(
            "{errors} error(s) occurred outside of examples (a spec file failed to load): {}",
            messages(text)
        ));
    }
    let counted = summary.get("example_count").and_then(|c| c.as_u64()).ok_or("no \"summary.example_count\"")?;
    let examples = value.get("examples").and_then(|e| e.as_array()).ok_or("no \"examples\" array")?;
    let ids = examples.iter().filter_map(|e| e.get("id").and_then(|p| p.as_str())).map(str::to_owned).collect();
    Ok(Listing { ids, counted: counted as usize })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_example_ids_and_the_count() {
        let out = r#"{"version":"3.12","examples":[{"id":"./spec/a_spec.rb[1:1]","file_path":"./spec/a_spec.rb"},
            {"id":"./spec/a_spec.rb[1:2]"},{"id":"./spec/b c_spec.rb[1:1]"}],
            "summary":{"example_count":3,"errors_outside_of_examples_count":0}}"#;
        let listing = parse(out).unwrap();
        assert_eq!(listing.ids, ["./spec/a_spec.rb[1:1]", "./spec/a_spec.rb[1:2]", "./spec/b c_spec.rb[1:1]"]);
        assert_eq!(listing.counted, 3);
        let broken = r#"{"examples":[],"summary":{"example_count":0,"errors_outside_of_examples_count":1}}"#;
        assert!(parse(broken).unwrap_err().contains("outside of examples"));
    }
}
