"""A local Ray cluster listens on loopback only; two Ray-backed LLMs share one process."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from pathlib import Path

from fsd import LLM, SamplingParams

PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def _descendants(root: int) -> set[int]:
    """`root` and every process below it (Ray's GCS, raylet, agents and workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and ')'
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def _address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_addr)
    # /proc/net/tcp{,6} prints each 32-bit word in host (little-endian) order
    fixed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(fixed)


def _listening() -> dict[int, tuple[str, int]]:
    """socket inode -> (address, port) of every TCP socket in LISTEN state."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], int(fields[9])
            if state == "0A":  # TCP_LISTEN
                host, port = local.split(":")
                out[inode] = (str(_address(host)), int(port, 16))
    return out


def listeners_of(pids: set[int]) -> list[tuple[str, str, int]]:
    """(process name, address, port) of each listening TCP socket the processes hold."""
    listening = _listening()
    found = []
    for pid in pids:
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in listening:
                    found.append((name, *listening[inode]))
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)  # [::ffff:127.0.0.1] is 127.0.0.1
    return (mapped or ip).is_loopback


def serve_and_listeners(**parallel: int) -> list[tuple[str, str, int]]:
    """Listening sockets of this process and its descendants while an LLM(tp, pp) serves."""
    with LLM("tiny-opt", device="cpu", num_gpu_blocks=16, num_host_blocks=0, **parallel) as llm:
        assert len(llm.generate([5, 6, 7], PARAMS)[0].token_ids) == 6
        return listeners_of(_descendants(os.getpid()))


def test_a_local_ray_cluster_listens_on_loopback_only(ray_cluster):
    # pp=2: Ray's own processes, two worker actors and the driver, no torch.distributed
    found = serve_and_listeners(pp=2)
    names = {name for name, _, _ in found}
    assert {"gcs_server", "raylet", "ray::Worker"} <= names, found  # it sees Ray's processes
    exposed = [entry for entry in found if not is_loopback(entry[1])]
    assert not exposed, f"listening beyond loopback: {exposed}"


def test_the_tensor_parallel_rendezvous_listens_on_loopback_only(ray_cluster):
    found = serve_and_listeners(tp=2)
    exposed = [entry for entry in found if not is_loopback(entry[1])]
    assert not exposed, f"listening beyond loopback: {exposed}"


def test_two_ray_backed_llms_coexist_in_one_process(ray_cluster, profile_path):
    opts = {
        "tp": 2,
        "device": "cpu",
        "num_gpu_blocks": 16,
        "num_host_blocks": 0,
        "profile": profile_path,
    }
    with LLM("tiny-opt", **opts) as first, LLM("tiny-opt", **opts) as second:
        names = [
            {first.engine.executor.actor_name(0, r) for r in range(2)},
            {second.engine.executor.actor_name(0, r) for r in range(2)},
        ]
        assert not names[0] & names[1]
        a = first.generate([5, 6, 7], PARAMS)[0].token_ids
        b = second.generate([5, 6, 7], PARAMS)[0].token_ids
        assert a == b and len(a) == 6
        # --tp 2 samples on the driver: a temperature below the greedy floor (it made
        # torch.multinomial raise there) is greedy
        tiny = dataclasses.replace(PARAMS, temperature=1e-300)
        assert first.generate([5, 6, 7], tiny)[0].token_ids == a
