//! pytest discovery: the user's own pytest command collects, with hopper's
//! plugin writing every node id whole to a file. With `--collect-only`,
//! pytest's own summary line gives the count the ids are checked against;
//! with agents, the first agent's collection is the discovery.

use crate::agent::child::{AgentChild, AgentCommand, NotReady, SLOT_ENV};
use crate::agent::plugins::Plugins;
use crate::agent::shards::{file_of, interleave, Sharding, SHARD_ENV};
use crate::errors::{ListingError, UnitsError};
use crate::exec::template::CommandTemplate;
use crate::verdicts::outside::OutsideError;
use crate::worker::launch::{Invocation, Launcher};
use leasehold_core::UnitId;

use super::listing::{failed, run_first_installed, without_placeholder, ListCommand, Listing};

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

/// pytest's exit status when a test (or, with `--collect-only
/// --continue-on-collection-errors`, a file's collection) failed.
const TESTS_FAILED: i32 = 1;

/// Collects with the user's command; returns the command shown in messages,
/// the listing, and the files that did not collect (kept going with
/// `--continue-on-collection-errors`; each is an error of the build).
pub async fn list(command: &[String], plugins: &Plugins) -> Result<(String, Found), UnitsError> {
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
        return Ok((
            shown,
            Found { listing: Listing { ids: Vec::new(), counted: 0 }, errors: Vec::new(), rootdir: None },
        ));
    }
    // The plugin wrote the files that did not collect, with their tracebacks.
    let errors = std::fs::read_to_string(&out).ok().map(|t| collection_errors(&t)).unwrap_or_default();
    let kept_going = output.status.code() == Some(TESTS_FAILED) && errors.iter().any(|e| !e.is_skip());
    if !output.status.success() && !kept_going {
        return Err(with_collection_errors(failed(shown, &output), &errors));
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
    let collection = parse_collection(&text).map_err(|detail| UnitsError::DiscoverParse {
        command: shown.clone(),
        source: ListingError::Inconsistent(detail),
    })?;
    let found = Found { listing: Listing { ids: collection.tests, counted }, errors, rootdir: collection.rootdir };
    Ok((shown, found))
}

/// A pytest collection: its ids, the files that did not collect, and
/// pytest's rootdir from the directory it ran in (when not that one).
pub struct Found {
    /// The node ids, and pytest's own count.
    pub listing: Listing,
    /// The files that did not collect.
    pub errors: Vec<OutsideError>,
    /// See [`FromRootdir`].
    pub rootdir: Option<String>,
}

/// The collection errors in the plugin's node id file, and the files skipped
/// whole (phase `skipped`); none when it has none.
pub fn collection_errors(text: &str) -> Vec<OutsideError> {
    #[derive(serde::Deserialize)]
    struct Errors {
        #[serde(default)]
        errors: Vec<OutsideError>,
    }
    serde_json::from_str::<Errors>(text).map(|e| e.errors).unwrap_or_default()
}

/// `error` with the file and traceback of every collection error added to
/// its detail (pytest's own last line says only how many there were).
fn with_collection_errors(error: UnitsError, errors: &[OutsideError]) -> UnitsError {
    match error {
        UnitsError::DiscoverFailed { command, status, mut detail } if !errors.is_empty() => {
            for error in errors.iter().filter(|e| !e.is_skip()) {
                detail.push_str(&format!(
                    "\n{} error in {}: {}\n{}",
                    error.phase,
                    error.group,
                    error.message,
                    error.output.trim_end()
                ));
            }
            UnitsError::DiscoverFailed { command, status, detail }
        }
        other => other,
    }
}

/// What the agents whose collection is the discovery found.
pub struct AgentListing {
    /// The command shown in messages.
    pub shown: String,
    /// The ids of every shard (interleaved, see [`interleave`]) and the sum
    /// of pytest's own counts.
    pub listing: Listing,
    /// The ready agents, one per shard, for the slot of the same number.
    pub agents: Vec<AgentChild>,
    /// How the suite is split (`None` with one agent: it collected all).
    pub sharding: Option<Sharding>,
}

/// Collects by starting the `shards` pytest agents themselves, each on its
/// share of the test files (`HOPPER_SHARD=k/shards`; with one, the whole
/// suite): their collections together are the discovery. Each shard's node
/// ids are checked against pytest's own count for it, and every agent must
/// have seen the same files dealt the same way, so no file falls between
/// shards. The ready agents are kept for the slots, so each test file is
/// collected once and nothing collects twice.
pub async fn list_with_agents(
    agent: &AgentCommand,
    plugins: &Plugins,
    env: &[(String, String)],
    tail_bytes: usize,
    shards: usize,
) -> Result<AgentListing, UnitsError> {
    let shards = shards.max(1);
    let shown = super::listing::shown(&agent.argv);
    let mut children = Vec::with_capacity(shards);
    let mut outs = Vec::with_capacity(shards);
    for k in 0..shards {
        let out = plugins.scratch_file(&format!("collected-{k}.json"));
        let _ = std::fs::remove_file(&out);
        let mut env = env.to_vec();
        env.push(("HOPPER_COLLECT_OUT".into(), out.display().to_string()));
        // Agent k is kept for slot k (see `SpareAgent`).
        env.push((SLOT_ENV.into(), k.to_string()));
        if shards > 1 {
            env.push((SHARD_ENV.into(), format!("{k}/{shards}")));
        }
        match AgentChild::spawn(agent, &env, tail_bytes) {
            Ok(child) => children.push(child),
            Err(source) => {
                kill_all(children).await;
                return Err(UnitsError::DiscoverSpawn { command: shown, source });
            }
        }
        outs.push(out);
    }
    // The agents collect at once; waiting for them in turn costs nothing.
    let mut failure = None;
    for (k, child) in children.iter_mut().enumerate() {
        if let Err(not_ready) = child.wait_ready().await {
            failure = Some((k, not_ready));
            break;
        }
    }
    if let Some((k, not_ready)) = failure {
        return Err(not_ready_error(children, k, not_ready, shown).await);
    }
    let mut parsed = Vec::with_capacity(shards);
    for out in &outs {
        match std::fs::read_to_string(out).map_err(|error| error.to_string()).and_then(|t| parse_shard(&t)) {
            Ok(shard) => parsed.push(shard),
            Err(detail) => {
                kill_all(children).await;
                return Err(inconsistent(shown, detail));
            }
        }
    }
    match merge_shards(parsed) {
        Ok((listing, sharding)) => Ok(AgentListing { shown, listing, agents: children, sharding }),
        Err(detail) => {
            kill_all(children).await;
            Err(inconsistent(shown, detail))
        }
    }
}

impl std::fmt::Debug for AgentListing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentListing")
            .field("shown", &self.shown)
            .field("listing", &self.listing)
            .field("agents", &self.agents.len())
            .field("sharding", &self.sharding)
            .finish()
    }
}

fn inconsistent(command: String, detail: String) -> UnitsError {
    UnitsError::DiscoverParse { command, source: ListingError::Inconsistent(detail) }
}

async fn kill_all(children: Vec<AgentChild>) {
    for child in children {
        child.kill().await;
    }
}

/// The error for agent `failed`, which did not become ready; ends every
/// agent (the failed one is reaped for its exit status, the others killed).
async fn not_ready_error(children: Vec<AgentChild>, failed: usize, not_ready: NotReady, shown: String) -> UnitsError {
    let mut status = None;
    for (k, child) in children.into_iter().enumerate() {
        if k == failed && matches!(not_ready, NotReady::Died { .. }) {
            status = Some(child.finish(std::time::Duration::from_secs(5), false).await);
        } else {
            child.kill().await;
        }
    }
    match not_ready {
        NotReady::Died { last_line, context } => {
            // Collected nothing: pytest exits before the test loop.
            if status.as_ref().and_then(|end| end.code()) == Some(NO_TESTS_COLLECTED) {
                return UnitsError::Empty { source_name: "--discover pytest".into() };
            }
            let status = status.map_or_else(|| "status unknown".to_owned(), |end| end.to_string());
            let detail = match context.is_empty() {
                true => last_line,
                false => format!("{last_line}\n{context}"),
            };
            UnitsError::DiscoverFailed { command: shown, status, detail }
        }
        NotReady::Protocol(got) => inconsistent(shown, format!("agent protocol version {got}")),
    }
}

/// One agent's collection: its node ids, pytest's own count, and (sharded)
/// the files it saw as `[node id, bytes, shard]`, with its shard and the count.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct ShardCollection {
    /// The node ids it collected.
    pub tests: Vec<String>,
    /// pytest's own count.
    pub collected: usize,
    /// Its shard.
    #[serde(default)]
    pub shard: usize,
    /// How many shards.
    #[serde(default = "one")]
    pub shards: usize,
    /// Every file the agent saw, in pytest's order, with its size and shard.
    #[serde(default)]
    pub files: Vec<(String, u64, usize)>,
}

fn one() -> usize {
    1
}

fn parse_shard(text: &str) -> Result<ShardCollection, String> {
    serde_json::from_str(text).map_err(|e| format!("the plugin's node id file: {e}"))
}

/// The shards' collections as one listing: each shard's ids must match
/// its own count (else the error names the shard), every shard must have seen
/// the same files dealt the same way, and a shard holds only ids of its own
/// files. The ids come interleaved across shards.
pub fn merge_shards(parsed: Vec<ShardCollection>) -> Result<(Listing, Option<Sharding>), String> {
    let count = parsed.len();
    if count <= 1 {
        let (ids, counted) = parsed.into_iter().next().map(|p| (p.tests, p.collected)).unwrap_or_default();
        return Ok((Listing { ids, counted }, None));
    }
    let files = &parsed[0].files;
    let mut counted = 0;
    for (k, shard) in parsed.iter().enumerate() {
        if shard.shard != k || shard.shards != count {
            return Err(format!("agent {k} collected shard {}/{} (wanted {k}/{count})", shard.shard, shard.shards));
        }
        if shard.files != *files {
            return Err(format!(
                "agents 0 and {k} saw different test files ({} and {}): did the suite change while they collected?",
                files.len(),
                shard.files.len()
            ));
        }
        if shard.tests.len() != shard.collected {
            return Err(format!(
                "shard {k}/{count}: pytest counted {} tests but {} node ids were written",
                shard.collected,
                shard.tests.len()
            ));
        }
        counted += shard.collected;
    }
    let owner: std::collections::HashMap<&str, usize> = files.iter().map(|(f, _, s)| (f.as_str(), *s)).collect();
    for (k, shard) in parsed.iter().enumerate() {
        let stray = shard.tests.iter().find(|t| owner.get(file_of(t)).is_some_and(|s| *s != k));
        if let Some(test) = stray {
            return Err(format!("shard {k}/{count} collected {test:?}, of a file dealt to another shard"));
        }
    }
    let ids: Vec<Vec<String>> = parsed.into_iter().map(|p| p.tests).collect();
    let sharding = Sharding::new(&ids);
    Ok((Listing { ids: interleave(ids), counted }, Some(sharding)))
}

/// The node ids in the plugin's file, and pytest's own count.
pub fn parse_collected(text: &str) -> Result<(Vec<String>, usize), String> {
    parse_collection(text).map(|c| (c.tests, c.collected))
}

/// What the plugin wrote of a collection.
#[derive(serde::Deserialize)]
struct Collected {
    tests: Vec<String>,
    collected: usize,
    /// pytest's rootdir from the directory it ran in, when not that one.
    #[serde(default)]
    rootdir: Option<String>,
}

fn parse_collection(text: &str) -> Result<Collected, String> {
    serde_json::from_str::<Collected>(text).map_err(|e| format!("the plugin's node id file: {e}"))
}

/// Runs pytest's node ids, which are relative to its rootdir, with a command
/// run from another directory (a subdirectory of the rootdir): each id is
/// passed as that directory sees it (`../tests/test_a.py::test_x` for
/// `tests/test_a.py::test_x` from `tests/`), where pytest would find no file.
/// Reports name tests by their node ids, as the units.
#[derive(Debug, Clone)]
pub struct FromRootdir {
    template: CommandTemplate,
    rootdir: String,
}

impl FromRootdir {
    /// `template`'s units given relative to `rootdir` (a path from the
    /// directory the command runs in).
    pub fn new(template: CommandTemplate, rootdir: String) -> Self {
        Self { template, rootdir }
    }
}

impl Launcher for FromRootdir {
    fn invocation(&self, units: &[UnitId]) -> Invocation {
        let named: Vec<UnitId> = units
            .iter()
            .map(|u| UnitId::new(format!("{}/{}", self.rootdir, u)).unwrap_or_else(|_| u.clone()))
            .collect();
        Invocation { argv: self.template.render(&named), ..Invocation::default() }
    }
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

    fn shard(k: usize, tests: &[&str], files: &[(&str, usize)]) -> ShardCollection {
        ShardCollection {
            tests: tests.iter().map(|t| t.to_string()).collect(),
            collected: tests.len(),
            shard: k,
            shards: 2,
            files: files.iter().map(|(f, s)| (f.to_string(), 10, *s)).collect(),
        }
    }

    #[test]
    fn shards_merge_only_when_they_agree() {
        let files = [("a.py", 0), ("b b.py", 1)];
        let zero = shard(0, &["a.py::t[x y]", "a.py::u"], &files);
        let one = shard(1, &["b b.py::t[é]"], &files);
        let (listing, sharding) = merge_shards(vec![zero.clone(), one.clone()]).unwrap();
        assert_eq!(listing.ids, ["a.py::t[x y]", "b b.py::t[é]", "a.py::u"]);
        assert_eq!(listing.counted, 3);
        let sharding = sharding.unwrap();
        assert_eq!((sharding.expected(0), sharding.expected(1)), (2, 1));
        assert_eq!(sharding.shard_of_unit("b b.py::t[é]"), Some(1));

        let blind = shard(1, &["b b.py::t[é]"], &[("a.py", 0)]);
        let err = merge_shards(vec![zero.clone(), blind]).unwrap_err();
        assert!(err.contains("saw different test files"), "{err}");

        let mut short = one.clone();
        short.collected = 2;
        let err = merge_shards(vec![zero.clone(), short]).unwrap_err();
        assert!(err.contains("shard 1/2: pytest counted 2 tests but 1 node ids"), "{err}");

        let stray = shard(1, &["a.py::v"], &files);
        assert!(merge_shards(vec![zero.clone(), stray]).unwrap_err().contains("dealt to another shard"));

        let swapped = merge_shards(vec![one, zero]).unwrap_err();
        assert!(swapped.contains("agent 0 collected shard 1/2"), "{swapped}");
    }

    #[test]
    fn the_users_command_is_the_collector() {
        let cmd: Vec<String> = ["/v/bin/python", "-m", "pytest", "-q", "{unit}"].map(String::from).to_vec();
        assert_eq!(base_commands(&cmd), vec![vec!["/v/bin/python", "-m", "pytest", "-q"]]);
        assert_eq!(base_commands(&[]).len(), 2);
    }
}
