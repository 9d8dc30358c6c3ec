"""The multi-turn chat scenario: its spec, checked with clear errors, and seeded turns."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsd.errors import ConfigError
from fsd.workload.chat import conversations, load_chat, system_prompt

SHIPPED = Path(__file__).resolve().parents[2] / "scenarios" / "chat" / "multi-turn.toml"


def test_the_shipped_chat_scenario_has_4_to_8_turns_over_one_system_prompt():
    spec = load_chat(SHIPPED)
    convs = conversations(spec, 256)
    assert len(convs) == spec.conversations
    assert all(4 <= len(c.messages) == len(c.replies) <= 8 for c in convs)
    assert spec.system_tokens > 0 and len(system_prompt(spec, 256)) == spec.system_tokens
    starts = [c.start for c in convs]
    assert starts[0] == 0.0 and starts == sorted(starts)
    lo, hi = spec.user_tokens
    assert all(lo <= len(m) <= hi for c in convs for m in c.messages)
    assert all(0 < t < 256 for c in convs for m in c.messages for t in m)


def test_turns_are_seeded(tmp_path):
    text = SHIPPED.read_text()
    a = conversations(load_chat(SHIPPED), 256)
    assert a == conversations(load_chat(SHIPPED), 256)
    other = tmp_path / "c.toml"
    other.write_text(text.replace("seed = 1", "seed = 2"))
    assert conversations(load_chat(other), 256) != a


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("turns = [4, 8]", "turns = [8, 4]"), "chat.turns must be"),
        (("conversations = 24", "conversations = 0"), "chat.conversations must be >= 1"),
        (("rate = 2.0", 'rate = "fast"'), "chat.rate must be a number"),
        (("think = 0.5", "think = 0.5\nthinks = 1"), "unknown \\[chat\\] keys: thinks"),
        (("[chat]", "[talk]"), "expected a \\[chat\\] table"),
    ],
)
def test_a_bad_chat_scenario_gets_a_clear_error(tmp_path, change, message):
    path = tmp_path / "bad.toml"
    path.write_text(SHIPPED.read_text().replace(*change))
    with pytest.raises(ConfigError, match=message):
        load_chat(path)
