"""The daemon's log file is private (0600) and bounded: it rotates, keeping 3 old files,
and the daemon's raw stdout and stderr follow the current file (fsd.logfile)."""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path

from fsd.client import Client
from fsd.config import ServerConfig
from fsd.credentials import find_operator_token
from fsd.logfile import LOG_BACKUPS, StateLogHandler
from fsd.pidfile import state_files
from tests.server.daemon_proc import free_port
from tests.server.test_daemon_life import fsd

MAX = 4096


def logs_of(logfile: Path) -> list[Path]:
    """The log file and its rotated copies that exist."""
    return sorted(logfile.parent.glob(logfile.name + "*"))


def test_the_handler_rotates_keeps_three_old_files_and_moves_the_followed_fds(tmp_path):
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    path = folder / "fsd-x.log"
    followed = [os.open(os.devnull, os.O_WRONLY) for _ in range(2)]  # stand-ins for 1 and 2
    handler = StateLogHandler(path, MAX, follow=followed)
    logger = logging.getLogger("test.logfile")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for i in range(600):  # ~60 KB: many rotations
            logger.warning("line %04d %s", i, "x" * 80)
        os.write(followed[1], b"raw stderr write\n")
    finally:
        logger.removeHandler(handler)
        handler.close()
    names = [p.name for p in logs_of(path)]
    assert names == ["fsd-x.log", *(f"fsd-x.log.{i}" for i in range(1, LOG_BACKUPS + 1))]
    for p in logs_of(path):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
        assert p.stat().st_size <= MAX + 100, (p, p.stat().st_size)  # + the raw line
    text = path.read_text()
    assert "line 0599" in text and text.endswith("raw stderr write\n")  # raw writes follow
    for fd in followed:
        assert os.fstat(fd).st_ino == path.stat().st_ino
        os.close(fd)


def test_a_background_daemons_log_is_0600_and_rotates_with_its_stderr(tmp_path):
    ep, tep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    state = tmp_path / "state"
    cfg = ServerConfig(endpoint=ep, telemetry_endpoint=tep, state_dir=str(state))
    _, logfile = state_files(cfg)
    toml = tmp_path / "fsd.toml"
    toml.write_text(f"[server]\nlog_max_bytes = {MAX}\n")
    started = fsd("start", "--config", str(toml), "--endpoint", ep, "--telemetry-endpoint", tep,
                  "--state-dir", str(state))  # fmt: skip
    assert started.returncode == 0, started.stderr
    pid = int(re.search(r"pid (\d+)", started.stdout).group(1))
    try:
        assert stat.S_IMODE(logfile.stat().st_mode) == 0o600
        token = find_operator_token(ep, state)
        with Client(ep, timeout=10, token=token) as op:
            for i in range(120):  # an audit line each: ~12 KB of log
                op.retune(**{"fsd.alpha": float(i + 1)})
        assert len(logs_of(logfile)) > 2  # rotated, more than once
        for p in logs_of(logfile):
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
            assert p.stat().st_size <= MAX + 512, (p, p.stat().st_size)
        # the daemon's own stdout and stderr are the current file, not a rotated one
        for fd in (1, 2):
            assert os.readlink(f"/proc/{pid}/fd/{fd}") == str(logfile)
    finally:
        stopped = fsd("stop", "--endpoint", ep, "--state-dir", str(state))
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped" in logfile.read_text()  # its last line went to the current file
