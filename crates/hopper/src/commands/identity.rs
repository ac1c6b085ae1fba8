//! Build and worker ids: from the command line, `HOPPER_BUILD` /
//! `HOPPER_WORKER`, or the variables common CI systems set.
//!
//! Every worker of one build must agree on the build id without talking to
//! each other, so the CI variables used are the ones that are equal on all
//! parallel jobs of one build (and differ on a retry of the build). The worker
//! id only has to be unique among the build's workers; without a CI node index
//! it is `<host>-<pid>-<random>`.

use leasehold_core::ids::is_key_safe_char;
use leasehold_core::{RunId, WorkerId};

use crate::errors::HopperError;

/// Reads an environment variable (a function so tests need not touch the
/// process environment).
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment, ignoring empty values.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn get(env: EnvLookup<'_>, name: &str) -> Option<String> {
    env(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

/// The build id from CI variables, if a known CI system set them.
pub fn ci_build(env: EnvLookup<'_>) -> Option<String> {
    if let Some(id) = get(env, "GITHUB_RUN_ID") {
        let attempt = get(env, "GITHUB_RUN_ATTEMPT").unwrap_or_else(|| "1".into());
        return Some(format!("gh-{id}-{attempt}"));
    }
    if let Some(id) = get(env, "BUILDKITE_BUILD_ID") {
        // A retried job keeps the build id; the step id separates steps that
        // run different suites in the same build.
        return Some(match get(env, "BUILDKITE_STEP_ID") {
            Some(step) => format!("bk-{id}-{step}"),
            None => format!("bk-{id}"),
        });
    }
    if let Some(id) = get(env, "CIRCLE_WORKFLOW_ID") {
        return Some(match get(env, "CIRCLE_JOB") {
            Some(job) => format!("circle-{id}-{job}"),
            None => format!("circle-{id}"),
        });
    }
    if let Some(id) = get(env, "CI_PIPELINE_ID") {
        return Some(match get(env, "CI_JOB_NAME") {
            // GitLab's parallel jobs are named `name 1/4`, `name 2/4`: keep the base.
            Some(job) => format!("gl-{id}-{}", job.split(' ').next().unwrap_or(&job)),
            None => format!("gl-{id}"),
        });
    }
    None
}

/// The worker id from CI variables, if the CI system numbers parallel jobs.
pub fn ci_worker(env: EnvLookup<'_>) -> Option<String> {
    if let Some(job) = get(env, "BUILDKITE_PARALLEL_JOB") {
        return Some(format!("bk-job-{job}"));
    }
    if let Some(node) = get(env, "CIRCLE_NODE_INDEX") {
        return Some(format!("circle-node-{node}"));
    }
    if let Some(node) = get(env, "CI_NODE_INDEX") {
        return Some(format!("gl-node-{node}"));
    }
    if let Some(job) = get(env, "GITHUB_JOB") {
        // GitHub gives matrix jobs the same GITHUB_JOB; add the runner name.
        if let Some(runner) = get(env, "RUNNER_NAME") {
            return Some(sanitize(&format!("gh-{job}-{runner}-{}", std::process::id())));
        }
    }
    None
}

/// Replaces characters that may not appear in a key-safe id with `-`.
pub fn sanitize(raw: &str) -> String {
    raw.chars().map(|c| if is_key_safe_char(c) { c } else { '-' }).collect()
}

/// `<host>-<pid>-<random>` ([`WorkerId::for_this_process`]): unique among
/// workers on different machines and processes.
pub fn default_worker() -> String {
    WorkerId::for_this_process().to_string()
}

/// The build id: `--build`, else `HOPPER_BUILD`, else CI variables, else
/// `fallback` (memory mode's private id), else an error.
pub fn resolve_build(explicit: Option<&str>, env: EnvLookup<'_>, fallback: Option<&str>) -> Result<RunId, HopperError> {
    let raw = explicit
        .map(str::to_owned)
        .or_else(|| get(env, "HOPPER_BUILD"))
        .or_else(|| ci_build(env))
        .or_else(|| fallback.map(str::to_owned))
        .ok_or(HopperError::MissingBuild)?;
    RunId::new(raw).map_err(|source| HopperError::BadId { what: "build id", source })
}

/// The worker id: `--worker`, else `HOPPER_WORKER`, else a CI node index,
/// else `<host>-<pid>-<random>`.
pub fn resolve_worker(explicit: Option<&str>, env: EnvLookup<'_>) -> Result<WorkerId, HopperError> {
    let raw = explicit
        .map(str::to_owned)
        .or_else(|| get(env, "HOPPER_WORKER"))
        .or_else(|| ci_worker(env))
        .unwrap_or_else(default_worker);
    WorkerId::new(raw).map_err(|source| HopperError::BadId { what: "worker id", source })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn explicit_beats_env_beats_ci() {
        let env = env_of(&[("HOPPER_BUILD", "from-env"), ("GITHUB_RUN_ID", "7")]);
        assert_eq!(resolve_build(Some("cli"), &env, None).unwrap().as_str(), "cli");
        assert_eq!(resolve_build(None, &env, None).unwrap().as_str(), "from-env");
        let env = env_of(&[("GITHUB_RUN_ID", "7"), ("GITHUB_RUN_ATTEMPT", "2")]);
        assert_eq!(resolve_build(None, &env, None).unwrap().as_str(), "gh-7-2");
    }

    #[test]
    fn ci_variables_give_build_and_worker() {
        let env = env_of(&[("BUILDKITE_BUILD_ID", "abc"), ("BUILDKITE_PARALLEL_JOB", "3")]);
        assert_eq!(resolve_build(None, &env, None).unwrap().as_str(), "bk-abc");
        assert_eq!(resolve_worker(None, &env).unwrap().as_str(), "bk-job-3");
        let env = env_of(&[("CIRCLE_WORKFLOW_ID", "wf"), ("CIRCLE_NODE_INDEX", "1")]);
        assert_eq!(resolve_build(None, &env, None).unwrap().as_str(), "circle-wf");
        assert_eq!(resolve_worker(None, &env).unwrap().as_str(), "circle-node-1");
    }

    #[test]
    fn missing_build_is_an_error_unless_there_is_a_fallback() {
        let env = env_of(&[]);
        assert!(matches!(resolve_build(None, &env, None), Err(HopperError::MissingBuild)));
        assert_eq!(resolve_build(None, &env, Some("local")).unwrap().as_str(), "local");
    }

    #[test]
    fn bad_ids_are_rejected() {
        let env = env_of(&[]);
        assert!(matches!(resolve_build(Some("a b"), &env, None), Err(HopperError::BadId { .. })));
        assert!(matches!(resolve_worker(Some("w{1}"), &env), Err(HopperError::BadId { .. })));
    }

    #[test]
    fn the_default_worker_names_this_process_and_ci_names_become_key_safe() {
        let worker = resolve_worker(None, &env_of(&[])).unwrap();
        assert!(worker.as_str().contains(&format!("-{}-", std::process::id())), "{worker}");
        for name in ["ci runner", "a{b}c", "tab\there", "new\nline", "ünïcode"] {
            let safe = sanitize(&format!("gh-{name}-42"));
            assert!(WorkerId::new(&safe).is_ok(), "{name:?} became {safe:?}, which is not a valid worker id");
        }
    }
}
