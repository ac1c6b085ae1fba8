//! Reading libtest's output: its counts, a failure's panic message, an
//! ignored test's reason, and a doctest's own result among its siblings'.

use std::collections::HashMap;

pub use crate::verdicts::libtest::panic_message;
use crate::verdicts::model::{UnitResult, UnitVerdict};

/// libtest's counts in an output: the sums of every `test result:` line's
/// `passed`, `failed` and `ignored`; `None` when there is no such line.
pub fn counts(output: &str) -> Option<(u64, u64, u64)> {
    let mut seen = false;
    let (mut passed, mut failed, mut ignored) = (0, 0, 0);
    for line in output.lines() {
        let Some(rest) = line.trim().strip_prefix("test result: ") else { continue };
        seen = true;
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else { continue };
            let n: u64 = n.parse().unwrap_or(0);
            match what {
                "passed" => passed += n,
                "failed" => failed += n,
                "ignored" => ignored += n,
                _ => {}
            }
        }
    }
    seen.then_some((passed, failed, ignored))
}

/// The reason libtest gives an ignored test: `test x ... ignored, too
/// slow`, or with `-q`, `test: x, ignore_message: too slow`.
pub fn ignore_reason(output: &str) -> Option<String> {
    output.lines().find_map(|l| {
        let line = l.trim();
        let reason = line.rsplit_once(" ... ignored, ").map(|(_, r)| r);
        let reason = reason.or_else(|| line.strip_prefix("test: ")?.split_once(", ignore_message: ").map(|(_, r)| r));
        reason.map(|r| r.trim().to_owned())
    })
}

/// Whether `name` is a doctest's (`src/lib.rs - add_one (line 5)`): a
/// libtest name holds no space, rustdoc's always do.
pub fn is_doctest(name: &str) -> bool {
    name.contains(" - ") && name.ends_with(')')
}

/// A doctest's name as listed, from the name rustdoc runs it under: that
/// name less the mode rustdoc adds (`src/lib.rs - (line 28) - compile
/// fail`, `... - should panic`). A listed name always ends in `(line N)`.
fn listed_name(name: &str) -> &str {
    match name.rsplit_once(" - ") {
        Some((listed, mode)) if !mode.is_empty() && mode.chars().all(|c| c.is_ascii_lowercase() || c == ' ') => listed,
        _ => name,
    }
}

/// Whether `name`, as rustdoc names a doctest while it runs it, is the
/// doctest `unit`.
fn names_doctest(name: &str, unit: &str) -> bool {
    listed_name(name) == unit
}

/// The failure sections of libtest's output, `---- NAME stdout ----` and
/// what follows, up to the next section or the list of failures: (NAME,
/// section) in order.
fn failure_sections(output: &str) -> impl Iterator<Item = (&str, &str)> {
    output.match_indices("---- ").filter_map(move |(at, _)| {
        let header = output[at..].lines().next()?;
        let name = header.strip_prefix("---- ")?.strip_suffix(" stdout ----")?;
        let own = &output[at + header.len()..];
        let own = own.split("\n---- ").next().unwrap_or(own);
        Some((name, own.split("\nfailures:").next().unwrap_or(own)))
    })
}

/// A failed doctest's result from its failure section: its panic message,
/// or, for a doctest that did not panic, the section's first line ("Test
/// compiled successfully, but it's marked `compile_fail`.").
fn failed_doctest(section: &str) -> UnitResult {
    let first_line = || section.lines().map(str::trim).find(|l| !l.is_empty()).map(str::to_owned);
    let detail = panic_message(section).or_else(first_line).unwrap_or_else(|| "the doctest failed".to_owned());
    let verdict = UnitVerdict::Failed { reason: "exit", detail };
    UnitResult { verdict, duration: None, output: Some(section.trim().to_owned()) }
}

/// A doctest unit's own result in an output where rustdoc ran more than it.
/// rustdoc splits the name it is given at its spaces (`src/lib.rs`, `-`,
/// `add_one`, ...) and runs every doctest matching any piece, so the item's
/// other doctests ran too, and their failure sets the exit code: the unit
/// is judged by its own lines. Failed when its `---- NAME stdout ----`
/// section is there (with its panic message); skipped when libtest says it
/// was ignored; passed when it says `test NAME ... ok`, or, in `-q`'s terse
/// output that names only failures, when it is not among them, something
/// passed and nothing was ignored. `None` when the output is not such a run (not a
/// doctest, or it ran only this one: the counts judge it as any unit).
pub fn own_doctest_verdict(unit: &str, output: &str) -> Option<UnitResult> {
    let (passed, failed, ignored) = counts(output)?;
    if !is_doctest(unit) || passed + failed + ignored <= 1 {
        return None;
    }
    if let Some((_, section)) = failure_sections(output).find(|(name, _)| names_doctest(name, unit)) {
        return Some(failed_doctest(section));
    }
    let line = |result: &str| {
        output.lines().any(|l| {
            l.trim()
                .strip_prefix("test ")
                .and_then(|rest| rest.strip_suffix(result)?.strip_suffix(" ... "))
                .is_some_and(|name| names_doctest(name, unit))
        })
    };
    if line("ignored") {
        return Some(UnitResult { verdict: UnitVerdict::Skipped, duration: None, output: None });
    }
    // Terse output names only failures: a doctest not among them passed,
    // unless one of those that ran was ignored (it may be this one).
    let named = output.lines().any(|l| l.trim().starts_with("test ") && l.contains(" ... "));
    if line("ok") || (!named && passed > 0 && ignored == 0) {
        return Some(UnitVerdict::Passed.into());
    }
    None
}

/// Every doctest's result in the output of a run of a package's doctests
/// (`cargo test --doc -- --format=pretty`), by its listed name, read in one
/// pass over the output (where [`own_doctest_verdict`] reads it all for
/// one). A doctest is there only with its own `test NAME ... RESULT` line:
/// terse output, or a tail cut short, leaves the others out.
pub fn doctest_verdicts(output: &str) -> HashMap<String, UnitResult> {
    let sections: HashMap<&str, &str> =
        failure_sections(output).map(|(name, section)| (listed_name(name), section)).collect();
    let mut verdicts = HashMap::new();
    for line in output.lines() {
        let Some((name, result)) = line.trim().strip_prefix("test ").and_then(|l| l.rsplit_once(" ... ")) else {
            continue;
        };
        let name = listed_name(name);
        if !is_doctest(name) {
            continue;
        }
        let result = match result {
            "ok" => UnitVerdict::Passed.into(),
            "FAILED" => sections.get(name).map_or_else(
                || UnitVerdict::Failed { reason: "exit", detail: "the doctest failed".into() }.into(),
                |section| failed_doctest(section),
            ),
            ignored if ignored == "ignored" || ignored.starts_with("ignored, ") => UnitResult {
                verdict: UnitVerdict::Skipped,
                duration: None,
                output: ignored.strip_prefix("ignored, ").map(str::to_owned),
            },
            _ => continue,
        };
        verdicts.insert(name.to_owned(), result);
    }
    verdicts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// block-buffer 0.12.1: rustdoc names a `compile_fail` doctest with its
    /// mode when it runs it, not as it listed it.
    #[test]
    fn a_doctest_is_found_under_its_name_and_mode() {
        let out = "\nrunning 1 test\ntest src/lib.rs - (line 4) ... ok\n\ntest result: ok. 1 passed; 0 failed; 0 ignored; \
                   0 measured; 0 filtered out; finished in 0.01s\n\n\nrunning 2 tests\ntest src/lib.rs - (line 32) - compile \
                   fail ... ok\ntest src/lib.rs - (line 28) - compile fail ... FAILED\n\nfailures:\n\n---- src/lib.rs - \
                   (line 28) - compile fail stdout ----\nTest compiled successfully, but it's marked `compile_fail`.\n\n\
                   failures:\n    src/lib.rs - (line 28)\n\ntest result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; \
                   0 filtered out; finished in 0.05s\n";
        let passed = own_doctest_verdict("src/lib.rs - (line 32)", out).unwrap();
        assert_eq!(passed.verdict, UnitVerdict::Passed);
        let failed = own_doctest_verdict("src/lib.rs - (line 28)", out).unwrap();
        assert!(matches!(failed.verdict, UnitVerdict::Failed { .. }), "{failed:?}");
        assert!(failed.output.unwrap().contains("marked `compile_fail`"));
        assert!(
            matches!(&failed.verdict, UnitVerdict::Failed { detail, .. } if detail.starts_with("Test compiled successfully")),
            "{:?}",
            failed.verdict
        );
        assert!(names_doctest("src/lib.rs - f (line 5) - should panic", "src/lib.rs - f (line 5)"));
        assert!(!names_doctest("src/lib.rs - f (line 50)", "src/lib.rs - f (line 5)"));
        assert!(!names_doctest("src/lib.rs - f (line 5) - g (line 9)", "src/lib.rs - f (line 5)"));
    }

    /// Edition 2024 lists a library's doctests in two sections (those merged
    /// into one binary, then the rest), under one `Doc-tests` line.

    #[test]
    fn an_ignored_tests_reason_is_read_in_both_verbosities() {
        assert_eq!(ignore_reason("test tests::slow ... ignored, too slow\n").as_deref(), Some("too slow"));
        assert_eq!(ignore_reason("i\ntest: tests::slow, ignore_message: too slow\n").as_deref(), Some("too slow"));
        assert_eq!(ignore_reason("test tests::slow ... ignored\n"), None);
    }

    #[test]
    fn a_doctest_is_judged_by_its_own_result_when_rustdoc_ran_its_siblings() {
        let (five, nine) = ("src/lib.rs - add_one (line 5)", "src/lib.rs - add_one (line 9)");
        let terse = "running 2 tests\n.F\nfailures:\n\n---- src/lib.rs - add_one (line 9) stdout ----\nTest executable \
                     failed (exit status: 101).\n\nthread 'main' (1) panicked at src/lib.rs:5:1:\nassertion failed: a \
                     failing doctest\n\nfailures:\n    src/lib.rs - add_one (line 9)\n\ntest result: FAILED. 1 passed; 1 \
                     failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.2s\n";
        assert_eq!(own_doctest_verdict(five, terse).map(|r| r.verdict), Some(UnitVerdict::Passed));
        let failed = own_doctest_verdict(nine, terse).map(|r| r.verdict);
        assert_eq!(
            failed,
            Some(UnitVerdict::Failed { reason: "exit", detail: "assertion failed: a failing doctest".into() })
        );
        let pretty = "test src/lib.rs - add_one (line 5) ... ignored\ntest src/lib.rs - add_one (line 9) ... ok\n\
                      test result: ok. 1 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out\n";
        assert_eq!(own_doctest_verdict(five, pretty).map(|r| r.verdict), Some(UnitVerdict::Skipped));
        assert_eq!(own_doctest_verdict(nine, pretty).map(|r| r.verdict), Some(UnitVerdict::Passed));
        // memchr's case: terse dots, one of the item's doctests ignored.
        let dots = "running 3 tests\ni..\ntest result: ok. 2 passed; 0 failed; 1 ignored; 0 measured\n";
        assert!(own_doctest_verdict(five, dots).is_none(), "terse output cannot tell which one was ignored");
        let alone = "running 1 test\n.\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured\n";
        assert!(own_doctest_verdict(five, alone).is_none(), "one test ran: the counts judge it");
        assert!(own_doctest_verdict("tests::parse", terse).is_none(), "not a doctest");
    }

    #[test]
    fn libtest_counts_add_up_over_binaries() {
        let out = "running 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 3 filtered out; \
                   finished in 0.00s\n\nrunning 1 test\ntest result: FAILED. 0 passed; 1 failed; 2 ignored; 0 measured; \
                   0 filtered out; finished in 0.29s\n";
        assert_eq!(counts(out), Some((0, 1, 2)));
        assert_eq!(counts("no summary\n"), None);
    }

    #[test]
    fn a_whole_doc_run_gives_each_doctest_its_own_result_in_one_pass() {
        let out = "\nrunning 5 tests\ntest src/lib.rs - a (line 3) ... ok\ntest src/lib.rs - b (line 9) - compile fail ... \
                   FAILED\ntest src/lib.rs - c (line 20) ... ignored\ntest src/lib.rs - d (line 30) - should panic ... ok\n\
                   test src/lib.rs - e (line 40) ... FAILED\n\nfailures:\n\n---- src/lib.rs - b (line 9) - compile fail \
                   stdout ----\nTest compiled successfully, but it's marked `compile_fail`.\n\n---- src/lib.rs - e (line 40) \
                   stdout ----\nTest executable failed (exit status: 101).\n\nthread 'main' panicked at src/lib.rs:42:1:\n\
                   e is wrong\n\nfailures:\n    src/lib.rs - b (line 9)\n    src/lib.rs - e (line 40)\n\ntest result: \
                   FAILED. 2 passed; 2 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.3s\n";
        let verdicts = doctest_verdicts(out);
        assert_eq!(verdicts.len(), 5, "{verdicts:?}");
        let verdict = |name: &str| verdicts[name].verdict.clone();
        assert_eq!(verdict("src/lib.rs - a (line 3)"), UnitVerdict::Passed);
        assert_eq!(verdict("src/lib.rs - d (line 30)"), UnitVerdict::Passed, "listed without its mode");
        assert_eq!(verdict("src/lib.rs - c (line 20)"), UnitVerdict::Skipped);
        assert_eq!(
            verdict("src/lib.rs - b (line 9)"),
            UnitVerdict::Failed {
                reason: "exit",
                detail: "Test compiled successfully, but it's marked `compile_fail`.".into()
            }
        );
        let e = &verdicts["src/lib.rs - e (line 40)"];
        assert_eq!(e.verdict, UnitVerdict::Failed { reason: "exit", detail: "e is wrong".into() });
        let section = e.output.as_deref().unwrap();
        assert!(section.ends_with("e is wrong") && !section.contains("(line 9)"), "its own section only: {section}");
        // Each agrees with the one-unit reading of the same output.
        for (name, result) in &verdicts {
            assert_eq!(own_doctest_verdict(name, out).as_ref(), Some(result), "{name}");
        }
        let terse = "running 2 tests\n..\ntest result: ok. 2 passed; 0 failed; 0 ignored; 0 measured\n";
        assert!(doctest_verdicts(terse).is_empty(), "terse dots name no test: none is judged from them");
    }
}
