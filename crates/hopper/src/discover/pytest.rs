//! pytest discovery: the user's own pytest command collects, with hopper's
//! plugin writing every node id whole to a file. With `--collect-only`,
//! pytest's own summary line gives the count the ids are checked against;
//! with agents, the first agent's collection is the discovery.

use crate::agent::child::{AgentChild, AgentCommand, NotReady};
use crate::agent::plugins::Plugins;
use crate::errors::{ListingError, UnitsError};

use super::{failed, run_first_installed, without_placeholder, ListCommand, Listing};

/// pytest's exit status when it collected no tests.
const NO_TESTS_COLLECTED: i32 = 5;

/// The programs tried when no command is given: `pytest`, then `python3 -m pytest`.
fn default_commands() -> Vec<Vec<String>> {
    vec![vec!["pytest".into()], vec!["python3".into(), "-m".into(), "pytest".into()]]
}

/// The pytest command of the user's command line (the placeholder removed),
/// or the default programs when none is given.
pub fn base_commands(command: &[String]) -> Vec<Vec<String>> {
    let base = without_placeholder(command, &[]);
    if base.is_empty() {
        default_commands()
    } else {
        vec![base]
    }
}

/// Collects with the user's command; returns the command shown in messages
/// and the listing.
pub async fn list(command: &[String], plugins: &Plugins) -> Result<(String, Listing), UnitsError> {
    let out = plugins.scratch_file("collected.json");
    let candidates: Vec<ListCommand> = base_commands(command)
        .into_iter()
        .map(|mut argv| {
            argv.extend(["-p".into(), Plugins::PYTEST_MODULE.into(), "--collect-only".into()]);
            let mut env = plugins.pytest_env("collect");
            env.push(("HOPPER_COLLECT_OUT".into(), out.display().to_string()));
            ListCommand { argv, env }
        })
        .collect();
    // A stale file from an earlier attempt must not stand in for this one.
    let _ = std::fs::remove_file(&out);
    let (shown, output) = run_first_installed(&candidates).await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if output.status.code() == Some(NO_TESTS_COLLECTED) {
        return Ok((shown, Listing { ids: Vec::new(), counted: 0 }));
    }
    if !output.status.success() {
        return Err(failed(shown, &output));
    }
    let counted = collected_count(&stdout).ok_or_else(|| UnitsError::DiscoverParse {
        command: shown.clone(),
        source: ListingError::Inconsistent("pytest printed no \"N tests collected\" line".into()),
    })?;
    let text = std::fs::read_to_string(&out).map_err(|error| UnitsError::DiscoverParse {
        command: shown.clone(),
        source: ListingError::Inconsistent(format!(
            "hopper's plugin wrote no node ids to {} ({error}): was `-p {}` disabled?",
            out.display(),
            Plugins::PYTEST_MODULE
        )),
    })?;
    let (ids, _) = parse_collected(&text).map_err(|detail| UnitsError::DiscoverParse {
        command: shown.clone(),
        source: ListingError::Inconsistent(detail),
    })?;
    Ok((shown, Listing { ids, counted }))
}

/// Collects by starting the pytest agent itself: its collection is the
/// discovery (the node ids the plugin writes, checked against pytest's own
/// `testscollected`), and the ready agent is kept for the first slot, so
/// each slot's pytest collects once and nothing collects twice.
pub async fn list_with_agent(
    agent: &AgentCommand,
    plugins: &Plugins,
    env: &[(String, String)],
    tail_bytes: usize,
) -> Result<(String, Listing, AgentChild), UnitsError> {
    let out = plugins.scratch_file("collected.json");
    let _ = std::fs::remove_file(&out);
    let shown = super::shown(&agent.argv);
    let mut env = env.to_vec();
    env.push(("HOPPER_COLLECT_OUT".into(), out.display().to_string()));
    let mut child = AgentChild::spawn(agent, &env, tail_bytes)
        .map_err(|source| UnitsError::DiscoverSpawn { command: shown.clone(), source })?;
    match child.wait_ready().await {
        Ok(_) => {}
        Err(NotReady::Died { last_line }) => {
            let status = child.finish(std::time::Duration::from_secs(5), false).await;
            // Collected nothing: pytest exits before the test loop.
            if status == format!("exit code {NO_TESTS_COLLECTED}") {
                return Err(UnitsError::Empty { source_name: "--discover pytest".into() });
            }
            return Err(UnitsError::DiscoverFailed { command: shown, status, detail: last_line });
        }
        Err(NotReady::Protocol(got)) => {
            child.kill().await;
            return Err(UnitsError::DiscoverParse {
                command: shown,
                source: ListingError::Inconsistent(format!("agent protocol version {got}")),
            });
        }
    }
    let collected = std::fs::read_to_string(&out).map_err(|error| error.to_string()).and_then(|t| parse_collected(&t));
    match collected {
        Ok((ids, counted)) => Ok((shown, Listing { ids, counted }, child)),
        Err(detail) => {
            child.kill().await;
            Err(UnitsError::DiscoverParse { command: shown, source: ListingError::Inconsistent(detail) })
        }
    }
}

/// The node ids in the plugin's file, and pytest's own count.
pub fn parse_collected(text: &str) -> Result<(Vec<String>, usize), String> {
    #[derive(serde::Deserialize)]
    struct Collected {
        tests: Vec<String>,
        collected: usize,
    }
    serde_json::from_str::<Collected>(text)
        .map(|c| (c.tests, c.collected))
        .map_err(|e| format!("the plugin's node id file: {e}"))
}

/// The number of selected tests in pytest's own collection summary, in any of
/// its verbosities: `5 tests collected`, `2/5 tests collected (3 deselected)`,
/// `no tests collected`, `collected 5 items / 3 deselected / 2 selected`, or,
/// with `-qq`, one `path: N` line per file.
pub fn collected_count(stdout: &str) -> Option<usize> {
    for line in stdout.lines().rev() {
        let line = line.trim().trim_matches('=').trim();
        if line.starts_with("no tests collected") {
            return Some(0);
        }
        if let Some(idx) = line.find(" collected") {
            let head = &line[..idx];
            let Some(number) = head.strip_suffix(" tests").or_else(|| head.strip_suffix(" test")) else {
                continue;
            };
            let selected = number.split('/').next().unwrap_or(number);
            if let Ok(n) = selected.trim().parse() {
                return Some(n);
            }
        }
    }
    for line in stdout.lines() {
        let Some(rest) = line.trim().strip_prefix("collected ") else {
            continue;
        };
        let mut parts = rest.split(" / ");
        let total: usize = parts.next()?.split_whitespace().next()?.parse().ok()?;
        let mut selected = total;
        for part in parts {
            let mut words = part.split_whitespace();
            let (Some(n), Some(what)) = (words.next().and_then(|n| n.parse::<usize>().ok()), words.next()) else {
                continue;
            };
            match what {
                "selected" => selected = n,
                "deselected" => selected = total.saturating_sub(n),
                _ => {}
            }
        }
        return Some(selected);
    }
    let mut per_file = None;
    for line in stdout.lines() {
        if let Some((_, n)) = line.trim().rsplit_once(": ") {
            if let Ok(n) = n.parse::<usize>() {
                *per_file.get_or_insert(0) += n;
            }
        }
    }
    per_file
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_count_in_every_verbosity() {
        assert_eq!(collected_count("a.py::x\n\n5 tests collected in 0.01s\n"), Some(5));
        assert_eq!(collected_count("1 test collected in 0.01s\n"), Some(1));
        assert_eq!(collected_count("a\n\n2/5 tests collected (3 deselected) in 0.01s\n"), Some(2));
        assert_eq!(collected_count("==== 7 tests collected in 0.02s ====\n"), Some(7));
        assert_eq!(collected_count("no tests collected in 0.01s\n"), Some(0));
        assert_eq!(collected_count("collected 5 items / 3 deselected / 2 selected\n<Module a.py>\n"), Some(2));
        assert_eq!(collected_count("collected 4 items / 1 deselected\n"), Some(3));
        assert_eq!(collected_count("tests/a.py: 3\ntests/b.py: 4\n"), Some(7));
        assert_eq!(collected_count("nothing useful\n"), None);
    }

    #[test]
    fn node_ids_come_whole_from_the_plugin() {
        let (ids, n) = parse_collected(r#"{"tests": ["a.py::t[x y]", "a.py::t[\\xe9 'q']"], "collected": 2}"#).unwrap();
        assert_eq!(ids, ["a.py::t[x y]", "a.py::t[\\xe9 'q']"]);
        assert_eq!(n, 2);
        assert!(parse_collected("{}").is_err());
    }

    #[test]
    fn the_users_command_is_the_collector() {
        let cmd: Vec<String> = ["/v/bin/python", "-m", "pytest", "-q", "{unit}"].map(String::from).to_vec();
        assert_eq!(base_commands(&cmd), vec![vec!["/v/bin/python", "-m", "pytest", "-q"]]);
        assert_eq!(base_commands(&[]).len(), 2);
    }
}
