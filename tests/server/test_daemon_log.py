"""The daemon's log tells an operator what happened: a stats line every stats_interval
in which there was work, and an audit line per control action naming who asked."""

from __future__ import annotations

import re
import time
from pathlib import Path

from fsd.server.audit import connection_tag, session_number
from tests.server.daemon_proc import SMALL_POOL, Daemon, daemon_fixture

INTERVAL = 0.3  # seconds between stats lines: short, so that the test waits little
LONG = 1000  # output tokens of a job that outlives a few intervals (it fits the 64 blocks)
daemon = daemon_fixture(SMALL_POOL + f"stats_interval = {INTERVAL}\n", "daemonlog")

STATS = re.compile(
    r"stats [\d.]+ s: [\d.]+ it/s, (\d+) gen tok/s, (\d+) prompt tok/s, (\d+) finished; "
    r"jobs (.+) \(running/waiting\); KV device \d+% host \d+%; "
    r"(prefix hits \d+% of \d+ tokens|prefix hits - \(no prompt looked up\)); "
    r"swaps \d+ out \d+ in$"
)


def lines_with(d: Daemon, text: str) -> list[str]:
    return [ln for ln in Path(d.log).read_text().splitlines() if text in ln]


def wait_for(d: Daemon, text: str | re.Pattern[str], timeout: float = 30.0) -> str:
    """The first line of the daemon's log that holds `text` (waiting for it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in Path(d.log).read_text().splitlines():
            if text.search(line) if isinstance(text, re.Pattern) else text in line:
                return line
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} in the log:\n{Path(d.log).read_text()[-3000:]}")


def test_work_gets_stats_lines_and_an_idle_daemon_none(daemon):
    with daemon.client() as c:
        for _ in range(3):
            c.complete(list(range(1, 40)), max_tokens=6, ignore_eos=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the work spans one interval or a few
        found = [STATS.search(ln) for ln in lines_with(daemon, " stats ")]
        if sum(int(m.group(3)) for m in found if m) == 3:
            break
        time.sleep(0.05)
    assert found and all(found), lines_with(daemon, " stats ")
    assert sum(int(m.group(1)) for m in found) > 0  # tokens were generated
    assert sum(int(m.group(2)) for m in found) > 0  # and prompts computed
    # idle now: no job, no iteration, so no more lines however long it stays so
    before = len(lines_with(daemon, " stats "))
    time.sleep(4 * INTERVAL)
    assert len(lines_with(daemon, " stats ")) == before


def test_a_live_job_shows_in_its_level_while_it_runs(daemon):
    with daemon.client() as c:
        job = c.submit([1, 2, 3], max_tokens=LONG, ignore_eos=True)
        job.job_id  # accepted  # noqa: B018
        # one job, running or waiting, in whichever level it has reached
        line = wait_for(daemon, re.compile(r"jobs Q\d+ (1/0|0/1) \(running/waiting\)"))
        job.abort()
    assert STATS.search(line), line


def test_retune_and_abort_get_audit_lines_naming_the_role(daemon):
    with daemon.client() as op:
        op.retune(quanta=[0.01, 0.02], **{"fsd.alpha": 5.0})
    with daemon.client(operator=False) as client:
        job = client.submit([1, 2, 3], max_tokens=LONG, ignore_eos=True)
        job_id = job.job_id
        client.abort(job_id)
    retune = wait_for(daemon, "audit: retune")
    assert "quanta=0.01,0.02" in retune and "fsd.alpha=5.0" in retune
    operator = re.search(r"by operator \(session (\d+)\)$", retune)
    assert operator, retune
    abort = wait_for(daemon, f"audit: abort job {job_id}")
    client = re.search(r"by client \(session (\d+)\)$", abort)
    assert client and client.group(1) != operator.group(1), abort
    assert "fsd.audit" in abort  # its own logger: an operator can pick them out


def test_no_log_line_names_a_routing_id(daemon):
    # the gate's routing ids are b"c" + a 64-bit counter: in hex "63" then 16 digits
    text = Path(daemon.log).read_text()
    assert not re.search(r"63[0-9a-f]{16}", text)
    rid = b"c" + (7).to_bytes(8, "big")
    tag = connection_tag(rid)
    assert re.fullmatch(r"[0-9a-f]{8}", tag) and tag == connection_tag(rid)
    assert tag != connection_tag(b"c" + (8).to_bytes(8, "big")) and rid.hex() not in tag
    assert session_number(b"s12") == "12" and session_number(rid) == tag
