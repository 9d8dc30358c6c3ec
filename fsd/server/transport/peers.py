"""Who is at the other end of a connection, as the connection table counts peers.

Design: a share of the connection table per peer only helps if a peer cannot pass for
many. A remote peer is its address (an IPv6 peer its /64, which one host holds whole).
A local peer is its user: on a Unix socket the kernel says who (SO_PEERCRED), and on
loopback TCP every local process shares 127.0.0.1 (and may bind any 127.x address), so
the kernel is asked which user owns the connecting socket (sock_diag over netlink: one
exact lookup, about 10 us). Where that lookup fails (no netlink in a sandbox) a local
peer is its address, and every local user shares one share.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
_NO_COOKIE = 0xFFFFFFFF
_ALL_STATES = 0xFFF
_UID_OFFSET = 16 + 4 + 48 + 12  # nlmsghdr, inet_diag_msg's head and sockid, 3 counters


def peer_of(sock: socket.socket | None) -> str:
    """The peer key of an accepted connection (module doc); "?" when unknown."""
    if sock is None:
        return "?"
    with contextlib.suppress(OSError):
        if sock.family == socket.AF_UNIX:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            return f"uid:{struct.unpack('3i', creds)[1]}"
        host, port = sock.getpeername()[:2]
        addr = ipaddress.ip_address(host)
        if addr.is_loopback:
            local = sock.getsockname()[:2]
            uid = loopback_uid(sock.family, (host, port), local)
            if uid is not None:
                return f"uid:{uid}"
        if addr.version == 6 and addr.ipv4_mapped is None:
            return str(ipaddress.ip_network(f"{host}/64", strict=False))
        return str(addr.ipv4_mapped or addr) if addr.version == 6 else host
    return "?"


def loopback_uid(family: int, peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The user owning the socket at `peer` connected to our `local` (loopback TCP), by
    an exact sock_diag lookup; None when the kernel does not say."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
    except OSError:
        return None
    try:
        sock.settimeout(1.0)
        sock.send(_request(family, peer, local))
        data = sock.recv(8192)
    except OSError:
        return None
    finally:
        sock.close()
    if len(data) < _UID_OFFSET + 4:
        return None
    kind = struct.unpack_from("=H", data, 4)[0]
    if kind != SOCK_DIAG_BY_FAMILY:
        return None  # NLMSG_ERROR: no such socket (it closed meanwhile)
    return int(struct.unpack_from("=I", data, _UID_OFFSET)[0])


def _request(family: int, src: tuple[str, int], dst: tuple[str, int]) -> bytes:
    """A SOCK_DIAG_BY_FAMILY request for the one TCP socket from `src` to `dst`."""
    src_ip = socket.inet_pton(family, src[0]).ljust(16, b"\0")
    dst_ip = socket.inet_pton(family, dst[0]).ljust(16, b"\0")
    sockid = (
        struct.pack(">HH", src[1], dst[1])
        + src_ip
        + dst_ip
        + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
    )
    body = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, _ALL_STATES) + sockid
    return struct.pack("=IHHII", 16 + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + body
