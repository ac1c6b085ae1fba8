"""hopper's pytest plugin, shipped inside the hopper binary.

hopper writes this file to a private temporary directory, puts that directory
on PYTHONPATH and loads it with ``-p hopper_pytest``. It does nothing unless
``HOPPER_PYTEST_MODE`` is set:

* ``collect``: with ``--collect-only``; pytest prints its own count, which
  hopper checks against the node ids this plugin writes.
* ``agent``: collect once, then serve hopper's agent protocol
  (docs/agent-protocol.md): read ``run`` requests as JSON lines from the
  original stdin, run each test, and write one ``result`` line per test to the
  original stdout. The test's own stdout goes to stderr, so no test can
  corrupt the protocol, and fd 0 becomes /dev/null, so no test can eat it.

In both modes, when ``HOPPER_COLLECT_OUT`` names a file, every collected
node id is written to it, whole, with pytest's own count: an agent's
collection is the discovery, so a slot's agent is the only collection.

Sharded collection (agent mode, ``HOPPER_SHARD=k/n`` with n > 1): the n
agents of one hopper worker split the test FILES between them, so each file
is collected (its tests made into items) by one agent only; every agent
still imports every file, its own first, then the others in pytest's order,
as plain pytest imports them all before it runs a test (see ``_import_only``). Files are dealt in pytest's own
collection order, each to the shard with the fewest bytes of files so far
(ties to the lowest shard), which every agent computes alike. A file of
another shard is imported and gets an empty collect report; its
collector is kept, so a test of it that hopper sends anyway is collected then
(lazily, under the same parents, through the same collection hooks). An
agent whose shard got no file (fewer files than agents) will only run other
shards' tests: while no request waits, it collects their files ahead, the
biggest first. The
file list each agent saw goes into ``HOPPER_COLLECT_OUT`` too: hopper checks
that all agents saw the same files, so no file falls between two shards.
"""

import atexit
import json
import os
import sys
import select
import time
import traceback

import pytest

PROTOCOL = 1
MODE = os.environ.get("HOPPER_PYTEST_MODE", "")
OUTPUT_TAIL = int(os.environ.get("HOPPER_OUTPUT_TAIL", "16384"))


def _shard():
    """(k, n) from HOPPER_SHARD=k/n; (0, 1) when unsharded."""
    text = os.environ.get("HOPPER_SHARD", "") if MODE == "agent" else ""
    if not text:
        return 0, 1
    index, count = (int(part) for part in text.split("/"))
    if not 0 <= index < count:
        raise ValueError("HOPPER_SHARD=%s: the index must be below the count" % text)
    return index, count


SHARD, SHARDS = _shard()


def _share_rewritten_files():
    """Lets sharded agents share pytest's rewritten test files.

    Every agent imports every test file (see ``_import_only``), and pytest's
    assertion rewriting is most of a test file's import. Under
    PYTHONDONTWRITEBYTECODE nothing is cached, so each agent would rewrite
    every file (a suite of 20 files of 1,000 asserting tests took 19 s to
    collect a shard, against 9.4 s importing its own files only). The agents
    then cache compiled files in hopper's private directory, beside this
    plugin, never in the project, and each imports the other shards' files
    after its own, by when their own agents have mostly cached them.
    """
    if MODE == "agent" and SHARDS > 1 and sys.dont_write_bytecode and not sys.pycache_prefix:
        sys.pycache_prefix = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pycache")
        sys.dont_write_bytecode = False


_share_rewritten_files()

# The pipes are taken over at import time: `-p` plugins are imported before
# pytest starts capturing file descriptors, so fds 0 and 1 are still hopper's.
_requests = None
_replies = None
if MODE == "agent":
    _requests = os.fdopen(os.dup(0), "rb", buffering=0)
    _replies = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    _null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(_null, 0)
    os.close(_null)
    os.dup2(2, 1)


# The finished session, once pytest has unconfigured after it (agent mode).
_finished_session = None
_unconfigured = False


def _exit_without_finalizing():
    # Registered at import, so it runs after every other atexit handler
    # (coverage's included): freeing a whole collection object by object at
    # interpreter shutdown took 1.7 s on a 27,000-test suite, after every
    # result, teardown and session hook was done. Only after a clean
    # unconfigure: an error there exits the usual way, with its status.
    if _finished_session is None or not _unconfigured:
        return
    for stream in (sys.stdout, sys.stderr, _replies):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(_agent_exit_status(_finished_session.exitstatus))


def _agent_exit_status(exitstatus):
    """0 once the tests are served, as the protocol asks: hopper has every
    failure and an empty shard is no error. pytest's own failures (an
    internal error, an interrupt) keep their status, for hopper to report."""
    if int(exitstatus) in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED):
        return 0
    return int(exitstatus)


if MODE == "agent":
    atexit.register(_exit_without_finalizing)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    global _finished_session
    if MODE == "agent":
        _finished_session = session


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_unconfigure(config):
    # The summary goes out before any unconfigure runs: an error of one then
    # ends the stderr hopper reads, where the summary would otherwise follow
    # it at the buffered stdout's final flush.
    global _unconfigured
    if MODE == "agent":
        sys.stdout.flush()
    outcome = yield
    _unconfigured = outcome.excinfo is None


def _send(message):
    _replies.write(json.dumps(message, ensure_ascii=False) + "\n")
    _replies.flush()


def _group_of(node):
    """The group an error of `node` belongs to: its node id, "session" for the root."""
    return node.nodeid or "session"


def _outside_error(group, phase, message, output):
    """An error outside any test, as the protocol's `error` event has it."""
    lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
    # A collection error's last line is the exception, marked `E` by pytest.
    line = (lines[-1] if phase == "collection" else lines[0]) if lines else phase + " failed"
    if line.startswith("E "):
        line = line[2:].strip()
    return {"event": "error", "group": group, "phase": phase, "message": line, "output": _tail(output)}


def _send_outside_error(group, phase, message, output):
    """Tells hopper of an error outside any test (docs/agent-protocol.md, `error`)."""
    _send(_outside_error(group, phase, message, output))


# What the agent changed in pytest's settings, sent with `ready` (hopper
# shows each note once).
_notes = []
XDIST_NOTE = (
    "pytest-xdist's -n/--dist (from the command or addopts) is turned off in hopper's agents "
    "(-n 0): hopper spreads the tests over its own slots (-j); xdist's workers would run them where "
    "no agent sees them"
)

MAXFAIL_NOTE = (
    "pytest's -x/--maxfail (from the command or addopts) is turned off in hopper's agents: each agent "
    "runs a share of the tests, so its own count of failures means nothing; every test runs. "
    "hopper's --max-failures N stops the whole build after N failed tests"
)



@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    # xdist's `-n N`, often in an addopts, makes the session a controller of
    # xdist's own workers: the agent itself would run no test, and hopper saw
    # an empty collection. It is turned off before xdist's own cmdline_main
    # reads it, as `-n 0` would (which the agent cannot add to the command:
    # without xdist installed, `-n` is an unknown option). Not in collect mode:
    # xdist does nothing under --collect-only, and batches keep xdist's say.
    if MODE != "agent":
        return None
    numprocesses = getattr(config.option, "numprocesses", None)
    dist = getattr(config.option, "dist", "no")
    if numprocesses or dist not in (None, "no"):
        config.option.numprocesses = 0
        config.option.dist = "no"
        if hasattr(config.option, "tx"):
            config.option.tx = []
        _notes.append(XDIST_NOTE)
    if getattr(config.option, "maxfail", 0):
        config.option.maxfail = 0
        _notes.append(MAXFAIL_NOTE)
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_report_teststatus(report, config):
    # An agent's terminal output goes to hopper's stderr pipe, kept only as a
    # crash's tail: pytest's progress letter (a '.' per test, one write each)
    # cost a system call here and a read in hopper for every test. The
    # category stays, so pytest's own counts are unchanged.
    outcome = yield
    if MODE != "agent":
        return
    status = outcome.get_result()
    if status:
        outcome.force_result((status[0], "", ""))


# The collection errors seen, for HOPPER_COLLECT_OUT (collect mode).
_collect_errors = []


def pytest_collectreport(report):
    # A file that does not collect belongs to no test: pytest counts it as
    # an error of the run. hopper hears of it here, with its traceback:
    # an agent before `ready` (or while a file is collected on request),
    # `--collect-only` in the node id file.
    if report.skipped and isinstance(report.longrepr, tuple):
        # A whole file skipped (a module-level `pytest.importorskip`): pytest
        # counts it as one skip, of no test.
        reason = str(report.longrepr[2])
        reason = reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
        skip = {"event": "skipped", "group": report.nodeid or "session", "message": reason}
        if MODE == "agent":
            _send(skip)
        else:
            _collect_errors.append(dict(skip, phase="skipped"))
        return
    if not report.failed:
        return
    error = _outside_error(report.nodeid or "session", "collection", report.longreprtext, report.longreprtext)
    if MODE == "agent":
        _send(error)
    else:
        _collect_errors.append(error)


def _teardown_to(setup_state, nextitem):
    """Tears down what `nextitem` does not share (everything for None), one
    node at a time, so an error in a module's, class's or session's
    finalizer is reported for that node, not for a test."""
    needed = nextitem.listchain() if nextitem is not None else []
    while setup_state.stack:
        nodes = list(setup_state.stack)
        if nodes == needed[: len(nodes)]:
            break
        top = nodes[-1]
        try:
            # With the parent as the "next item", pytest pops `top` alone.
            setup_state.teardown_exact(top.parent)
        except BaseException as error:  # pytest's outcomes are BaseExceptions too
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise
            text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            _send_outside_error(_group_of(top), "teardown", "%s: %s" % (type(error).__name__, error), text)


def _write_collected(session, collected):
    path = os.environ.get("HOPPER_COLLECT_OUT")
    if not path:
        return
    with open(path, "w", encoding="utf-8") as out:
        tests = [item.nodeid for item in session.items]
        doc = {"tests": tests, "collected": collected, "errors": _collect_errors}
        # Node ids are relative to the rootdir, a command line's paths to the
        # directory pytest runs in: hopper prefixes the ids it passes.
        config = session.config
        rootdir = os.path.relpath(str(config.rootpath), str(config.invocation_params.dir))
        if rootdir != ".":
            doc["rootdir"] = rootdir
        if SHARDS > 1:
            doc["shard"] = SHARD
            doc["shards"] = SHARDS
            doc["files"] = [[f.nodeid, f.size, f.shard] for f in _dealer.files]
        json.dump(doc, out, ensure_ascii=False)


def pytest_collection_finish(session):
    # pytest prints its own count after this; hopper checks the ids against it.
    if MODE == "collect":
        _write_collected(session, len(session.items))
    # After its own files, so that their owners have mostly rewritten and
    # cached them by now (see _share_rewritten_files).
    for module in _import_later:
        _import_only(module)
    _import_later.clear()


class _File:
    __slots__ = ("nodeid", "size", "shard", "collectors")

    def __init__(self, nodeid, size, shard):
        self.nodeid, self.size, self.shard, self.collectors = nodeid, size, shard, []


class _Dealer:
    """Deals test files to shards, in the order pytest collects them."""

    def __init__(self):
        self.files = []
        self.by_path = {}
        self.by_nodeid = {}
        self.loads = [0] * SHARDS
        # Collecting one file on request: every collector passes.
        self.lazy = False

    def file_of(self, collector):
        key = str(collector.path)
        known = self.by_path.get(key)
        if known is None:
            try:
                size = os.path.getsize(key)
            except OSError:
                size = 0
            # Every file weighs at least one byte, so empty files are dealt round.
            shard = min(range(SHARDS), key=lambda s: (self.loads[s], s))
            self.loads[shard] += size + 1
            known = _File(collector.nodeid, size, shard)
            self.files.append(known)
            self.by_path[key] = known
            self.by_nodeid.setdefault(collector.nodeid, known)
        return known


_dealer = _Dealer()


def _names_given(config):
    # Arguments that name tests inside a file (`a.py::test_x`): such a file
    # must be collected in every shard, or pytest says the name is not found.
    return any("::" in str(arg) for arg in config.args)


@pytest.hookimpl(tryfirst=True)
def pytest_make_collect_report(collector):
    if SHARDS <= 1 or _dealer.lazy:
        return None
    if not isinstance(collector, pytest.File) or isinstance(collector, getattr(pytest, "Package", ())):
        return None
    known = _dealer.file_of(collector)
    if known.shard == SHARD:
        return None
    if collector.session.isinitpath(collector.path) and _names_given(collector.config):
        return None  # collected; its items are set aside in pytest_collection_modifyitems
    known.collectors.append(collector)
    if isinstance(collector, pytest.Module):
        _import_later.append(collector)
    # Another agent collects this file: report it empty.
    from _pytest.reports import CollectReport

    return CollectReport(collector.nodeid, "passed", None, [])


# Other shards' test modules, imported once this agent's own are collected.
_import_later = []


def _import_only(module):
    """Imports another shard's test module without collecting its tests.

    Plain pytest imports every test file before it runs a test, and a
    file's import can change what other files' tests see: a patched
    global, a registered hook, a module a test expects to be loaded
    already (jsonschema 4.23.0's ``test_import_cli`` passes only once
    ``test_cli.py`` imported ``jsonschema.cli``). So each agent imports
    every file (its own while collecting them, the others' after, in
    pytest's order) and builds the items of its own only.
    An import that fails is the owning agent's collection error to report.
    """
    try:
        module.obj
    except (Exception, pytest.skip.Exception, pytest.fail.Exception):
        pass


# Items of other shards' files that had to be collected here (see above).
_set_aside = {}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    if SHARDS <= 1 or _dealer.lazy or MODE != "agent":
        return
    kept = []
    for item in items:
        shard = SHARD
        for node in item.listchain():
            if isinstance(node, pytest.File) and str(node.path) in _dealer.by_path:
                shard = _dealer.by_path[str(node.path)].shard
        if shard == SHARD:
            kept.append(item)
        else:
            _set_aside.setdefault(item.nodeid, item)
    items[:] = kept


def _collect_lazily(session, test):
    """The items of the file of `test`, a file another shard collects."""
    if test in _set_aside:
        return [_set_aside[test]]
    known = _dealer.by_nodeid.get(test.split("::", 1)[0])
    if known is None:
        return []
    return _collect_file(session, known)


def _files_to_collect_ahead():
    """Other shards' files, biggest first, for an agent whose shard got no
    file (fewer files than agents): it will only ever run their tests."""
    if SHARDS <= 1 or any(known.shard == SHARD for known in _dealer.files):
        return []
    return sorted((known for known in _dealer.files if known.collectors), key=lambda known: -known.size)


def _collect_ahead_while_idle(session, lines, ahead, items):
    """Collects the files of `ahead` one at a time while no request waits,
    so the first test this agent is sent does not wait for its file."""
    while ahead and not lines.ready():
        for found in _collect_file(session, ahead.pop(0)):
            items.setdefault(found.nodeid, found)


def _collect_file(session, known):
    """The items of a file another shard collects (none when it was
    collected here already)."""
    if not known.collectors:
        return []
    collectors, known.collectors = known.collectors, []
    _dealer.lazy = True
    try:
        found = []
        for collector in collectors:
            found.extend(session.genitems(collector))
        # The same hooks as a whole collection: conftest hooks that add
        # markers (a skip for slow tests) or deselect must see these too.
        session.config.hook.pytest_collection_modifyitems(session=session, config=session.config, items=found)
    finally:
        _dealer.lazy = False
    return found


class _Lines:
    """Reads request lines from the pipe without Python's buffering, so
    `ready()` can tell whether another request is already waiting."""

    def __init__(self, raw):
        self.raw = raw
        self.buf = b""
        self.eof = False

    def _fill(self):
        chunk = self.raw.read(65536)
        if not chunk:
            self.eof = True
        self.buf += chunk

    def ready(self):
        if b"\n" in self.buf:
            return True
        if self.eof:
            return False
        readable, _, _ = select.select([self.raw], [], [], 0)
        if readable:
            self._fill()
        return b"\n" in self.buf

    def next(self):
        while b"\n" not in self.buf and not self.eof:
            self._fill()
        if b"\n" not in self.buf:
            return None
        line, self.buf = self.buf.split(b"\n", 1)
        return line


class _Collector:
    """Gathers the reports of the test being run."""

    def __init__(self):
        self.reports = []

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report):
        self.reports.append(report)


def _tail(text):
    if len(text) <= OUTPUT_TAIL:
        return text
    return "[... %d earlier characters dropped ...]\n%s" % (len(text) - OUTPUT_TAIL, text[-OUTPUT_TAIL:])


def _crash_message(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        return crash.message.strip().splitlines()[0]
    lines = report.longreprtext.strip().splitlines()
    return lines[-1] if lines else "failed"


def _reruns(reports):
    """The failed tries before the last that the test's own reruns ran
    (pytest-rerunfailures' `--reruns` and `flaky(reruns=N)` mark logs each
    as a report of outcome "rerun"): one {message, output} each, so that a
    test that passed on a rerun counts as flaky, as pytest says "1 rerun"."""
    reruns = []
    for report in reports:
        if report.outcome == "rerun":
            prefix = "" if report.when == "call" else "error in %s: " % report.when
            reruns.append({"message": prefix + _crash_message(report), "output": _tail(report.longreprtext)})
    return reruns


def _verdict(reports):
    """outcome, message, output of one test from its phase reports; a
    passed test's output is not sent (hopper keeps none)."""
    outcome, message, failures = "passed", None, []
    for report in reports:
        if report.outcome == "rerun":
            continue
        if report.failed:
            outcome = "failed"
            prefix = "" if report.when == "call" else "error in %s: " % report.when
            message = message or prefix + _crash_message(report)
            failures.append(report.longreprtext)
        elif report.passed and report.when == "call" and hasattr(report, "wasxfail") and outcome == "passed":
            # A non-strict xfail that passed: pytest counts it "xpassed".
            message = "xpass: %s" % report.wasxfail if report.wasxfail else "xpass"
        elif report.skipped and outcome == "passed":
            outcome = "skipped"
            if hasattr(report, "wasxfail"):
                message = "xfail: %s" % report.wasxfail if report.wasxfail else "xfail"
            elif isinstance(report.longrepr, tuple):
                message = str(report.longrepr[2])
                # The reason alone, as pytest's JUnit and `-rs` give it.
                if message.startswith("Skipped: "):
                    message = message[len("Skipped: "):]
    if outcome != "failed":
        return outcome, message, None
    # Each phase's report carries the captured output of the phases before it.
    sections = reports[-1].sections if reports else []
    parts = ["----- %s -----\n%s" % (name, content) for name, content in sections] + failures
    return outcome, message, _tail("\n".join(parts))


def _started(seq):
    return '{"event":"started","seq":%d}\n' % seq


def _parse(line):
    """(seq, test) of a run request, (None, None) for exit."""
    request = json.loads(line)
    if request.get("op") == "exit":
        return None, None
    return request["seq"], request["test"]


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    if MODE != "agent":
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted("%d error(s) during collection" % session.testsfailed)
    items = {}
    for item in session.items:
        items.setdefault(item.nodeid, item)
    # pytest's own count, set once collection is complete.
    _write_collected(session, session.testscollected)
    collector = _Collector()
    session.config.pluginmanager.register(collector, "hopper-collector")
    _send({"event": "ready", "protocol": PROTOCOL, "tests": len(session.items), "notes": _notes})
    lines = _Lines(_requests)
    ahead = _files_to_collect_ahead()
    setup_state = session._setupstate
    pending = None
    # A `started` not yet written: it goes out with the previous result, in one write.
    out = ""
    while True:
        if pending is not None:
            seq, test = pending
            pending = None
        else:
            if out:
                _replies.write(out)
                _replies.flush()
                out = ""
            _collect_ahead_while_idle(session, lines, ahead, items)
            line = lines.next()
            if line is None:
                break
            seq, test = _parse(line)
        if seq is None:
            break
        item = items.get(test)
        if item is None:
            _replies.write(out + _started(seq))
            _replies.flush()
            out = ""
            for found in _collect_lazily(session, test):
                items.setdefault(found.nodeid, found)
            item = items.get(test)
            if item is None:
                _send({"event": "result", "seq": seq, "outcome": "failed", "duration_ms": 0,
                       "message": "not collected: %s is not a test of this pytest session" % test})
                continue
            # The test's own time starts now, not with its file's collection.
            _replies.write(_started(seq))
            _replies.flush()
        else:
            out += _started(seq)
            _replies.write(out)
            _replies.flush()
            out = ""
        # Read ahead: the result then goes out with the next `started`.
        if lines.ready():
            line = lines.next()
            pending = _parse(line) if line is not None else None
        # Module and class fixtures stay alive until a test that does not
        # share them comes; then they are torn down here, and an error of
        # theirs is their node's, never this test's or the previous one's.
        _teardown_to(setup_state, item)
        collector.reports = []
        started = time.perf_counter()
        # With its parent as the "next item", pytest tears down this test's
        # own fixtures only: its teardown report is about the test alone.
        item.ihook.pytest_runtest_protocol(item=item, nextitem=item.parent)
        duration_ms = int((time.perf_counter() - started) * 1000)
        outcome, message, output = _verdict(collector.reports)
        reruns = _reruns(collector.reports)
        if message is None and output is None and not reruns:
            out = '{"event":"result","seq":%d,"outcome":"%s","duration_ms":%d}\n' % (seq, outcome, duration_ms)
        else:
            reply = {"event": "result", "seq": seq, "outcome": outcome, "duration_ms": duration_ms}
            if message:
                reply["message"] = message
            if output:
                reply["output"] = output
            if reruns:
                reply["reruns"] = reruns
            out = json.dumps(reply, ensure_ascii=False) + "\n"
        if pending is None or pending[0] is None:
            _replies.write(out)
            _replies.flush()
            out = ""
    if out:
        _replies.write(out)
        _replies.flush()
    # The final teardown (the session's and the last module's fixtures),
    # awaited by hopper after its `exit`.
    _teardown_to(setup_state, None)
    return True
