//! What every tool's listing shares: the command that lists (the user's own,
//! less the `{unit}` placeholder), running the first installed of its
//! candidates, and what a listing gives back or how it failed.

use crate::errors::UnitsError;
use crate::exec::template::PLACEHOLDER;

/// What a tool listed: the ids in its order, and the count it printed itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// Every id the listing named (before any check).
    pub ids: Vec<String>,
    /// How many tests the tool says it has.
    pub counted: usize,
}

/// The user's command without the `{unit}` placeholder (and without a
/// `flag {unit}` pair when `flag` is one of `flags_taking_unit`).
pub fn without_placeholder(command: &[String], flags_taking_unit: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(command.len());
    for part in command {
        if part.contains(PLACEHOLDER) {
            if out.last().is_some_and(|prev| flags_taking_unit.contains(&prev.as_str())) {
                out.pop();
            }
            continue;
        }
        out.push(part.clone());
    }
    out
}

/// A command line for messages (each element quoted when it needs it).
pub fn shown(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:+,@".contains(c)) {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Exit status of a shell or a version-manager shim (pyenv, asdf) whose
/// program does not exist.
const NOT_FOUND_STATUS: i32 = 127;

/// A listing command and the environment it needs.
#[derive(Debug, Clone, Default)]
pub struct ListCommand {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
}

/// Runs the first of `candidates` whose program is installed (the last one is
/// run, and its failure reported, whatever happens); returns its command line
/// and output.
pub async fn run_first_installed(candidates: &[ListCommand]) -> Result<(String, std::process::Output), UnitsError> {
    let Some((last, earlier)) = candidates.split_last() else {
        return Err(UnitsError::DiscoverSpawn {
            command: String::new(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no listing command"),
        });
    };
    for candidate in earlier {
        let (command, result) = run_listing(candidate).await;
        match result {
            Ok(output) if output.status.code() == Some(NOT_FOUND_STATUS) => {
                tracing::debug!(%command, "not installed (exit 127); trying the next command");
            }
            Ok(output) => return Ok((command, output)),
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
                tracing::debug!(%command, "not installed; trying the next command");
            }
            Err(source) => return Err(UnitsError::DiscoverSpawn { command, source }),
        }
    }
    let (command, result) = run_listing(last).await;
    match result {
        Ok(output) => Ok((command, output)),
        Err(source) => Err(UnitsError::DiscoverSpawn { command, source }),
    }
}

/// Runs `list` with its stdout and stderr on one pipe, so that their lines
/// keep the order they were written in (cargo's `Running` line on stderr,
/// then that binary's listing on stdout). The output holds the merged text
/// as both stdout and stderr.
pub async fn run_merged(list: &ListCommand) -> Result<(String, std::process::Output), UnitsError> {
    let command = shown(&list.argv);
    tracing::debug!(%command, "discovering units (stdout and stderr merged)");
    let spawn_error = |source| UnitsError::DiscoverSpawn { command: command.clone(), source };
    let Some((program, args)) = list.argv.split_first() else {
        return Err(spawn_error(std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command")));
    };
    let (mut reader, writer) = std::io::pipe().map_err(spawn_error)?;
    let also = writer.try_clone().map_err(spawn_error)?;
    let mut child = {
        // Dropped once spawned: the pipe's write ends must be the child's alone,
        // or the read below never ends.
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .envs(list.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .stdout(writer)
            .stderr(also);
        cmd.spawn().map_err(spawn_error)?
    };
    let read = tokio::task::spawn_blocking(move || {
        let mut merged = Vec::new();
        std::io::Read::read_to_end(&mut reader, &mut merged).map(|_| merged)
    });
    let status = child.wait().await.map_err(spawn_error)?;
    let merged = read.await.map_err(|e| spawn_error(std::io::Error::other(e)))?.map_err(spawn_error)?;
    Ok((command, std::process::Output { status, stdout: merged.clone(), stderr: merged }))
}

async fn run_listing(list: &ListCommand) -> (String, std::io::Result<std::process::Output>) {
    let command = shown(&list.argv);
    tracing::debug!(%command, "discovering units");
    let Some((program, args)) = list.argv.split_first() else {
        return (command, Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command")));
    };
    let result = tokio::process::Command::new(program)
        .args(args)
        .envs(list.env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .output()
        .await;
    (command, result)
}

/// A failed listing as an error: its status and its last line of output.
pub fn failed(command: String, output: &std::process::Output) -> UnitsError {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    UnitsError::DiscoverFailed { command, status: output.status.to_string(), detail: failure_detail(&stdout, &stderr) }
}

/// How many lines of a failed tool's stderr before its last one its error shows.
const CONTEXT_LINES: usize = 20;

/// What a failed tool said: the last line of its stderr (of its stdout if
/// it wrote no error), after the lines of stderr before it (a traceback:
/// the tool may fail after its listing, in a hook that runs at exit, so
/// stdout's last line says nothing of why).
fn failure_detail(stdout: &str, stderr: &str) -> String {
    let errors: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let Some((last, before)) = errors.split_last() else {
        return crate::exec::process::last_line(stdout).to_owned();
    };
    let context = &before[before.len().saturating_sub(CONTEXT_LINES)..];
    match context.is_empty() {
        true => last.trim().to_owned(),
        false => format!("{}\n{}", last.trim(), context.join("\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placeholder_and_its_flag_are_dropped() {
        let cmd: Vec<String> = ["cargo", "nextest", "run", "-E", "{unit}", "-p", "x"].map(String::from).to_vec();
        assert_eq!(without_placeholder(&cmd, &["-E"]), ["cargo", "nextest", "run", "-p", "x"]);
        let cmd: Vec<String> = ["python", "-m", "pytest", "-q", "{unit}"].map(String::from).to_vec();
        assert_eq!(without_placeholder(&cmd, &[]), ["python", "-m", "pytest", "-q"]);
    }

    #[test]
    fn a_failure_says_the_last_error_line_then_the_traceback_before_it() {
        let stdout = "2 tests collected in 0.01s\n";
        let stderr = "Traceback (most recent call last):\n  File \"conftest.py\", line 2\nRuntimeError: boom\n\n";
        assert_eq!(
            failure_detail(stdout, stderr),
            "RuntimeError: boom\nTraceback (most recent call last):\n  File \"conftest.py\", line 2"
        );
        assert_eq!(failure_detail(stdout, "  \n"), "2 tests collected in 0.01s", "no error output: stdout's last line");
        assert_eq!(failure_detail("", ""), "no output");
        assert_eq!(failure_detail("", "error: only line\n"), "error: only line");
    }

    #[test]
    fn shown_commands_quote_what_needs_it() {
        let argv: Vec<String> = ["pytest", "t.py::x[a b]", "it's"].map(String::from).to_vec();
        assert_eq!(shown(&argv), "pytest 't.py::x[a b]' 'it'\\''s'");
    }

    #[tokio::test]
    async fn discovery_falls_back_when_a_program_is_not_installed() {
        let cmd = |argv: &[&str]| ListCommand { argv: argv.iter().map(|s| s.to_string()).collect(), env: vec![] };
        let missing = cmd(&["hopper-test-no-such-program", "--collect-only"]);
        let shim_missing = cmd(&["sh", "-c", "echo 'shim: command not found' >&2; exit 127"]);
        let works = cmd(&["sh", "-c", "echo listed"]);
        let (command, output) =
            run_first_installed(&[missing.clone(), shim_missing.clone(), works.clone()]).await.unwrap();
        assert_eq!(command, "sh -c 'echo listed'");
        assert_eq!(String::from_utf8_lossy(&output.stdout), "listed\n");

        // A program that runs and fails is the answer: no fallback.
        let (_, output) = run_first_installed(&[cmd(&["sh", "-c", "exit 3"]), works]).await.unwrap();
        assert_eq!(output.status.code(), Some(3));

        // The last candidate's failure to start is reported.
        let err = run_first_installed(&[shim_missing, missing]).await.unwrap_err();
        assert!(matches!(err, UnitsError::DiscoverSpawn { .. }), "{err}");
        assert!(err.to_string().contains("hopper-test-no-such-program --collect-only"), "{err}");
    }
}
