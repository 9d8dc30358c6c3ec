"""The state folder no other local user can steer (fsd.statedir's rule).

A red-team probe with a world-writable state_dir found four ways in: (a) a planted
temporary file receiving the operator token, (b) a symbolic link at the pidfile and
(c) at the log file making `fsd start` overwrite the link's target, (d) a pidfile
naming any process, its lock held by someone else, making `fsd stop` signal it. Each
is reproduced here and shown refused or harmless; no model loads.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fsd import credentials, daemon_control
from fsd.config import ServerConfig
from fsd.credentials import find_operator_token, state_stem, token_path, write_secret
from fsd.errors import ConfigError
from fsd.pidfile import (
    DaemonError,
    PidLock,
    _flock_writers,
    check_lock_holder,
    lock_holders,
    state_files,
)
from fsd.server.roles import Authorizer
from fsd.statedir import check_state_dir, ensure_state_dir
from tests.server.test_daemon_life import endpoints, fsd, kill_quietly

VICTIM = "precious content\n"
OTHER_UID = 65534  # nobody


def private(tmp_path: Path) -> Path:
    """A state folder only we may write (0700)."""
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o700)
    return folder


def open_folder(tmp_path: Path, mode: int = 0o777) -> Path:
    """The probe's folder: existing, writable by others (no sticky bit by default)."""
    folder = tmp_path / "open"
    folder.mkdir()
    os.chmod(folder, mode)
    return folder


def owned_by_someone_else(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `path` another user's: chown it when root, else pretend to be another uid."""
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)
    else:
        me = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: me + 1)


def refused(*args: str) -> subprocess.CompletedProcess[str]:
    """`fsd ARGS`, which should fail; a daemon it started anyway is killed, not leaked."""
    proc = fsd(*args)
    if match := re.search(r"fsd started: pid (\d+)", proc.stdout):
        kill_quietly(int(match.group(1)))
    return proc


def victim(tmp_path: Path) -> Path:
    """A file a link in the state folder points at: it must never change."""
    target = tmp_path / "victim.txt"
    target.write_text(VICTIM)
    return target


# ---- the rule ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o702], ids=oct)
def test_a_state_dir_others_may_write_is_refused_naming_mode_owner_and_fix(tmp_path, mode):
    folder = open_folder(tmp_path, mode)
    for check in (check_state_dir, ensure_state_dir):
        with pytest.raises(ConfigError) as err:
            check(folder)
        msg = str(err.value)
        assert str(folder) in msg and f"mode {mode:04o}" in msg, msg
        assert "writable by other users" in msg and f"chmod 700 {folder}" in msg, msg
        assert "(uid " in msg and "set state_dir" in msg, msg
    assert stat.S_IMODE(folder.stat().st_mode) == mode  # never changed behind our back


def test_a_state_dir_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    folder = private(tmp_path)
    owned_by_someone_else(folder, monkeypatch)
    with pytest.raises(ConfigError, match=r"is owned by .*not by you.*refused"):
        check_state_dir(folder)


def test_a_private_or_missing_state_dir_passes_and_a_new_one_is_0700(tmp_path):
    assert check_state_dir(private(tmp_path)) == tmp_path / "state"
    assert check_state_dir(tmp_path / "missing") == tmp_path / "missing"
    made = ensure_state_dir(tmp_path / "new" / "state")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700


# ---- (a) the operator token's temporary file ---------------------------------------


def test_a_planted_temporary_file_never_receives_the_token(tmp_path, monkeypatch):
    folder = private(tmp_path)
    target = folder / "fsd-x.token"
    # the old predictable name, and the first random name fsd will draw: both planted 0666
    old = folder / f".{target.name}.{os.getpid()}.tmp"
    clash = folder / f".{target.name}.{'ab' * 8}.tmp"
    for planted in (old, clash):
        planted.touch()
        os.chmod(planted, 0o666)
    names = iter(["ab" * 8, "cd" * 8])
    monkeypatch.setattr(credentials.secrets, "token_hex", lambda n: next(names))

    write_secret(target, "SECRET-TOKEN\n")

    assert target.read_text() == "SECRET-TOKEN\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    for planted in (old, clash):  # never opened: still empty, still theirs to read
        assert planted.read_bytes() == b"" and stat.S_IMODE(planted.stat().st_mode) == 0o666
    assert sorted(p.name for p in folder.iterdir()) == sorted([target.name, old.name, clash.name])


def test_a_planted_link_at_the_temporary_name_is_not_followed(tmp_path, monkeypatch):
    folder = private(tmp_path)
    target = folder / "fsd-x.token"
    link = folder / f".{target.name}.{'ab' * 8}.tmp"
    link.symlink_to(victim(tmp_path))
    names = iter(["ab" * 8, "cd" * 8])
    monkeypatch.setattr(credentials.secrets, "token_hex", lambda n: next(names))
    write_secret(target, "SECRET-TOKEN\n")
    assert (tmp_path / "victim.txt").read_text() == VICTIM
    assert target.read_text() == "SECRET-TOKEN\n"


def test_the_token_is_never_written_into_a_world_writable_state_dir(tmp_path):
    folder = open_folder(tmp_path)
    with pytest.raises(ConfigError, match="writable by other users"):
        write_secret(folder / "fsd-x.token", "SECRET-TOKEN\n")
    with pytest.raises(ConfigError, match=r"writable by other users.*chmod 700"):
        Authorizer(ServerConfig(state_dir=str(folder)))  # the daemon's own token write
    assert list(folder.iterdir()) == []


def test_a_client_trusts_no_token_from_a_folder_or_link_others_control(tmp_path):
    ep = "tcp://127.0.0.1:5999"
    with pytest.raises(ConfigError, match="writable by other users"):
        find_operator_token(ep, open_folder(tmp_path))
    folder = private(tmp_path)
    mine = tmp_path / "my-secret"  # 0600, as a private key would be
    mine.write_text("NOT-A-TOKEN")
    mine.chmod(0o600)
    token_path(folder, ep).symlink_to(mine)
    with pytest.raises(ConfigError, match="symbolic link"):
        find_operator_token(ep, folder)


# ---- (b) the pidfile and (c) the log file ------------------------------------------


def state_cfg(folder: Path) -> tuple[ServerConfig, list[str]]:
    """A config on free ports in `folder`, and the same as `fsd start` flags."""
    ep, tep = endpoints()
    flags = ["--endpoint", ep, "--telemetry-endpoint", tep, "--state-dir", str(folder)]
    return ServerConfig(endpoint=ep, telemetry_endpoint=tep, state_dir=str(folder)), flags


@pytest.mark.parametrize("dangling", [False, True])
def test_a_link_at_the_pidfile_is_never_followed(tmp_path, dangling):
    folder = private(tmp_path)
    cfg, _ = state_cfg(folder)
    pidfile, _ = state_files(cfg)
    target = tmp_path / "nowhere.txt" if dangling else victim(tmp_path)
    pidfile.symlink_to(target)
    with pytest.raises(ConfigError, match="symbolic link"):
        PidLock(pidfile, cfg.endpoint)
    if dangling:
        assert not target.exists()  # not created through the link
    else:
        assert target.read_text() == VICTIM


@pytest.mark.parametrize("foreground", [True, False])
def test_fsd_start_refuses_a_linked_pidfile_and_leaves_its_target_alone(tmp_path, foreground):
    folder = private(tmp_path)
    cfg, flags = state_cfg(folder)
    pidfile, _ = state_files(cfg)
    target = victim(tmp_path)
    pidfile.symlink_to(target)
    proc = refused("start", *(["--foreground"] if foreground else []), *flags)
    assert proc.returncode == 2 and "fsd started" not in proc.stdout
    assert f"{pidfile} is a symbolic link" in proc.stderr, proc.stderr
    assert target.read_text() == VICTIM
    assert pidfile.is_symlink()


def test_fsd_start_refuses_a_linked_log_file_and_leaves_its_target_alone(tmp_path):
    folder = private(tmp_path)
    cfg, flags = state_cfg(folder)
    pidfile, logfile = state_files(cfg)
    target = victim(tmp_path)
    logfile.symlink_to(target)
    proc = refused("start", *flags)
    assert proc.returncode == 2 and "fsd started" not in proc.stdout
    assert f"{logfile} is a symbolic link" in proc.stderr, proc.stderr
    assert target.read_text() == VICTIM
    assert not pidfile.exists()  # no daemon was started


def test_a_pidfile_owned_by_another_user_is_refused_untouched(tmp_path):
    folder = private(tmp_path)
    cfg, _ = state_cfg(folder)
    pidfile, _ = state_files(cfg)
    pidfile.write_text(VICTIM)
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file away while the folder stays ours")
    os.chown(pidfile, OTHER_UID, OTHER_UID)
    with pytest.raises(ConfigError, match=r"is owned by .*not by you"):
        PidLock(pidfile, cfg.endpoint)
    assert pidfile.read_text() == VICTIM


def test_fsd_start_and_stop_refuse_a_world_writable_state_dir(tmp_path):
    folder = open_folder(tmp_path)
    cfg, flags = state_cfg(folder)
    stop = ["stop", "--endpoint", cfg.endpoint, "--state-dir", str(folder)]
    for args in (["start", *flags], ["start", "--foreground", *flags], stop):
        proc = refused(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert f"state_dir '{folder}' is writable by other users (mode 0777" in proc.stderr
        assert f"chmod 700 {folder}" in proc.stderr
    assert list(folder.iterdir()) == []  # no pidfile, no log, no token


# ---- (d) `fsd stop` and the pid a pidfile names ------------------------------------


LOCKER = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('locked', flush=True)\n"
    "time.sleep(120)\n"
)


def hold_lock(pidfile: Path, children: list[subprocess.Popen]) -> subprocess.Popen:
    """A child process that holds `pidfile`'s exclusive flock (returns once it does)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(pidfile)], stdout=subprocess.PIPE, text=True
    )
    children.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def bystander(children: list[subprocess.Popen]) -> subprocess.Popen:
    """An unrelated process of ours that a forged pidfile names."""
    proc = subprocess.Popen(["sleep", "120"])
    children.append(proc)
    return proc


def forge(pidfile: Path, pid: int, endpoint: str) -> None:
    pidfile.write_text(json.dumps({"pid": pid, "state": "serving", "endpoint": endpoint}))


def test_proc_locks_lines_are_read_as_pid_and_device(tmp_path):
    text = (
        "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF\n"
        "1: -> FLOCK  ADVISORY  WRITE 99 08:01:5678 0 EOF\n"
        "2: POSIX  ADVISORY  WRITE 77 08:01:5678 0 EOF\n"
        "3: FLOCK  ADVISORY  READ 55 08:01:5678 0 EOF\n"
        "4: FLOCK  ADVISORY  WRITE 42 fd:1a:9 0 EOF\n"
    )
    assert list(_flock_writers(text)) == [(1234, (8, 1, 5678)), (42, (0xFD, 0x1A, 9))]


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="Linux /proc/locks")
def test_the_lock_holder_is_found_and_only_it_is_trusted(tmp_path, children):
    folder = private(tmp_path)
    pidfile = folder / "fsd-x.pid"
    holder = hold_lock(pidfile, children)
    other = bystander(children)
    holders = lock_holders(pidfile)
    assert holders == {holder.pid}
    check_lock_holder(pidfile, holder.pid, holders)  # the holder: trusted
    with pytest.raises(DaemonError, match=f"names pid {other.pid}, but its lock is held by pid"):
        check_lock_holder(pidfile, other.pid, holders)
    with pytest.raises(DaemonError, match="no /proc/locks"):
        check_lock_holder(pidfile, holder.pid, None)


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="Linux /proc/locks")
def test_signalling_goes_to_the_lock_holder_and_never_to_another_pid(tmp_path, children):
    folder = private(tmp_path)
    pidfile = folder / "fsd-x.pid"
    forge(pidfile, 0, "tcp://127.0.0.1:1")
    holder = hold_lock(pidfile, children)
    other = bystander(children)
    forge(pidfile, other.pid, "tcp://127.0.0.1:1")
    with pytest.raises(DaemonError, match=f"lock is held by pid {holder.pid}"):
        daemon_control._signal(pidfile, signal.SIGTERM)
    assert other.poll() is None and holder.poll() is None
    # the truth, but the holder is no fsd daemon (`python -c ...`): not signalled either
    forge(pidfile, holder.pid, "tcp://127.0.0.1:1")
    with pytest.raises(DaemonError, match=f"pid {holder.pid} holds the lock .* not an fsd daemon"):
        daemon_control._signal(pidfile, signal.SIGTERM)
    assert other.poll() is None and holder.poll() is None


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="Linux /proc/locks")
def test_fsd_stop_signals_nothing_when_the_pidfile_names_another_process(tmp_path, children):
    folder = private(tmp_path)
    ep, _ = endpoints()  # nobody answers there: stop falls back to signals
    pidfile = folder / f"{state_stem(ep)}.pid"
    forge(pidfile, 0, ep)
    holder = hold_lock(pidfile, children)
    other = bystander(children)
    forge(pidfile, other.pid, ep)
    proc = fsd("stop", "--endpoint", ep, "--state-dir", str(folder), "--timeout", "1")
    assert proc.returncode == 2, proc.stderr
    assert f"names pid {other.pid}, but its lock is held by pid {holder.pid}" in proc.stderr
    assert "signalled nothing" in proc.stderr
    assert other.poll() is None and holder.poll() is None  # neither was signalled
