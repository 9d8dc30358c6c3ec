"""The state-folder reproductions of issue P21 for bench/abuse.py: outcomes, not
resources. We run as one user, so "another user" is simulated with files we plant and
with sacrificial processes: (a) a token temporary file planted 0666 at the old
predictable name in a 0777 folder, held open; (b) a link at the pidfile and (c) at the
log file, each to a victim file; (d) a pidfile naming a non-fsd process that holds its
lock, and (d2) one naming a bystander `sleep` while another process holds it. Each
runs `fsd start` / `fsd stop` of the tree under test (its cwd and PYTHONPATH).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fsd.credentials import state_stem, token_path
from tests.server.daemon_proc import free_port
from tests.server.test_state_dir import LOCKER

VICTIM = "the victim's own bytes\n"


class Tree:
    """`fsd` commands of one source tree, in a private folder with free endpoints."""

    def __init__(self, tree: Path, tmp: Path, folder_mode: int = 0o700) -> None:
        self.tree, self.tmp = tree, tmp
        self.folder = tmp / "state"
        self.folder.mkdir()
        os.chmod(self.folder, folder_mode)
        self.ep = f"tcp://127.0.0.1:{free_port()}"
        self.tep = f"tcp://127.0.0.1:{free_port()}"
        self.env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
        self.victim = tmp / "victim.txt"
        self.victim.write_text(VICTIM)
        self.children: list[subprocess.Popen] = []

    def path(self, suffix: str) -> Path:
        return self.folder / f"{state_stem(self.ep)}{suffix}"

    def args(self, *cmd: str) -> list[str]:
        return [sys.executable, "-m", "fsd.cli", *cmd, "--endpoint", self.ep, "--state-dir",
                str(self.folder)]  # fmt: skip

    def run(self, *cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.args(*cmd), cwd=self.tree, env=self.env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip

    def foreground(self, preexec: Callable[[], None] | None = None) -> subprocess.Popen:
        """`fsd start --foreground`; returns once it serves or exits (30 s at most)."""
        cmd = [*self.args("start", "--foreground"), "--telemetry-endpoint", self.tep]
        proc = subprocess.Popen(cmd, cwd=self.tree, env=self.env, preexec_fn=preexec,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        self.children.append(proc)
        end = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < end and not self.path(".token").exists():
            time.sleep(0.1)
        return proc

    def spawn(self, *cmd: str) -> subprocess.Popen:
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, text=True)
        self.children.append(proc)
        return proc

    def close(self) -> None:
        self.run("stop", "--timeout", "5")
        for proc in self.children:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def victim_written(self) -> str:
        return "written through the link" if self.victim.read_text() != VICTIM else "left alone"


def started(proc: subprocess.Popen) -> str:
    return "started" if proc.poll() is None else f"refused (exit {proc.returncode})"


def token_temp(t: Tree) -> str:
    """(a) a 0777 folder; the token's old temporary name planted 0666 and held open."""
    os.chmod(t.folder, 0o777)
    name = token_path(t.folder, t.ep).name

    def plant() -> None:  # in the daemon's child, before exec: its pid is known here
        planted = t.folder / f".{name}.{os.getpid()}.tmp"
        planted.touch()
        os.chmod(planted, 0o666)

    proc = t.foreground(plant)
    planted = t.folder / f".{name}.{proc.pid}.tmp"
    held = planted.open("rb") if planted.exists() else None
    end = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < end and not t.path(".token").exists():
        time.sleep(0.1)
    leaked = bool(held and held.read())
    return f"{started(proc)}; token read through the planted file: {'yes' if leaked else 'no'}"


def pidfile_link(t: Tree) -> str:
    """(b) a link at the pidfile to a victim file; `fsd start --foreground`."""
    t.path(".pid").symlink_to(t.victim)
    proc = t.foreground()
    return f"{started(proc)}; victim {t.victim_written()}"


def logfile_link(t: Tree) -> str:
    """(c) a link at the log file to a victim file; `fsd start` (in the background)."""
    t.path(".log").symlink_to(t.victim)
    got = t.run("start", "--telemetry-endpoint", t.tep)
    state = "started" if got.returncode == 0 else f"refused (exit {got.returncode})"
    return f"{state}; victim {t.victim_written()}"


def _locked(t: Tree) -> subprocess.Popen:
    """A non-fsd process holding the pidfile's lock (returns once it does)."""
    proc = t.spawn(sys.executable, "-c", LOCKER, str(t.path(".pid")))
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def _stop_signals(t: Tree, named: subprocess.Popen, others: list[subprocess.Popen]) -> str:
    t.path(".pid").write_text(json.dumps({"pid": named.pid, "state": "serving", "endpoint": t.ep}))
    got = t.run("stop", "--timeout", "1")
    time.sleep(1.0)
    hit = [p for p in [named, *others] if p.poll() is not None]
    return f"fsd stop exit {got.returncode}; " + (
        f"signalled {len(hit)} other process(es)" if hit else "nothing signalled"
    )


def lock_holder(t: Tree) -> str:
    """(d) the pidfile names a process that holds its lock but is no fsd daemon."""
    holder = _locked(t)
    return _stop_signals(t, holder, [])


def bystander(t: Tree) -> str:
    """(d2) the pidfile names a bystander `sleep` while another process holds the lock."""
    holder = _locked(t)
    return _stop_signals(t, t.spawn("sleep", "120"), [holder])


STATE_CASES: dict[str, Callable[[Tree], str]] = {
    "(a) token temp file, 0777 folder": token_temp,
    "(b) link at the pidfile": pidfile_link,
    "(c) link at the log file": logfile_link,
    "(d) pidfile names its lock holder": lock_holder,
    "(d2) pidfile names a bystander": bystander,
}


def state_outcomes(tree: Path) -> dict[str, str]:
    """Each state-folder case against `tree`, in its own temporary folder."""
    out = {}
    for name, case in STATE_CASES.items():
        with tempfile.TemporaryDirectory(prefix="fsd-abuse-state-") as tmp:
            t = Tree(tree, Path(tmp))
            try:
                out[name] = case(t)
            except Exception as exc:  # noqa: BLE001 - an outcome, reported as such
                out[name] = f"error: {exc!r}"[:200]
            finally:
                t.close()
    return out
