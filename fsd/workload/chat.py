"""Multi-turn chat: conversations over a shared system prompt (scenarios/chat/).

A turn's prompt is the whole conversation so far: the system prompt, every earlier
user message and reply, then the new message. Its replies are only known once the
engine has produced them, so a conversation runs closed loop (a turn is sent
`think` seconds after the last reply came back); this module holds the spec and the
seeded token ids, and the driver (bench/prefix.py) feeds them to an engine. It is
the workload prefix caching exists for: every turn repeats its conversation's past,
and every conversation repeats the system prompt.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fsd.errors import ConfigError


@dataclass(frozen=True)
class ChatSpec:
    """How many conversations, how they start, and the shape of their turns."""

    name: str
    description: str
    seed: int
    conversations: int
    rate: float  # conversations started per second (Poisson)
    turns: tuple[int, int]  # turns per conversation, inclusive range
    system_tokens: int
    user_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    think: float  # seconds from a reply to the next message


@dataclass(frozen=True)
class Conversation:
    """One conversation: when it starts, then per turn its user message and reply length."""

    start: float
    messages: tuple[tuple[int, ...], ...]
    replies: tuple[int, ...]  # max_tokens of each turn's reply


def load_chat(path: str | Path) -> ChatSpec:
    """Read a chat scenario (a `[chat]` table); a clear ConfigError on anything wrong."""
    where = str(path)
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    t = raw.get("chat")
    if not isinstance(t, dict):
        raise ConfigError(f"{where}: expected a [chat] table")
    known = {f for f in ChatSpec.__dataclass_fields__}
    unknown = sorted(set(t) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown [chat] keys: {', '.join(unknown)}")

    def num(key: str, lo: float, kind: type = int) -> float:
        v = t.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and v != int(v)):
            raise ConfigError(f"{where}: chat.{key} must be a number, got {v!r}")
        if v < lo:
            raise ConfigError(f"{where}: chat.{key} must be >= {lo}, got {v}")
        return kind(v)

    def span(key: str, lo: int) -> tuple[int, int]:
        v = t.get(key)
        ok = isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v)
        if not ok or not lo <= v[0] <= v[1]:
            raise ConfigError(f"{where}: chat.{key} must be [min, max] integers >= {lo}, got {v!r}")
        return (v[0], v[1])

    return ChatSpec(
        name=str(t.get("name", Path(path).stem)),
        description=str(t.get("description", "")),
        seed=int(num("seed", 0)),
        conversations=int(num("conversations", 1)),
        rate=num("rate", 1e-9, float),
        turns=span("turns", 1),
        system_tokens=int(num("system_tokens", 0)),
        user_tokens=span("user_tokens", 1),
        output_tokens=span("output_tokens", 1),
        think=num("think", 0.0, float),
    )


def system_prompt(spec: ChatSpec, vocab: int) -> tuple[int, ...]:
    """The system prompt's token ids (ids 1..vocab-1: 0 is left to the tokenizer)."""
    rng = np.random.default_rng([spec.seed, 0])
    return tuple(int(x) for x in rng.integers(1, vocab, spec.system_tokens))


def conversations(spec: ChatSpec, vocab: int) -> list[Conversation]:
    """Every conversation, seeded: Poisson starts, uniform turn counts and lengths."""
    rng = np.random.default_rng([spec.seed, 1])
    starts = np.cumsum(rng.exponential(1.0 / spec.rate, spec.conversations))
    out = []
    for start in starts:
        n = int(rng.integers(spec.turns[0], spec.turns[1] + 1))
        users = rng.integers(spec.user_tokens[0], spec.user_tokens[1] + 1, n)
        messages = tuple(tuple(int(x) for x in rng.integers(1, vocab, int(u))) for u in users)
        replies = tuple(
            int(x) for x in rng.integers(spec.output_tokens[0], spec.output_tokens[1] + 1, n)
        )
        out.append(Conversation(float(start - starts[0]), messages, replies))
    return out
