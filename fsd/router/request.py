"""What the router reads of a request (a leaf: the router's policies and estimates
read it without importing the router)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RouteRequest:
    """What the router reads of a request."""

    request_id: str
    prompt_len: int
    names: tuple[int, ...] = ()  # its full prompt blocks' content names (`prompt_names`)
    session: str | None = None  # requests of one session prefer one replica (fsd)
