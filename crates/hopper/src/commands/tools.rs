//! The agent commands hopper builds for the tools it ships an agent for.

use std::path::Path;

use crate::agent::child::AgentCommand;
use crate::agent::plugins::Plugins;
use crate::units::discover::{pytest, rspec};

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
