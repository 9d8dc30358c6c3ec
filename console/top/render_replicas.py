"""The replicas panel: each replica's load, pools, prefix hits and health, then the
router's latest decisions and why (a daemon of several replicas only)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from fsd import protocol as P
from fsd.console.top.data import TopView

ROUTES_SHOWN = 4  # the router's latest decisions under the replicas


def _share(used: int, total: int) -> str:
    return f"{used / total:4.0%}" if total else "   -"


def replica_line(r: P.ReplicaInfo) -> Text:
    """r1 ok  live 12 run 8  Q 3/5/4  dev 61% host 4%  hit 37%"""
    line = Text(f"r{r.index} ", style="bold")
    label, style = {"ok": ("ok", "green"), "draining": ("draining", "yellow")}.get(
        r.health, ("DOWN", "bold red")
    )
    line.append(label, style=style)
    queues = "/".join(str(n) for n in r.levels[:4]) + ("/…" if len(r.levels) > 4 else "")
    line.append(f"  live {r.live} run {r.running}  Q {queues or '-'}")
    if r.kv is not None:
        kv = r.kv
        line.append(
            f"  dev {_share(kv.device_used, kv.device_total)} host {_share(kv.host_used, kv.host_total)}"
        )
    if r.prefix is not None and r.prefix.queries:
        line.append(f"  hit {r.prefix.hit_rate:.0%}")
    if label == "DOWN":
        line.append(f"\n   {r.health}", style="red")
    return line


def replicas_panel(view: TopView) -> RenderableType:
    s = view.snapshot
    if s is None or not s.replicas:
        return Text("one replica", style="dim")
    lines: list[RenderableType] = [replica_line(r) for r in s.replicas]
    for route in (s.routes or [])[-ROUTES_SHOWN:]:
        lines.append(Text(f"{route.job_id} → r{route.replica}: {route.why}", style="dim"))
    return Group(*lines)
