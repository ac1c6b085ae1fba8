//! The README's Rust batch recipes, run literally: each recipe's command is
//! read from README.md (so the two cannot drift) and run by hopper on a
//! crate with its own nextest config (`[profile.default.junit] path =
//! "junit.xml"`, which outranks a tool config's default profile) and tests
//! in three targets (the library, an integration test, two doctests of one
//! item). Each test's outcome must equal the plain tool's: `cargo test` for
//! the libtest recipe, `cargo nextest run` (its own JUnit, where the
//! project's config puts it) for the nextest one. A difference fails the
//! test; a missing cargo-nextest fails it too, it never skips.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::{junit_cases, outcome, plain_cargo_test, texts, Project};

/// A crate with passing and failing tests in the library, in an
/// integration test and in two doctests of the same item (rustdoc runs
/// both for either name), an ignored test, and its own nextest config.
const CRATE: &[(&str, &str)] = &[
    ("Cargo.toml", "[package]\nname = \"recipe-demo\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n# Not part of any workspace above.\n[workspace]\n"),
    (".config/nextest.toml", "[profile.default.junit]\npath = \"junit.xml\"\n"),
    (
        "src/lib.rs",
        "//! Tests in three targets.\n\n/// Adds one.\n///\n/// ```\n/// assert_eq!(recipe_demo::add_one(1), 2);\n/// ```\n///\n\
         /// ```\n/// assert_eq!(recipe_demo::add_one(1), 3, \"a failing doctest\");\n/// ```\n\
         pub fn add_one(x: u32) -> u32 {\n    x + 1\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn parse() {\n        assert_eq!(super::add_one(1), 2);\n    }\n\n\
         \x20   #[test]\n    fn parse_fails() {\n        assert_eq!(super::add_one(1), 5, \"parse_fails fails\");\n    }\n\n\
         \x20   #[test]\n    #[ignore = \"too slow\"]\n    fn slow() {}\n}\n",
    ),
    (
        "tests/it.rs",
        "#[test]\nfn integration() {\n    assert_eq!(recipe_demo::add_one(2), 3);\n}\n\n\
         #[test]\nfn integration_fails() {\n    assert_eq!(recipe_demo::add_one(2), 4, \"integration fails\");\n}\n",
    ),
];

/// A recipe of the README: the environment it sets, hopper's arguments
/// (after `hopper`, up to `--`), and the `sh -c` script.
#[derive(Debug)]
struct Recipe {
    env: Vec<(String, String)>,
    args: Vec<String>,
    script: String,
}

/// The README's recipe whose first line starts with `start`: its lines up
/// to the one ending in `' sh {unit}`, taken apart at ` -- sh -c '`.
fn recipe(start: &str) -> Recipe {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).expect("README.md");
    let from = readme.lines().position(|l| l.starts_with(start)).unwrap_or_else(|| panic!("{start:?} in the README"));
    let lines: Vec<&str> = readme.lines().skip(from).collect();
    let to = lines.iter().position(|l| l.ends_with("' sh {unit}")).expect("the recipe ends with ' sh {unit}");
    let text = lines[..=to].join("\n");
    let (head, script) = text.split_once(" -- sh -c '").expect("the recipe runs sh -c");
    let script = script.strip_suffix("' sh {unit}").expect("the script's end").to_owned();
    let mut env = Vec::new();
    let mut args = Vec::new();
    for word in head.split_whitespace() {
        match word.split_once('=') {
            Some((name, value)) if args.is_empty() && !word.starts_with('-') => {
                env.push((name.to_owned(), value.to_owned()))
            }
            _ => args.push(word.to_owned()),
        }
    }
    assert_eq!(args.first().map(String::as_str), Some("hopper"), "{text}");
    args.remove(0);
    Recipe { env, args, script }
}

/// hopper running `recipe` in `project` (no retries, no timings, a JUnit
/// file): each unit's outcome from that file, and the exit code.
fn run_recipe(project: &Project, recipe: &Recipe) -> (BTreeMap<String, &'static str>, Option<i32>, String) {
    let junit = project.path().join("hopper.xml");
    let output = project
        .hopper()
        .envs(recipe.env.iter().map(|(k, v)| (k, v)))
        .args(&recipe.args)
        .args(["--no-timings", "--max-requeues", "0", "--junit"])
        .arg(&junit)
        .args(["--", "sh", "-c", &recipe.script, "sh", "{unit}"])
        .output()
        .expect("run hopper");
    let (stdout, stderr) = texts(&output);
    let shown = format!("{recipe:?}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(junit.exists(), "no JUnit written: {shown}");
    let tests = junit_cases(&junit).iter().map(|(id, status)| (id.clone(), outcome(status))).collect();
    (tests, output.status.code(), shown)
}

#[test]
fn the_readmes_libtest_recipe_gives_cargo_tests_verdict_for_every_target() {
    let project = Project::new(CRATE);
    let (plain, exit) = plain_cargo_test(project.path());
    assert_eq!(plain.len(), 7, "lib, integration and doctests: {plain:?}");
    assert_eq!(plain["src/lib.rs - add_one (line 9)"], "failed", "{plain:?}");
    assert_eq!(exit, Some(101));
    let (ours, exit, shown) = run_recipe(&project, &recipe("RUSTC_BOOTSTRAP=1 hopper run --batch-size"));
    assert_eq!(ours, plain, "{shown}");
    assert_eq!(exit, Some(1), "{shown}");
}

#[test]
fn the_readmes_nextest_recipe_gives_nextests_verdict_with_the_projects_own_junit_config() {
    let project = Project::new(CRATE);
    let plain = Command::new("cargo")
        .args(["nextest", "run", "--no-fail-fast"])
        .env("CARGO_TARGET_DIR", project.path().join("target"))
        .current_dir(project.path())
        .output()
        .expect("cargo-nextest is required by this test");
    assert_eq!(plain.status.code(), Some(100), "nextest's red: {:?}", texts(&plain));
    // The project's config puts nextest's JUnit here; a case is named by its
    // binary (the suite) and test, as hopper's nextest units are.
    let xml = std::fs::read_to_string(project.path().join("target/nextest/default/junit.xml"))
        .expect("nextest writes the JUnit the project's config asks for");
    let report = quick_junit::Report::deserialize_from_str(&xml).expect("nextest's JUnit");
    let plain: BTreeMap<String, &str> = report
        .test_suites
        .iter()
        .flat_map(|s| s.test_cases.iter().map(move |c| (s, c)))
        .map(|(suite, case)| {
            (format!("binary_id(={}) & test(={})", suite.name.as_str(), case.name.as_str()), outcome(&case.status))
        })
        .collect();
    assert_eq!(plain.len(), 4, "nextest runs no doctest and skips the ignored test: {plain:?}");
    let (ours, exit, shown) =
        run_recipe(&project, &recipe("hopper run --batch-size 100 --results junit --discover nextest"));
    assert_eq!(ours, plain, "{shown}");
    assert_eq!(exit, Some(1), "{shown}");
}
