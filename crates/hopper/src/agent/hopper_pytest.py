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
node id is written to it, whole, with pytest's own count: the first agent's
collection is the discovery, so a slot's agent is the only collection.
"""

import json
import os
import select
import sys
import time

import pytest

PROTOCOL = 1
MODE = os.environ.get("HOPPER_PYTEST_MODE", "")
OUTPUT_TAIL = int(os.environ.get("HOPPER_OUTPUT_TAIL", "16384"))

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


def _send(message):
    _replies.write(json.dumps(message, ensure_ascii=False) + "\n")
    _replies.flush()


def _write_collected(session, collected):
    path = os.environ.get("HOPPER_COLLECT_OUT")
    if not path:
        return
    with open(path, "w", encoding="utf-8") as out:
        tests = [item.nodeid for item in session.items]
        json.dump({"tests": tests, "collected": collected}, out, ensure_ascii=False)


def pytest_collection_finish(session):
    # pytest prints its own count after this; hopper checks the ids against it.
    if MODE == "collect":
        _write_collected(session, len(session.items))


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


def _verdict(reports):
    """outcome, message, output of one test from its phase reports."""
    outcome, message, failures = "passed", None, []
    for report in reports:
        if report.failed:
            outcome = "failed"
            prefix = "" if report.when == "call" else "error in %s: " % report.when
            message = message or prefix + _crash_message(report)
            failures.append(report.longreprtext)
        elif report.skipped and outcome == "passed":
            outcome = "skipped"
            if hasattr(report, "wasxfail"):
                message = "xfail: %s" % report.wasxfail
            elif isinstance(report.longrepr, tuple):
                message = str(report.longrepr[2])
    # Each phase's report carries the captured output of the phases before it.
    sections = reports[-1].sections if reports else []
    parts = ["----- %s -----\n%s" % (name, content) for name, content in sections] + failures
    return outcome, message, _tail("\n".join(parts))


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
    _send({"event": "ready", "protocol": PROTOCOL, "tests": len(session.items)})
    lines = _Lines(_requests)
    setup_state = session._setupstate
    pending = None
    while True:
        line = pending if pending is not None else lines.next()
        pending = None
        if line is None:
            break
        request = json.loads(line)
        if request.get("op") == "exit":
            break
        seq, test = request["seq"], request["test"]
        item = items.get(test)
        _send({"event": "started", "seq": seq})
        if item is None:
            _send({"event": "result", "seq": seq, "outcome": "failed", "duration_ms": 0,
                   "message": "not collected: %s is not a test of this pytest session" % test})
            continue
        # Keep module and class fixtures alive when the next request is
        # already here and shares them; tear down what it does not share.
        nextitem = None
        if lines.ready():
            pending = lines.next()
            upcoming = json.loads(pending) if pending is not None else {}
            nextitem = items.get(upcoming.get("test"))
        try:
            setup_state.teardown_exact(item)
        except Exception as error:  # a fixture's teardown failed: it belongs to no test now
            print("hopper: teardown before %s failed: %r" % (test, error), file=sys.stderr)
        collector.reports = []
        started = time.perf_counter()
        item.ihook.pytest_runtest_protocol(item=item, nextitem=nextitem or item.parent)
        duration_ms = int((time.perf_counter() - started) * 1000)
        outcome, message, output = _verdict(collector.reports)
        reply = {"event": "result", "seq": seq, "outcome": outcome, "duration_ms": duration_ms}
        if message:
            reply["message"] = message
        if output:
            reply["output"] = output
        _send(reply)
    setup_state.teardown_exact(None)
    return True
