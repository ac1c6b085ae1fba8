#!/usr/bin/env python3
"""Compare a plain tool's per-test verdicts with hopper's, per test id.

Issue 17 asks that hopper's verdict on a real, third-party suite equal the
tool's own. This script reads two reports of the same suite -- the plain
tool's and hopper's -- and prints the counts of each and every test whose
outcome differs. Only the standard library is used.

Usage:

    python3 xtask/real-suite-fidelity.py PLAIN HOPPER [--plain-exit N --hopper-exit N] [--show N]

PLAIN is what the tool wrote itself:
  * pytest: `python -m pytest --junitxml=plain.xml ...`
  * nextest: JUnit from a profile with `[profile.NAME.junit] path = ...`
  * cargo test: libtest's JSON lines, e.g.
    `RUSTC_BOOTSTRAP=1 cargo test --no-fail-fast -- -Z unstable-options --format json > plain.json`
    (a file whose first non-blank character is not `<` is read as libtest JSON)
HOPPER is hopper's `--junit out.xml` (from `hopper run`, or `hopper report`
on a Redis queue).

Both sides are turned into one key per test:
  * pytest: the (classname, name) pair pytest's JUnit writer gives a node id
    (`tests/test_a.py::TestK::test_m[x]` -> `tests.test_a.TestK`, `test_m[x]`);
    hopper's cases carry the node id in their `hopper.unit` property, which is
    converted the same way;
  * nextest: `binary_id::test` (hopper's `binary_id(=B) & test(=T)` -> `B::T`);
  * cargo test / libtest JSON: the test's name as libtest prints it (doctests
    `src/lib.rs - f (line 5)`); hopper's cargo-test units are those names.
Outcomes are passed, failed (a <failure>), error (an <error>), skipped.
pytest's JUnit has xfail as skipped and xpass (non-strict) as passed; libtest's
ignored is skipped. A key seen more than once in one report (pytest writes a
second <testcase> for a teardown error; hopper a case per group that failed
outside its tests) keeps its worst outcome, and the duplicates are counted.
With `--lenient-error`, error and failed count as the same outcome.

The exit code is 0 when the two reports agree on every key and outcome (and,
if given, the two exit codes agree), 1 otherwise.
"""

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter

RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
NEXTEST_UNIT = re.compile(r"^binary_id\(=(.*?)\) & test\(=(.*)\)$")


def pytest_key(nodeid):
    """The classname and name pytest's junitxml gives `nodeid` (its mangle_test_address)."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]) + "::" + names[-1] if len(names) > 1 else names[-1]


def unit_key(unit):
    """The key of a hopper unit id."""
    m = NEXTEST_UNIT.match(unit)
    if m:
        return m.group(1) + "::" + m.group(2)
    if ".py::" in unit.split("[")[0] or unit.split("[")[0].endswith(".py"):
        return pytest_key(unit)
    return unit


def case_outcome(case):
    kinds = [child.tag for child in case]
    if "error" in kinds:
        return "error"
    if "failure" in kinds:
        return "failed"
    if "skipped" in kinds:
        return "skipped"
    return "passed"


def read_junit(path):
    root = ET.parse(path).getroot()
    out = []
    for case in root.iter("testcase"):
        unit = None
        for prop in case.iter("property"):
            if prop.get("name") == "hopper.unit":
                unit = prop.get("value")
        if unit is not None:
            key = unit_key(unit)
        else:
            classname, name = case.get("classname") or "", case.get("name") or ""
            if classname and classname != name:
                key = classname + "::" + name
            else:
                key = name
        out.append((key, case_outcome(case)))
    return out


def read_libtest_json(path):
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("type") != "test" or event.get("event") in ("started", None):
                continue
            outcome = {"ok": "passed", "failed": "failed", "ignored": "skipped", "timeout": "failed"}.get(
                event["event"], event["event"]
            )
            out.append((event["name"], outcome))
    return out


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        head = f.read(4096).lstrip()
    return read_junit(path) if head.startswith("<") else read_libtest_json(path)


def fold(cases):
    """Key -> worst outcome, and how many keys appeared more than once."""
    verdicts, seen = {}, Counter()
    for key, outcome in cases:
        seen[key] += 1
        if key not in verdicts or RANK[outcome] > RANK[verdicts[key]]:
            verdicts[key] = outcome
    return verdicts, sum(1 for n in seen.values() if n > 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plain", help="the tool's own report (JUnit XML or libtest JSON lines)")
    ap.add_argument("hopper", help="hopper's JUnit XML")
    ap.add_argument("--plain-exit", type=int, help="the tool's exit code")
    ap.add_argument("--hopper-exit", type=int, help="hopper's exit code")
    ap.add_argument("--lenient-error", action="store_true", help="count error and failed as one outcome")
    ap.add_argument("--show", type=int, default=50, help="list at most this many differences per kind")
    args = ap.parse_args()

    plain_cases, hopper_cases = read(args.plain), read(args.hopper)
    plain, plain_dups = fold(plain_cases)
    hop, hop_dups = fold(hopper_cases)
    norm = (lambda o: "failed" if o == "error" else o) if args.lenient_error else (lambda o: o)

    for label, cases, verdicts, dups in (("plain", plain_cases, plain, plain_dups), ("hopper", hopper_cases, hop, hop_dups)):
        counts = Counter(verdicts.values())
        print(
            f"{label:6}: {len(cases)} cases, {len(verdicts)} distinct ids ({dups} repeated); "
            + ", ".join(f"{k} {counts.get(k, 0)}" for k in RANK)
        )

    only_plain = sorted(set(plain) - set(hop))
    only_hopper = sorted(set(hop) - set(plain))
    differ = sorted(k for k in set(plain) & set(hop) if norm(plain[k]) != norm(hop[k]))
    print(f"common ids: {len(set(plain) & set(hop))}; only in plain: {len(only_plain)}; "
          f"only in hopper: {len(only_hopper)}; outcome differs: {len(differ)}")
    for title, keys, show in (
        ("only in plain", only_plain, lambda k: plain[k]),
        ("only in hopper", only_hopper, lambda k: hop[k]),
        ("outcome differs (plain -> hopper)", differ, lambda k: f"{plain[k]} -> {hop[k]}"),
    ):
        if keys:
            print(f"-- {title}:")
            for k in keys[: args.show]:
                print(f"   {k}: {show(k)}")
            if len(keys) > args.show:
                print(f"   ... and {len(keys) - args.show} more")
    exits_differ = False
    if args.plain_exit is not None or args.hopper_exit is not None:
        exits_differ = args.plain_exit != args.hopper_exit
        print(f"exit codes: plain {args.plain_exit}, hopper {args.hopper_exit}" + (" (DIFFER)" if exits_differ else ""))
    same = not (only_plain or only_hopper or differ or exits_differ)
    print("SAME" if same else "DIFFERENT")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
