"""A field of a request read from the first bytes of its msgpack encoding.

The gate sees a frame's first bytes before the frame is whole (or ever passes): a
refused frame's stand-in names its `req_id`, and a connection past the table's room
for clients shows whether it carries the operator's `token` (`fsd.server.transport.gate`).
Requests are maps of a few entries ("type", then the request's fields); this walks
the entries it can read whole, skipping values of any kind (nested maps and arrays
too, to a small depth), and gives up on anything cut short. It never raises, whatever
the bytes.
"""

from __future__ import annotations

_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2}
_FIXED |= {0xD2: 4, 0xD3: 8, 0xCA: 4, 0xCB: 8}  # nil, bools, ints, floats: their value bytes
_FIXED |= {0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17}  # fixext: type byte and data
_STR_LEN = {0xD9: 1, 0xDA: 2, 0xDB: 4}  # str8/16/32: bytes of their length
_BLOB_LEN = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xC7: 1, 0xC8: 2, 0xC9: 4}  # bin, ext: length bytes
_BLOB_EXTRA = {0xC7: 1, 0xC8: 1, 0xC9: 1}  # ext: its type byte
_MAP_LEN = {0xDE: 2, 0xDF: 4}
_ARRAY_LEN = {0xDC: 2, 0xDD: 4}
_DEPTH = 4  # nesting skipped; deeper values end the walk


def prefix_field(prefix: bytes, key: str, entries: int = 16) -> str | None:
    """The str value of `key` in the map whose encoding begins with `prefix`, if these
    bytes hold it whole within its first `entries` entries; None otherwise."""
    count, pos = _container(prefix, 0, (0x80, _MAP_LEN))
    for _ in range(min(count, entries)):
        name, pos = _str(prefix, pos)
        if name is None:
            return None
        if name == key:
            return _str(prefix, pos)[0]
        pos = _skip(prefix, pos, _DEPTH)
        if pos < 0:
            return None
    return None


def prefix_req_id(prefix: bytes) -> str | None:
    """The `req_id` of a request whose encoding begins with `prefix`, if it holds it."""
    return prefix_field(prefix, "req_id")


def _container(data: bytes, pos: int, kind: tuple[int, dict[int, int]]) -> tuple[int, int]:
    """(entries, position after the header) of a map or array at `pos`; (0, -1) if not."""
    fix, sized = kind
    if pos < 0 or pos >= len(data):
        return 0, -1
    tag = data[pos]
    if fix <= tag <= fix + 0x0F:
        return tag & 0x0F, pos + 1
    width = sized.get(tag)
    if width is None or pos + 1 + width > len(data):
        return 0, -1
    return int.from_bytes(data[pos + 1 : pos + 1 + width], "big"), pos + 1 + width


def _str(data: bytes, pos: int) -> tuple[str | None, int]:
    """A msgpack str at `pos` (None if something else) and the position after it."""
    if pos < 0 or pos >= len(data):
        return None, -1
    tag = data[pos]
    if 0xA0 <= tag <= 0xBF:
        size, start = tag & 0x1F, pos + 1
    elif tag in _STR_LEN:
        width = _STR_LEN[tag]
        size, start = int.from_bytes(data[pos + 1 : pos + 1 + width], "big"), pos + 1 + width
    else:
        return None, -1
    if start + size > len(data):
        return None, -1
    return data[start : start + size].decode("utf-8", "replace"), start + size


def _skip(data: bytes, pos: int, depth: int) -> int:
    """The position after the value at `pos`; -1 if it is cut short or too deep."""
    if pos < 0 or pos >= len(data):
        return -1
    tag = data[pos]
    if tag <= 0x7F or tag >= 0xE0:  # fixints
        return pos + 1
    if tag in _FIXED:
        end = pos + 1 + _FIXED[tag]
        return end if end <= len(data) else -1
    if 0xA0 <= tag <= 0xBF or tag in _STR_LEN:
        return _str(data, pos)[1]
    if tag in _BLOB_LEN:
        width = _BLOB_LEN[tag]
        size = int.from_bytes(data[pos + 1 : pos + 1 + width], "big")
        end = pos + 1 + width + _BLOB_EXTRA.get(tag, 0) + size
        return end if end <= len(data) else -1
    if not depth:
        return -1
    for fix, sized, per in ((0x80, _MAP_LEN, 2), (0x90, _ARRAY_LEN, 1)):
        if fix <= tag <= fix + 0x0F or tag in sized:
            count, pos = _container(data, pos, (fix, sized))
            for _ in range(count * per):
                pos = _skip(data, pos, depth - 1)
                if pos < 0:
                    return -1
            return pos
    return -1
