//! Each tool's specifics for `hopper run`, in one place: which way its units
//! run (hopper's agent, each test binary directly, or the command template),
//! how its units are listed for that way, and the agent command hopper
//! builds for the tools it ships an agent for.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use leasehold_core::{RunId, UnitSpec, WorkerId};

use crate::agent::child::{agent_env, AgentCommand, SpareAgent};
use crate::agent::plugins::Plugins;
use crate::errors::{HopperError, UnitsError};
use crate::exec::template::CommandTemplate;
use crate::units::discover::{
    cargo_exact, checked_units, discover, name_some, nextest, paths, pytest, rspec, DiscoverKind,
};
use crate::units::{collect_units, UnitSource};
use crate::verdicts::outside::OutsideError;
use crate::verdicts::{BatchResults, ResultsFormat, ResultsPlan, RSPEC_REPORTER_PLACEHOLDER};
use crate::worker::launch::NextestLauncher;
use crate::worker::{BatchSlots, Invocations};

/// How `hopper run` runs units (`--agent`, `--per-process`, or neither).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExecutionChoice {
    /// An agent where hopper has one for the discovered tool, one process per
    /// unit (or batch) otherwise.
    #[default]
    Default,
    /// `--agent`: the command speaks the agent protocol.
    Agent,
    /// `--per-process`: one process per unit (or batch), always.
    PerProcess,
}

/// How this run's units run, from `--agent` / `--per-process` and the tool,
/// with what can be checked before anything slow happens.
pub(super) enum Execution {
    /// One process per unit (or batch): the command template, and how each
    /// unit's result is read.
    PerProcess {
        /// The template (with the tool's report option where hopper adds it).
        command: CommandTemplate,
        /// How the batch results are read.
        results: Arc<dyn BatchResults>,
        /// One unit per process judged by the exit code alone (so a
        /// `cargo test` command can run each test exactly, counted).
        one_by_exit_code: bool,
    },
    /// hopper's pytest plugin as an agent.
    Pytest,
    /// hopper's RSpec agent.
    Rspec,
    /// `--agent`: the user's command speaks the protocol.
    Custom,
    /// `--discover nextest` with no command: each test binary run directly.
    Nextest,
}

/// What a run needs from its tool: the checked units, and how each slot
/// starts an invocation of them.
pub(super) struct Prepared {
    /// The units, in the tool's order.
    pub units: Vec<UnitSpec>,
    /// How the slots run them.
    pub invocations: Invocations,
    /// Errors outside any test that the listing met (each fails the build).
    pub outside_errors: Vec<OutsideError>,
}

/// What [`Execution::prepare`] needs to know of the run.
pub(super) struct Preparing<'a> {
    /// Where the units come from.
    pub source: &'a UnitSource,
    /// The user's command (after `--`).
    pub command: &'a [String],
    /// `--batch-size`.
    pub batch_size: usize,
    /// Local slots (pytest collects one shard per slot).
    pub slots: usize,
    /// Bytes of output kept per attempt.
    pub tail: usize,
    /// The build.
    pub run: &'a RunId,
    /// This worker.
    pub worker: &'a WorkerId,
}

impl Execution {
    /// Chooses the way and checks the command (and, for one process per
    /// unit, how results are read) without starting anything.
    pub(super) fn choose(
        mode: ExecutionChoice,
        source: &UnitSource,
        command: &[String],
        batch_size: usize,
        results: Option<ResultsFormat>,
    ) -> Result<Self, HopperError> {
        // `--batch-size N` or `--results` asks for batches read from the tool's report.
        let batches = batch_size > 1 || results.is_some();
        let tool = match source {
            UnitSource::Discover(kind) => Some(*kind),
            _ => None,
        };
        let cargo_runs_them;
        let command = match direct_nextest_lacks_env(tool, command, batches) {
            Some(config) => {
                eprintln!(
                    "hopper: {} sets environment variables for the tests ([env]), which cargo gives them: each \
                     test runs through `cargo nextest run -E {{unit}}` (a cargo start per test) instead of its binary \
                     run directly",
                    config.display()
                );
                cargo_runs_them = ["cargo", "nextest", "run"].map(String::from);
                &cargo_runs_them[..]
            }
            None => command,
        };
        if let Some(config) = nextest_groups(tool) {
            eprintln!(
                "hopper: {} defines nextest test groups: their tests keep their groups' limits, held across the \
                 whole build (every worker together; a --group NAME=LIMIT:GLOB that matches a test outranks them)",
                config.display()
            );
        }
        let execution = match (mode, tool) {
            (ExecutionChoice::Agent, _) => Execution::Custom,
            (ExecutionChoice::Default, Some(DiscoverKind::Pytest)) if !batches => Execution::Pytest,
            (ExecutionChoice::Default, Some(DiscoverKind::Rspec)) if !batches => Execution::Rspec,
            (_, Some(DiscoverKind::Nextest)) if command.is_empty() && !batches => Execution::Nextest,
            _ => {
                // Agents report per test themselves; batches read the tool's report.
                let plan = ResultsPlan::resolve(results, batch_size, tool, for_each_unit(command, tool))?;
                let command = CommandTemplate::new(without_tool_paths(plan.command.clone(), tool))?;
                let one_by_exit_code = batch_size == 1 && results.is_none_or(|r| r == ResultsFormat::ExitCode);
                return Ok(Execution::PerProcess { command, results: plan.results()?, one_by_exit_code });
            }
        };
        // An agent's command must be one (an empty one is the tool's own).
        if matches!(execution, Execution::Custom) || !command.is_empty() {
            CommandTemplate::new(command.to_vec())?;
        }
        Ok(execution)
    }

    /// Lists the units as this way needs them, and builds how the slots run them.
    pub(super) async fn prepare(self, run: Preparing<'_>, plugins: &Plugins) -> Result<Prepared, HopperError> {
        let Preparing { source, command, batch_size, slots, tail, .. } = run;
        let mut outside_errors = Vec::new();
        let (units, invocations) = match self {
            Execution::Pytest => {
                // The agents' collections are the discovery, each of a share of
                // the files: nothing collects twice.
                let agent = pytest_agent(command, plugins, 0, tail);
                let env = agent_env(run.run, run.worker);
                let found = pytest::list_with_agents(&agent, plugins, &env, tail, slots).await?;
                let units =
                    checked_units(&found.shown, found.listing, DiscoverKind::Pytest.unit_kind(), "--discover pytest")?;
                let agent = AgentCommand {
                    spare: SpareAgent::new(found.agents),
                    sharding: found.sharding.map(Arc::new),
                    ..pytest_agent(command, plugins, units.len(), tail)
                };
                (units, Invocations::Agents(Arc::new(agent)))
            }
            Execution::Rspec => {
                let units = discover(DiscoverKind::Rspec, command, plugins).await?.units;
                let agent = rspec_agent(command, plugins, units.len(), tail);
                (units, Invocations::Agents(Arc::new(agent)))
            }
            Execution::Custom => {
                let units = listed_units(source, command, plugins).await?;
                (units, Invocations::Agents(Arc::new(custom_agent(command))))
            }
            Execution::Nextest => {
                let discovered = discover(DiscoverKind::Nextest, command, plugins).await?;
                let launcher = NextestLauncher::new(discovered.nextest.unwrap_or_default(), run.run.as_str());
                // One process per test, as nextest runs them; the binary's own
                // libtest count and panic message, as for cargo-test units.
                let counted = Arc::new(cargo_exact::CountedResults);
                (discovered.units, Invocations::Batches(BatchSlots::one_per_process(Arc::new(launcher), counted)))
            }
            Execution::PerProcess { command: template, results, one_by_exit_code } => {
                let reporter = plugins.rspec_agent().display().to_string();
                let template = template.replacing(RSPEC_REPORTER_PLACEHOLDER, &reporter);
                let (units, cargo_targets, pytest_rootdir) = match source {
                    UnitSource::Discover(kind) => {
                        let discovered = discover(*kind, command, plugins).await?;
                        outside_errors = discovered.outside_errors;
                        (discovered.units, discovered.cargo_targets, discovered.pytest_rootdir)
                    }
                    other => (collect_units(other).await?, None, None),
                };
                // cargo-test units one at a time: the exact test in its
                // binary, and libtest's own count must say it ran.
                let exact = *source == UnitSource::Discover(DiscoverKind::CargoTest)
                    && one_by_exit_code
                    && cargo_exact::is_cargo_test(template.parts());
                let slots = if exact {
                    let launcher = Arc::new(cargo_exact::CargoExact::new(template, cargo_targets.unwrap_or_default()));
                    BatchSlots::one_per_process(launcher.clone(), Arc::new(cargo_exact::CountedResults))
                        .sharing(launcher)
                } else {
                    if let Some(units) = &cargo_targets {
                        let mut renamed: Vec<&str> = units.renamed().collect();
                        if !renamed.is_empty() {
                            renamed.sort_unstable();
                            return Err(UnitsError::SharedTestNames {
                                count: renamed.len(),
                                names: name_some(&renamed),
                            }
                            .into());
                        }
                    }
                    match pytest_rootdir {
                        // pytest run from below its rootdir: ids as that directory names them.
                        Some(rootdir) => {
                            let launcher = Arc::new(pytest::FromRootdir::new(template, rootdir));
                            BatchSlots::launched(batch_size, launcher, results)?
                        }
                        None => BatchSlots::template(batch_size, template, results)?,
                    }
                };
                (units, Invocations::Batches(slots))
            }
        };
        Ok(Prepared { units, invocations, outside_errors })
    }
}

/// For `--discover nextest` with no command (test binaries run directly):
/// the cargo config that sets the tests' environment, which only cargo
/// gives them.
fn direct_nextest_lacks_env(tool: Option<DiscoverKind>, command: &[String], batches: bool) -> Option<PathBuf> {
    let direct = tool == Some(DiscoverKind::Nextest) && command.is_empty() && !batches;
    direct.then(|| std::env::current_dir().ok().and_then(|cwd| nextest::cargo_config_env(&cwd))).flatten()
}

/// For `--discover nextest`: nextest's config, when it defines test groups.
fn nextest_groups(tool: Option<DiscoverKind>) -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok().filter(|_| tool == Some(DiscoverKind::Nextest))?;
    nextest::nextest_test_groups(&cwd)
}

/// `command` as each unit runs it: for nextest, filtered by the unit alone
/// (see [`nextest::per_unit_command`]), its own filtersets only for discovery.
fn for_each_unit(command: &[String], tool: Option<DiscoverKind>) -> Vec<String> {
    if tool != Some(DiscoverKind::Nextest) {
        return command.to_vec();
    }
    let (kept, dropped) = nextest::per_unit_command(command.to_vec());
    if !dropped.is_empty() {
        eprintln!(
            "hopper: {} chose the tests at discovery; each unit's command filters by the unit alone (nextest runs \
             the tests matching any of its filtersets), so it runs without it",
            dropped.join(" ")
        );
    }
    kept
}

/// `command` for running units: a discovered tool's own path arguments
/// dropped (the units name their tests; see [`paths`]), said once.
fn without_tool_paths(command: Vec<String>, tool: Option<DiscoverKind>) -> Vec<String> {
    let (Some(tool), Ok(cwd)) = (tool, std::env::current_dir()) else { return command };
    let (kept, dropped) = paths::drop_paths(&command, tool, &cwd);
    if dropped.is_empty() {
        return command;
    }
    eprintln!(
        "hopper: {} is only for discovery: each unit's command names its tests, so it runs without {}",
        dropped.join(" "),
        if dropped.len() == 1 { "it" } else { "them" }
    );
    kept
}

/// The units of `source`, listed by the tool when it is discovered.
async fn listed_units(
    source: &UnitSource,
    command: &[String],
    plugins: &Plugins,
) -> Result<Vec<UnitSpec>, HopperError> {
    Ok(match source {
        UnitSource::Discover(kind) => discover(*kind, command, plugins).await?.units,
        other => collect_units(other).await?,
    })
}

/// Whether `program` can be started: a path that exists, or a name on PATH.
fn installed(program: &str) -> bool {
    if program.contains('/') {
        return Path::new(program).exists();
    }
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

/// The pytest agent: the user's pytest command (the one discovery used) with
/// hopper's plugin loaded in agent mode.
pub fn pytest_agent(command: &[String], plugins: &Plugins, expected_tests: usize, output_tail: usize) -> AgentCommand {
    let candidates = pytest::base_commands(command);
    let mut argv = candidates
        .iter()
        .find(|c| c.first().is_some_and(|p| installed(p)))
        .or(candidates.last())
        .cloned()
        .unwrap_or_default();
    argv.extend(["-p".into(), Plugins::PYTEST_MODULE.into()]);
    let mut env = plugins.pytest_env("agent");
    env.push(("HOPPER_OUTPUT_TAIL".into(), output_tail.to_string()));
    AgentCommand::new(argv, env, Some(expected_tests as u64))
}

/// The RSpec agent: the user's rspec command with hopper's agent required.
pub fn rspec_agent(command: &[String], plugins: &Plugins, expected_tests: usize, output_tail: usize) -> AgentCommand {
    let mut argv = rspec::base_command(command);
    argv.extend(["--require".into(), plugins.rspec_agent().display().to_string()]);
    let env = vec![("HOPPER_RSPEC_AGENT".into(), "1".into()), ("HOPPER_OUTPUT_TAIL".into(), output_tail.to_string())];
    AgentCommand::new(argv, env, Some(expected_tests as u64))
}

/// `--agent`: the user's command speaks the protocol itself.
pub fn custom_agent(command: &[String]) -> AgentCommand {
    AgentCommand::new(command.to_vec(), Vec::new(), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_extend_the_users_command() {
        let plugins = Plugins::new().unwrap();
        let cmd: Vec<String> = ["/v/bin/python", "-m", "pytest", "-q"].map(String::from).to_vec();
        let agent = pytest_agent(&cmd, &plugins, 7, 100);
        assert_eq!(agent.argv, ["/v/bin/python", "-m", "pytest", "-q", "-p", "hopper_pytest"]);
        assert!(agent.env.contains(&("HOPPER_PYTEST_MODE".into(), "agent".into())));
        assert_eq!(agent.expected_tests, Some(7));
        let agent = rspec_agent(&["bundle".into(), "exec".into(), "rspec".into()], &plugins, 2, 100);
        assert_eq!(&agent.argv[..4], ["bundle", "exec", "rspec", "--require"]);
        assert!(installed("sh") && !installed("hopper-no-such-program"));
    }
}
