"""The daemon's log file: private (0600), bounded in size, rotated.

`fsd start` (in the background) appends the daemon's stdout and stderr to
`state_dir/fsd-<endpoint>.log`. Once the daemon knows its stderr is that file, its
log records go through `StateLogHandler`: the file rotates once a record would take it
past `ServerConfig.log_max_bytes` (`.log` becomes `.log.1` and so on up to
`.log.LOG_BACKUPS`; the oldest is removed), so a flood of lines costs at most
(LOG_BACKUPS + 1) x log_max_bytes of disk. After each rotation the new file is
dup2'ed onto fds 1 and 2, so raw writes (a C library's message, a traceback printed
at exit) follow it too. Every handler formats with `PrintableFormatter`: a record's
line never carries a character a terminal obeys (a client's tag in a log line, read
with `tail -f`, shows as `\u001b`; `fsd.printable`). Every file is opened as `fsd.statedir` opens state files:
never through a link, only a regular file of ours, created 0600. (Raw writes do not
rotate the file themselves: the next record does.)
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from fsd.printable import shown
from fsd.statedir import open_state_file

LOG_BACKUPS = 3  # old files kept beside the log: .log.1 (newest) to .log.3
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class StateLogHandler(logging.handlers.RotatingFileHandler):
    """The state folder's log file, rotated past `max_bytes`; `follow` fds go along."""

    def __init__(self, path: Path, max_bytes: int, follow: Sequence[int] = (1, 2)) -> None:
        self.follow = tuple(follow)
        super().__init__(
            path, maxBytes=max_bytes, backupCount=LOG_BACKUPS, encoding="utf-8", delay=False
        )

    def _open(self) -> IO[str]:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        fd = open_state_file(Path(self.baseFilename), flags, 0o600)
        os.fchmod(fd, 0o600)  # an older file made 0644 by an older fsd: private too
        return open(fd, "a", encoding=self.encoding, errors=self.errors)  # noqa: SIM115

    def doRollover(self) -> None:
        """Rotate, then point the followed fds (stdout, stderr) at the new file."""
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        super().doRollover()
        if self.stream is not None:
            for fd in self.follow:
                os.dup2(self.stream.fileno(), fd)


def is_file(fd: int, path: Path) -> bool:
    """Whether `fd` is open on `path` (the same file, not followed if a link)."""
    try:
        st, mine = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


class PrintableFormatter(logging.Formatter):
    """LOG_FORMAT, each record's line with what a terminal would obey escaped (a
    traceback below it keeps its lines)."""

    def __init__(self) -> None:
        super().__init__(LOG_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return shown(super().formatMessage(record))


def log_handler(logfile: Path | None, max_bytes: int) -> logging.Handler:
    """The daemon's handler: `StateLogHandler` when stderr is `logfile` (a daemon started
    in the background), else stderr as it is (a terminal, systemd's journal, a pipe)."""
    handler: logging.Handler
    if logfile is not None and is_file(2, logfile):
        handler = StateLogHandler(logfile, max_bytes)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PrintableFormatter())
    return handler
