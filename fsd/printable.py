"""Strings a client chose, made safe for an operator's terminal.

Tags, affinity keys, owners and request ids travel from any client to the console,
the CLI's tables and the daemon's log. A terminal obeys what they may hold: ESC
starts a control sequence (a window title, a clipboard write, a cleared screen), C1
bytes do the same on some terminals, a newline breaks a table's row, and bidi
overrides reorder what the operator reads. So such names are checked where they
enter (`check_name`: printable text only, the refusal naming the character) and
every rendering shows what it prints through `shown` (controls as visible escapes),
with rich's markup kept literal where rich prints (`fsd.console`): a daemon that
predates the check, or a recorded file, must not reach the terminal either. Free
text (a prompt) is never refused; it is shown through `shown` where it is shown.
"""

from __future__ import annotations

import re

from fsd.errors import ConfigError

# C0 and DEL, C1, the bidi embeddings, overrides and isolates, line/paragraph separators
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_NAMES = {"\x1b": "ESC", "\x07": "BEL", "\n": "newline", "\r": "carriage return", "\t": "tab"}


def _kind(ch: str) -> str:
    code = ord(ch)
    if code < 0x20 or code == 0x7F:
        kind = "a control character"
    elif code <= 0x9F:
        kind = "a C1 control character"
    elif code in (0x2028, 0x2029):
        kind = "a line separator"
    else:
        kind = "a bidirectional control"
    name = _NAMES.get(ch)
    return f"{kind} (U+{code:04X}{' ' + name if name else ''})"


def unprintable(text: str) -> str | None:
    """What the first character a terminal would obey in `text` is, or None."""
    found = _UNPRINTABLE.search(text)
    return _kind(found.group()) if found else None


def check_name(what: str, text: str) -> None:
    """Refuse (ConfigError) a client-chosen name that holds a character a terminal
    would obey, naming it: `what` says which name ("tag 2", "affinity")."""
    bad = unprintable(text)
    if bad is not None:
        raise ConfigError(f"{what} holds {bad}: names a client chooses must be printable text")


def _escape(found: re.Match[str]) -> str:
    ch = found.group()
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch) or f"\\u{ord(ch):04x}"


def shown(text: str) -> str:
    """`text` with every character a terminal would obey written as a visible escape
    (`\\u001b`, `\\n`): one line, nothing obeyed."""
    return _UNPRINTABLE.sub(_escape, text)
